"""Compiled operators: a delta program's query steps run by our own vectorized operators.

The stage between the delta rules (delta_operators/, which emit each view's
program as sqlglot trees) and the engines (ivm/execute/executor.py, ivm/execute/spark/).
When a program's query step has run once on DuckDB, the executor compiles
it here, for the input schemas it had and the result schema DuckDB gave it;
from then on a batch costs our operators' work and no parsing, binding or
planning. DuckDB stays the reference: anything outside the compiled set is
``Unsupported`` (the step stays on DuckDB, and EXPLAIN says why), anything
a batch holds that might make us differ is a ``Fallback`` (that batch runs
on DuckDB), and shadow runs compare the two.

- ``vectors``: columns (numpy + NULL masks, or Arrow), DuckDB's types.
- ``decimals``: DuckDB's DECIMAL result types and rounding, over scaled int64.
- ``expressions``: scalar SQL compiled into closures over columns.
- ``kernels``: key codes, join matches, grouped reductions in numpy.
- ``relational``: SELECT/JOIN/EXISTS/GROUP BY/windows/ORDER BY LIMIT/set operations as operators.
- ``step``: one step compiled and type-checked; the shadow comparison.
"""
