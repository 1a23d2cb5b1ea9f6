"""Program optimizer: fewer engine round trips, same result.

Every query sent to the engine pays a fixed cost (planning, scheduling,
Arrow hand-off: ~1-3 ms in DuckDB) that dwarfs the work on a small delta, so
the compiler's many small steps are merged. Five passes, run in order:

1. ``push_probes``: a lookup whose probe columns are plain copies of columns
   of an earlier temporary probes that temporary instead. Probing more keys
   than needed is always safe (lookups may return extra rows; consumers
   re-check keys), and the producing query no longer has to be materialized.
   Only queries marked ``transparent`` (projections, consolidations, partial
   aggregates: no selective filters) are looked through.
2. ``inline_queries``: a query whose result only other queries read becomes
   a CTE of each of its readers, so a chain of steps runs as one statement.
3. ``fuse_renames``: a query that only renames the columns of a Stack's
   result (an aggregate's -old/+new rows under the view's column names,
   in 11 of the 22 TPC-H views) becomes part of that Stack, which runs on
   the driver without an engine statement.
4. ``prune_projections``: inside each query, a CTE or subquery keeps only
   the columns its readers use (sqlglot's ``pushdown_projections``). A
   product term joins the relation's state after the change, ``SELECT
   <every column> FROM lookup UNION ALL SELECT <every column> FROM
   delta``, and reads three of orders' ten columns: now the CTE carries
   those three, and so can the lookup (next rule).
5. ``narrow_lookups``: a lookup copies only the columns of the stored
   relation that its result's readers may read (``columns_read``): a
   lookup of lineitem rows for a join that reads 5 of its 17 columns
   takes those 5. At SF 10, where lineitem's runs are memory-mapped, a
   copied column costs a page touch per row.

>>> from sqlglot import parse_one
>>> p = Program(steps=[Query("a", parse_one("SELECT x FROM d"), ("d",)),
...                    Query("b", parse_one("SELECT x FROM a"), ("a",))], output="b")
>>> [s.out for s in optimize(p).steps], optimize(p).steps[0].sql.sql()
(['b'], 'WITH a AS (SELECT x FROM d) SELECT x FROM a')
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.pushdown_projections import pushdown_projections

from delta_operators.program import Lookup, Loop, Program, Query, Stack, columns_read, readers
from storage.zset import WEIGHT


def optimize(program: Program) -> Program:
    for rule in RULES:
        program = rule(program)
    return program


def _tables(sql: exp.Expression) -> set[str]:
    return {t.name for t in sql.find_all(exp.Table)}


def _provenance(query: Query, column: str) -> tuple[str, str] | None:
    """(temp, column) that ``column`` of the query's result is a plain copy of."""
    sql = query.sql
    if not isinstance(sql, exp.Select) or sql.args.get("with_"):
        return None
    sources: dict[str, str] = {}
    from_ = sql.args.get("from_")
    items = ([from_.this] if from_ is not None else []) + [j.this for j in sql.args.get("joins") or []]
    for item in items:
        if isinstance(item, exp.Table):
            sources[item.alias_or_name] = item.name
    for projection in sql.expressions:
        if projection.alias_or_name != column:
            continue
        inner = projection.unalias()
        if isinstance(inner, exp.Column) and inner.table in sources:
            return sources[inner.table], inner.name
        return None
    return None


def push_probes(program: Program) -> Program:
    producers = {s.out: s for s in program.steps if isinstance(s, Query)}
    for step in program.steps:
        if not isinstance(step, Lookup) or step.probe_filter is not None:
            continue
        probe, columns = step.probe, step.probe_columns
        while probe in producers and producers[probe].transparent:
            origins = [_provenance(producers[probe], c) for c in columns]
            if any(o is None for o in origins) or len({o[0] for o in origins}) != 1:
                break
            probe, columns = origins[0][0], tuple(o[1] for o in origins)
        step.probe, step.probe_columns = probe, columns
    return program


def inline_queries(program: Program) -> Program:
    pinned = {program.output} | set(program.inputs)
    for step in program.steps:
        if isinstance(step, Query) and step.pinned:
            pinned.add(step.out)
        if isinstance(step, Query) and step.guard is not None:
            # The guard reads them on the driver, as temporaries (inlined, it could not test).
            pinned.update((step.guard.probe, step.guard.values))
        if isinstance(step, Loop):
            pinned.update(step.reads())
        elif isinstance(step, Lookup):
            pinned.add(step.probe)
        elif isinstance(step, Stack):
            pinned.add(step.source)
    for replace in program.replaces:
        pinned.update(n for n in (replace.deletes, replace.inserts) if n)
    # The tables each query reads, kept up to date as temporaries are inlined (a reader
    # then reads the inlined query's tables too): walking every query's tree for every
    # candidate was most of the time DDL spent here.
    tables = {id(s): _tables(s.sql) for s in program.steps if isinstance(s, Query)}
    changed = True
    while changed:
        changed = False
        for step in list(program.steps):
            if not isinstance(step, Query) or step.out in pinned:
                continue
            readers = [s for s in program.steps if s is not step and isinstance(s, Query)
                       and step.out in tables[id(s)]]
            for reader in readers:
                reader.sql = _with_first(reader.sql, step.out, step.sql.copy())
                reader.drivers = _merged_drivers(reader, step)
                tables[id(reader)] |= tables[id(step)]
            program.steps.remove(step)
            changed = True
    return program


def _with_first(sql: exp.Expression, name: str, body: exp.Expression) -> exp.Expression:
    """``sql`` with a CTE ``name`` placed before its own CTEs (which may read it).

    ``body``'s own CTEs move up beside it, first: a temporary inlined into two
    readers that are then both inlined into one query would otherwise be
    defined twice in it, nested at two levels (Spark rejects the query;
    DuckDB computes the temporary twice). Temporary names are unique in a
    program and every copy of a CTE is taken from the one step, so one name
    is one definition: the first occurrence is kept, and it precedes every
    CTE that reads it.
    """
    hoisted = []
    inner = body.args.get("with_")
    if inner is not None and not inner.args.get("recursive"):
        hoisted = list(inner.expressions)
        body.set("with_", None)
    combined = sql.with_(name, as_=body)
    with_ = combined.args["with_"]
    *existing, added = with_.expressions
    ctes, seen = [], set()
    for cte in (*hoisted, added, *existing):
        if cte.alias not in seen:
            seen.add(cte.alias)
            ctes.append(cte)
    with_.set("expressions", ctes)
    return combined


def _merged_drivers(reader: Query, inlined: Query) -> tuple[str, ...]:
    """Drivers of ``reader`` once ``inlined`` runs inside it.

    A product reader ("any") over a product producer is empty when any of the
    producer's drivers is; otherwise the inlined temp just stops being a
    reason to skip.
    """
    if inlined.out not in reader.drivers:
        return reader.drivers
    drivers = [d for d in reader.drivers if d != inlined.out]
    if not inlined.drivers:
        # The inlined query always runs: it can never justify skipping a product,
        # and a sum over it may always be non-empty.
        return tuple(drivers) if reader.skip == "any" else ()
    if reader.skip == "all" or inlined.skip == "any" or len(inlined.drivers) == 1:
        # Sum reader: skipping only when all of the wider set are empty is sound.
        # Product over a product: empty when any of the producer's drivers is.
        drivers.extend(d for d in inlined.drivers if d not in drivers)
    return tuple(drivers)


def fuse_renames(program: Program) -> Program:
    """A query ``SELECT s.a AS x, s.b AS y, s.__weight AS __weight FROM s``
    over a Stack's result ``s`` that nothing else reads becomes that Stack,
    its parts' columns renamed: the rows, weights, column types and order
    (a Stack puts the weight last) are the same, and one engine statement
    (a Spark job on Spark) less runs.
    """
    stacks = {s.out: s for s in program.steps if isinstance(s, Stack)}
    counts = readers(program)  # a fusion moves a Stack's one reader into it: no other count changes
    for step in list(program.steps):
        if not isinstance(step, Query) or step.guard is not None or step.beside_state:
            continue
        renamed = _renames(step.sql)
        if renamed is None or renamed[0] not in stacks:
            continue
        source, columns = renamed
        stack = stacks[source]
        if counts[source] != 1:
            continue
        parts = []
        for filter_column, weight, mapping in stack.parts:
            origin = dict(mapping)
            if any(column not in origin for _, column in columns):
                break
            parts.append((filter_column, weight, tuple((out, origin[column]) for out, column in columns)))
        else:
            fused = Stack(out=step.out, source=stack.source, parts=tuple(parts), note=stack.note)
            program.steps[program.steps.index(stack)] = fused
            program.steps.remove(step)
            del stacks[source]
    return program


def _renames(sql: exp.Expression) -> tuple[str, list[tuple[str, str]]] | None:
    """(table, [(output, column)] without the weight) when ``sql`` only renames the table's columns and keeps
    its weight, last."""
    if not isinstance(sql, exp.Select) or any(
        sql.args.get(arg) for arg in ("with_", "joins", "where", "group", "having", "order", "limit", "distinct",
                                      "qualify", "laterals")
    ):
        return None
    from_ = sql.args.get("from_")
    if from_ is None or not isinstance(from_.this, exp.Table):
        return None
    table = from_.this
    columns, weight, names = [], False, set()
    for projection in sql.expressions:
        inner, out = projection.unalias(), projection.alias_or_name
        if not isinstance(inner, exp.Column) or inner.table not in ("", table.alias_or_name) or out in names:
            return None
        names.add(out)
        if out == WEIGHT or inner.name == WEIGHT:
            if out != inner.name:
                return None
            weight = True
        else:
            columns.append((out, inner.name))
    return (table.name, columns) if weight and sql.expressions[-1].alias_or_name == WEIGHT else None


def prune_projections(program: Program) -> Program:
    """Each query's CTEs and subqueries without the columns nothing reads.

    sqlglot's rule keeps every output of the statement itself, every
    column of a DISTINCT, INTERSECT or EXCEPT (dropping one would change
    its rows) and whatever a filter, join or grouping reads. It wants
    qualified columns and no ``*``: a query with either (a state merge's
    ``SELECT *``) is left as it is.
    """
    for step in program.steps:
        if not isinstance(step, Query) or not step.sql.args.get("with_") and not step.sql.find(exp.Subquery):
            continue
        if any(not column.table for column in step.sql.find_all(exp.Column)) or step.sql.find(exp.Star):
            continue
        try:
            step.sql = pushdown_projections(step.sql.copy())
        except OptimizeError:  # a shape the rule does not take: the query stays as it is
            continue
    return program


def narrow_lookups(program: Program) -> Program:
    """Each lookup takes only the columns its readers may read (all of them where one reads all)."""
    needed = columns_read(program)
    if needed is None:
        return program
    for step in program.steps:
        if isinstance(step, Lookup) and needed.get(step.out) is not None:
            step.columns = frozenset(needed[step.out])
    return program


RULES = (push_probes, inline_queries, fuse_renames, prune_projections, narrow_lookups)
