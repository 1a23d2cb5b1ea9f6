"""bench.fixed_costs runs against the runtime as it is: every stage it names exists and is met."""

import duckdb

from bench import core, fixed_costs


def test_every_stage_of_a_batch_with_a_read_view_is_timed():
    rows = 20_000
    data = core.generate(duckdb.connect(), rows)
    result = fixed_costs.run_scenario(data, rows, "per_customer", warmup=2, batches=3, seed=1, read=True)
    medians = result["medians_ms"]
    met = {path.rsplit("/", 1)[-1] for path, ms in medians.items() if ms > 0}
    assert {"apply_changes", "convert to a Z-set change", "maintain the views", "publish the snapshot",
            "compute a read view's rows"} <= met, medians
    assert "a point read after each batch" in fixed_costs.report(result)
    assert result["read_ms"] > 0 and "The point read after each batch: median" in fixed_costs.report(result)


def test_only_a_read_between_batches_makes_them_compute_the_rows_for_reads(monkeypatch):
    from ivm.reads import reads
    computed, warming = [], []
    compute, warm = reads.Reader._computed, reads.Reader.warm

    def counted(self, *args):
        if warming:  # computed by a batch's publish for the next reads, not by a read itself
            computed.append(args[2].name)
        return compute(self, *args)

    def warmed(self, *args, **kwargs):
        warming.append(True)
        try:
            return warm(self, *args, **kwargs)
        finally:
            warming.pop()

    monkeypatch.setattr(reads.Reader, "_computed", counted)
    monkeypatch.setattr(reads.Reader, "warm", warmed)
    rows = 20_000
    data = core.generate(duckdb.connect(), rows)
    fixed_costs.run_scenario(data, rows, "per_customer", warmup=2, batches=3, seed=1)
    # Nobody read but CREATE (it reads the view's first rows): only the first batch computes them.
    assert computed == ["per_customer"]
    computed.clear()
    fixed_costs.run_scenario(data, rows, "per_customer", warmup=2, batches=3, seed=1, read=True)
    # The batch after CREATE, and at least each of the 3 timed batches: each follows a point read
    # (the first read, the one DuckDB answers to learn the result schema, may not count).
    assert set(computed) == {"per_customer"} and len(computed) >= 1 + 3
