"""Run delta programs on Spark: the same Program IR, queries as Spark jobs.

    Query   -> spark.sql over temporary views: the step's inputs (Arrow
               temporaries shipped as DataFrames) and whole stored relations
               (``scan_name(rel)``: cached per run, see frames.py); the tree is
               rendered by dialect.py
    Lookup  -> up to JOIN_PROBES probe rows: the relation's index on the driver
               (numpy, exactly as on DuckDB: the relations live there); above,
               a Spark left-semi join of the relation's DataFrame with the
               distinct probe keys, NULL-safe (``<=>``) like the key codes
    Stack, Loop, Replace -> shared with the DuckDB executor (ivm/executor.py)

Each step's result comes back to the driver as Arrow, so emptiness (the
skip rules), loops and the Replace bookkeeping behave exactly as on DuckDB,
and the engine commits the same RowChanges. The price is one round trip per
step; a later version could keep intermediate steps as lazy DataFrames.
"""

from __future__ import annotations

import pyarrow as pa
from sqlglot import exp

from delta_operators.program import Lookup, Query, scan_name
from delta_operators.zset import POS, RUN
from ivm.executor import StepRunner
from ivm.spark.dialect import to_spark
from ivm.spark.frames import Frames
from sql_frontend.errors import ExecutionError, InternalError, UnsupportedError
from storage.keys import KeyCoder
from storage.store import Snapshot

SCAN_PREFIX = scan_name("")
# Probes above this many rows are joined on Spark instead of looked up in the
# driver's index (the index is O(probes) and needs the probe keys on the driver).
JOIN_PROBES = 200_000


class SparkExecutor(StepRunner):
    engine = "spark"

    def __init__(self, spark, coder: KeyCoder, join_probes: int | None = None):
        super().__init__(coder)
        # A session of our own: temporary views are per session, so programs of
        # other executors (threads, databases) never see ours.
        self.spark = spark.newSession()
        self.frames = Frames(self.spark)
        self.join_probes = JOIN_PROBES if join_probes is None else join_probes
        self._texts: dict[int, tuple[Query, str, dict[str, str], pa.Schema | None]] = {}
        self.jobs = 0  # Spark queries run (for stats and tests)

    # --- queries -------------------------------------------------------------------
    def _text(self, step: Query) -> tuple[str, dict[str, str], pa.Schema | None]:
        """Spark SQL of a step, the inputs it reads (Spark name -> temp or scan name), its result schema.

        Inputs are renamed ``__in0, __in1, ...``: Spark's temporary views take
        single-part names, and state relations are named ``view.state``.
        """
        entry = self._texts.get(id(step))
        if entry is None or entry[0] is not step:
            tree = step.sql.copy()
            ctes = {cte.alias for cte in tree.find_all(exp.CTE)}
            inputs: dict[str, str] = {}
            for table in tree.find_all(exp.Table):
                if table.name in ctes:
                    continue
                spark_name = next((k for k, v in inputs.items() if v == table.name), f"__in{len(inputs)}")
                inputs[spark_name] = table.name
                if not table.alias:  # columns may be qualified by the original name
                    table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name, quoted=True)))
                table.set("this", exp.to_identifier(spark_name, quoted=True))
            entry = self._texts[id(step)] = (step, to_spark(tree), inputs, None)
        return entry[1], entry[2], entry[3]

    def _query(self, step: Query, temps: dict[str, pa.Table], snapshot: Snapshot,
               registered: dict[str, object], label: str) -> pa.Table:
        text, inputs, empty = self._text(step)
        if empty is not None and self._skippable(step.drivers, step.skip, temps):
            return empty.empty_table()
        for spark_name, name in inputs.items():
            self._register(spark_name, name, temps, snapshot, registered)
        try:
            result = self.spark.sql(text).toArrow()
        except Exception as e:  # pyspark raises its own hierarchy; report what Spark said
            raise spark_error(e, label) from None
        self.jobs += 1
        if empty is None:
            self._texts[id(step)] = (step, text, inputs, result.schema)
        return result

    def _register(self, spark_name: str, name: str, temps: dict[str, pa.Table], snapshot: Snapshot,
                  registered: dict[str, object]) -> None:
        if name in temps:
            data = temps[name]
            if registered.get(spark_name) is not data:
                self.frames.arrow(data).createOrReplaceTempView(spark_name)
                registered[spark_name] = data
        elif name.startswith(SCAN_PREFIX):
            relation = snapshot[name[len(SCAN_PREFIX):]]
            if registered.get(spark_name) is not relation:
                self.frames.relation(relation).createOrReplaceTempView(spark_name)
                registered[spark_name] = relation
        else:
            raise InternalError(f"query reads {name}, which is neither a temporary nor a relation scan")

    def _release(self, registered: dict[str, object]) -> None:
        for name in registered:
            self.spark.catalog.dropTempView(name)

    # --- lookups -------------------------------------------------------------------
    def _lookup(self, step: Lookup, temps: dict[str, pa.Table], snapshot: Snapshot) -> pa.Table:
        probe = temps[step.probe]
        if not step.index or probe.num_rows <= self.join_probes:
            return super()._lookup(step, temps, snapshot)
        return self._join_lookup(step, probe, snapshot)

    def _join_lookup(self, step: Lookup, probe: pa.Table, snapshot: Snapshot) -> pa.Table:
        """Rows of the relation whose index columns equal (NULL-safe) some probe's."""
        relation = snapshot[step.relation]
        if step.probe_filter is not None:
            probe = probe.filter(probe.column(step.probe_filter))
        keys = [f"__k{i}" for i in range(len(step.index))]
        probe_keys = self.frames.arrow(probe.select(list(step.probe_columns)).rename_columns(keys)).distinct()
        stored = self.frames.relation(relation, step.positions)
        condition = None
        for column, key in zip(step.index, keys):
            equal = stored[column].eqNullSafe(probe_keys[key])
            condition = equal if condition is None else condition & equal
        try:
            found = stored.join(probe_keys, condition, "left_semi").toArrow()
        except Exception as e:
            raise spark_error(e, f"lookup in {step.relation}") from None
        self.jobs += 1
        schema = relation.schema
        if step.positions:
            schema = schema.append(pa.field(RUN, pa.int32())).append(pa.field(POS, pa.int64()))
        return found.select(schema.names).cast(schema)


def spark_error(error: Exception, label: str) -> Exception:
    """An ivm error for what Spark raised: functions it lacks are UnsupportedError."""
    condition = getattr(error, "getCondition", lambda: None)() or getattr(error, "getErrorClass", lambda: None)()
    message = str(error).strip().split("\n")[0]
    prefix = f"{label}: " if label else ""
    if condition == "UNRESOLVED_ROUTINE":
        routine = (getattr(error, "getMessageParameters", lambda: {})() or {}).get("routineName", "")
        routine = routine.replace("`", "").lower()
        return UnsupportedError(f"{prefix}function {routine or message} is not available on Spark; "
                                "maintain this view with engine = 'duckdb'")
    return ExecutionError(f"{prefix}Spark: {message}")
