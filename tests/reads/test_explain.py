"""EXPLAIN of the 22 TPC-H views (issue 3, acceptance 3): for each view, which
parts are incremental and what state each keeps.

Every plan node carries its incremental rule; every relation a change program
looks up or replaces (other than base tables and the view's own output) is
listed as a state with its role and index; every source has a verdict
(incremental, or the steps that read whole relations). Then specific views
pin down what the text says for aggregates, MIN/MAX, outer and anti joins,
top-K and scalar subqueries; windows, top-K and recursion have
tests/reads/test_explain_ordered.py.
"""

from __future__ import annotations

import re

import pytest

import ivm
from bench import tpch

QUERIES = tpch.query_files()
NODES = ("Source ", "SPJ ", "Aggregate ", "Distinct", "UnionAll ", "SemiJoin ", "AntiJoin ", "EXCEPT", "INTERSECT",
         "Window ", "TopK ", "Recursive ")


@pytest.fixture(scope="module")
def explained():
    db = ivm.connect()
    try:
        tpch.create_tables(db)
        for name, sql in QUERIES.items():
            db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
        yield {name: db.sql(f"EXPLAIN {name}").column(0).to_pylist() for name in QUERIES}
    finally:
        db.close()


def plan_lines(lines: list[str]) -> list[str]:
    return lines[lines.index("plan:") + 1:next(i for i, l in enumerate(lines) if l.startswith("output:"))]


@pytest.mark.parametrize("name", list(QUERIES))
def test_every_part_says_how_it_is_maintained_and_what_it_keeps(explained, name):
    lines = explained[name]
    plan = plan_lines(lines)
    nodes = [i for i, line in enumerate(plan) if line.strip().startswith(NODES)]
    assert nodes, plan
    for i in nodes:
        assert plan[i + 1].strip().startswith("incremental"), (plan[i], plan[i + 1])
    states = {m.group(1) for line in plan if (m := re.match(r"\s+state (\S+): \S", line))}
    used = {m.group(1) for line in lines for m in re.finditer(r"(?:lookup|replace rows of) (\S+)", line)}
    kept = {r for r in used if r.startswith(f"{name}.")}
    assert kept <= states, f"state used but not explained: {kept - states}"
    assert states <= kept, f"state explained but never used: {states - kept}"
    sources = {line.split()[1] for line in plan if line.strip().startswith("Source ")}
    sections = [line[len("on a change to "):].rstrip(":") for line in lines if line.startswith("on a change to ")]
    assert set(sections) == sources and len(sections) == len(sources)
    verdicts = [line.strip() for line in lines if line.startswith("  incremental: no step")
                or line.startswith("  not incremental:")]
    assert len(verdicts) == len(sections)


def section(lines: list[str], source: str) -> list[str]:
    start = lines.index(f"on a change to {source}:")
    # A section is its indented lines: the next unindented line (another source,
    # or the maintenance/engine lines at the end) closes it.
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
    return lines[start + 1:end]


def test_q01_is_one_aggregate_maintained_from_lineitem_changes_alone(explained):
    text = "\n".join(explained["q01"])
    assert re.search(r"state q01\.agg\d+: per-group counts and sums, keyed by \(l_returnflag, l_linestatus\)", text)
    assert section(explained["q01"], "lineitem")[-1] == "  incremental: no step reads a whole relation"


def test_q02_min_keeps_the_values_per_group_and_the_top_k_a_buffer(explained):
    text = "\n".join(explained["q02"])
    assert "Aggregate group by ps_partkey  computing agg0=MIN(arg0)" in text
    assert re.search(r"state q02\.vals\d+_0: multiset of arg0 per group \(MIN/MAX/DISTINCT\), keyed by \(ps_partkey, __v\)",
                     text)
    assert "TopK order by s_acctbal DESC NULLS LAST, n_name NULLS LAST, s_name NULLS LAST, p_partkey NULLS LAST  " \
           "LIMIT 100 OFFSET 0" in text
    assert re.search(r"state q02\.topk\d+: buffer: the first 200\.\.400 input rows", text)
    # Only the refill (when deletions empty the buffer) reads whole relations.
    for source in ("part", "supplier", "partsupp", "nation", "region"):
        marked = [line for line in section(explained["q02"], source) if " := " in line and "[reads all of" in line]
        assert len(marked) == 1 and "refill: the first 200 rows of the input" in marked[0], marked


def test_q13_left_join_is_an_inner_join_plus_an_anti_join_with_match_counts(explained):
    text = "\n".join(explained["q13"])
    assert "(rows of customer without a match in orders (outer join))" in text
    assert re.search(r"state q13\.semi\d+: number of right rows per join key, keyed by \(k0\)", text)
    for source in ("customer", "orders"):
        assert section(explained["q13"], source)[-1] == "  incremental: no step reads a whole relation"


def test_q22_scalar_subquery_comparison_reads_the_customers_between_the_two_averages(explained):
    """When the average moves, only customers between the old and the new average can change the view."""
    text = "\n".join(explained["q22"])
    assert "AntiJoin on" in text and "NOT EXISTS(" in text
    assert re.search(r"state q22\.agg\d+: per-group counts and sums, read whole", text)  # the one-row AVG
    steps = [line for line in section(explained["q22"], "customer") if " := " in line]
    assert any(re.search(r"rows of customer with c_acctbal within the range of agg\d+\.agg0", line) for line in steps)
    marked = [line.split("[reads all of")[1].split("]")[0] for line in steps if "[reads all of" in line]
    assert marked and not any("customer" in reads for reads in marked), marked


def test_q11_reads_the_parts_between_the_two_thresholds_not_every_part(explained):
    """q11 keeps the parts whose value exceeds a share of the total (SUM(...) * 0.0001). A change of the
    total moves the threshold, and only the parts between the old and the new one can enter or leave:
    the term of the total's change reads those groups of the per-part state by a range of their sums."""
    steps = [line for line in section(explained["q11"], "partsupp") if " := " in line]
    assert any(re.search(r"compared\d+ := the value each row of agg\d+ is compared with", line) for line in steps)
    assert any(re.search(r"range\d+ := rows of q11\.agg\d+ with __s0 within the range of compared\d+\.__compared",
                         line) for line in steps), steps
    marked = [line.split("[reads all of")[1].split("]")[0] for line in steps if "[reads all of" in line]
    # Only the one-row state of the total is read whole, never the per-part state.
    assert all(re.fullmatch(r"q11\.agg\d+", reads.strip()) for reads in marked), marked
    per_part = re.search(r"range\d+ := rows of (q11\.agg\d+)", "\n".join(steps)).group(1)
    assert not any(per_part in reads for reads in marked), marked


def test_incrementality_report_is_derived_from_explain(explained):
    notes, reads = tpch.incrementality(explained["q03"])
    assert "top-K" in notes
    assert set(reads) == {"customer", "orders", "lineitem"}
    assert all(r and all(x.endswith("(top-K refill)") for x in r) for r in reads.values()), reads
    notes, reads = tpch.incrementality(explained["q06"])
    assert notes == [] and reads == {"lineitem": []}
    notes, reads = tpch.incrementality(explained["q21"])
    assert {"anti join", "semi join", "per-row match counts (non-equi correlation)", "top-K"} <= set(notes)
