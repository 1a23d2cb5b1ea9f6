"""Run delta programs on Spark: the same Program IR, chains of queries as one Spark job.

    Query   -> spark.sql over temporary views, kept as a lazy DataFrame
               (temps.py): a later query reads it inside its own plan, so a
               chain of queries runs as one job; rows come to the driver only
               where a step needs them there (a small result read by several
               queries from a one-partition checkpoint that those queries
               read, so it never crosses back). Inputs are the change batches
               (shipped once per run) and whole stored relations
               (``scan_name(rel)``: cached per run, see frames.py); the tree is
               rendered by dialect.py
    Lookup  -> up to JOIN_PROBES probe rows: the relation's index on the
               driver (numpy, exactly as on DuckDB: the relations live there);
               above, a lazy Spark left-semi join of the relation's DataFrame
               with the distinct probe keys, NULL-safe (``<=>``) like the key
               codes; the whole relation (no index): its DataFrame, lazily
    Stack, Loop, Replace -> shared with the DuckDB executor (ivm/execute/executor.py),
               on driver rows
    Steps on stored state (``Query.beside_state``: merging a change into
               state looked up by key, testing the merged rows) -> on the
               driver, by the DuckDB executor, when their lookups ran
               there: the change is computed on Spark and collected, the
               state rows are already on the driver, and the result is
               needed there (the Replace). On Spark a merge cost shipping
               the looked-up rows over and its result back, a job and a
               checkpoint. With lookups as Spark joins (above JOIN_PROBES)
               the state rows are in Spark, and so are these steps.

The skip rules use the sizes known without a job (driver temporaries); the
Replace steps and the view's output come to the driver, so the engine commits
the same RowChanges as on DuckDB.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import pyarrow as pa
from sqlglot import exp

from delta_operators.program import Lookup, Query, readers, scan_name
from storage.zset import POS, RUN
from ivm.execute.executor import StepRunner
from ivm.execute.spark.dialect import to_spark
from ivm.execute.spark.frames import Frames
from ivm.execute.spark.temps import Lazy, SparkTemps, driver_columns, queried, spark_columns_read
from sql_frontend.errors import ExecutionError, InternalError, UnsupportedError
from storage.keys import KeyCoder
from storage.store import Snapshot

SCAN_PREFIX = scan_name("")
# Probes above this many rows are joined on Spark instead of looked up in the
# driver's index (the index is O(probes) and needs the probe keys on the driver).
JOIN_PROBES = 200_000
# How a plan over small one-partition inputs runs (see SparkExecutor._small):
SMALL_PLAN = {
    # sort-merge joins of single partitions need no exchange; a broadcast is a job
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    # what still needs an exchange (a grouping over a UNION ALL) goes to one partition,
    "spark.sql.shuffle.partitions": "1",
    # as one job with several stages (AQE submits a job per stage)
    "spark.sql.adaptive.enabled": "false",
    # and joins of one-partition inputs stay inside that partition: above this
    # estimate Spark re-shuffles them "to improve parallelism", and a
    # checkpoint's (LogicalRDD's) estimate is the default size, i.e. huge
    "spark.sql.maxSinglePartitionBytes": str(2**62),
}


class SparkExecutor(StepRunner):
    engine = "spark"

    def __init__(self, spark, coder: KeyCoder, join_probes: int | None = None, driver: StepRunner | None = None):
        super().__init__(coder)
        # Runs steps on stored state on the driver (the worker's DuckDB executor); None: all queries on Spark.
        self.driver = driver
        self.driver_steps = 0  # steps on stored state run on the driver (for stats, tests, bench)
        # A session of our own: temporary views are per session, so programs of
        # other executors (threads, databases) never see ours.
        self.spark = spark.newSession()
        self.frames = Frames(self.spark)
        self.join_probes = JOIN_PROBES if join_probes is None else join_probes
        self._texts: dict[int, tuple[Query, str, dict[str, str], pa.Schema | None]] = {}
        self.jobs = 0  # Spark jobs whose rows came to the driver (for stats, tests, bench)
        self._program = None
        self._readers: Counter = Counter()
        self._queried: set[str] = set()
        self._columns: dict[str, set[str] | None] = {}
        self._driver: dict[str, set[str] | None] | None = None  # driver_columns(program)
        self._names: dict[str, str] = {}  # temporary or scan name -> its Spark view name
        self._cached: list = []  # checkpoints this run made (_cache), dropped by release

    def run(self, program, inputs, snapshot, label="", progress=None):
        if self._program is not program:  # the same program runs every batch: analyse it once
            self._program, self._readers, self._columns = program, readers(program), spark_columns_read(program)
            self._queried, self._driver = queried(program), driver_columns(program)
        return super().run(program, inputs, snapshot, label, progress)

    def _temps(self, inputs: dict[str, pa.Table], label: str) -> SparkTemps:
        def collect(lazy: Lazy) -> pa.Table:
            frame = lazy.frame
            if lazy.columns is not None:  # quoted: temporaries' columns may be named "o.id"
                frame = frame.select(*[frame["`" + c.replace("`", "``") + "`"] for c in lazy.columns])
            try:
                with self._small(lazy.small):
                    rows = frame.toArrow()
            except Exception as e:  # pyspark raises its own hierarchy; report what Spark said
                raise spark_error(e, label) from None
            self.jobs += 1
            if lazy.schema is None:
                return rows
            schema = pa.schema([f for f in lazy.schema if f.name in rows.column_names])
            return rows.select(schema.names).cast(schema)

        return SparkTemps(inputs, self.frames.arrow, collect, self._columns)

    @contextmanager
    def _small(self, small: bool):
        """SMALL_PLAN's settings while a plan over small one-partition inputs runs.

        Spark plans when the job starts, so the settings apply to this plan
        only. Its inputs are single partitions (frames.SMALL_ROWS), which
        satisfy every join's and grouping's distribution: without broadcasts
        the whole plan is one stage (sort-merge joins inside one task), where
        each broadcast is a job of its own (with AQE, so is every exchange).
        """
        if not small:
            yield
            return
        conf = self.spark.conf
        before = {key: conf.get(key) for key in SMALL_PLAN}
        for key, value in SMALL_PLAN.items():
            conf.set(key, value)
        try:
            yield
        finally:
            for key, value in before.items():
                conf.set(key, value)

    # --- queries -------------------------------------------------------------------
    def _text(self, step: Query) -> tuple[str, dict[str, str], pa.Schema | None]:
        """Spark SQL of a step, the inputs it reads (Spark name -> temp or scan name), its result schema.

        Inputs are renamed ``__v0, __v1, ...``: Spark's temporary views take
        single-part names, and state relations are named ``view.state``. Each
        temporary keeps its Spark name for good, so one registered once per
        run serves every query that reads it (replacing a temporary view
        also drops Spark's cache of every plan that read it, e.g. of a
        large cached input batch, frames.py).
        """
        entry = self._texts.get(id(step))
        if entry is None or entry[0] is not step:
            tree = step.sql.copy()
            ctes = {cte.alias for cte in tree.find_all(exp.CTE)}
            inputs: dict[str, str] = {}
            for table in tree.find_all(exp.Table):
                if table.name in ctes:
                    continue
                spark_name = self._names.setdefault(table.name, f"__v{len(self._names)}")
                inputs[spark_name] = table.name
                if not table.alias:  # columns may be qualified by the original name
                    table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name, quoted=True)))
                table.set("this", exp.to_identifier(spark_name, quoted=True))
            entry = self._texts[id(step)] = (step, to_spark(tree), inputs, None)
        return entry[1], entry[2], entry[3]

    def _remember_schema(self, step: Query, schema: pa.Schema) -> None:
        entry = self._texts.get(id(step))
        if entry is not None and entry[0] is step and entry[3] is None:
            self._texts[id(step)] = (*entry[:3], schema)

    def _skippable(self, drivers, skip, temps) -> bool:
        """The skip rule over the drivers whose size is known without a Spark job."""
        if not drivers:
            return False
        empty = [not temps.lazy(d) and temps[d].num_rows == 0 for d in drivers]
        return any(empty) if skip == "any" else all(empty)

    def _on_driver(self, name: str, temps: SparkTemps) -> bool:
        return name in temps and not temps.lazy(name)

    def query(self, step: Query, temps: SparkTemps, snapshot: Snapshot,
               registered: dict[str, object], label: str):
        """The step's result as a lazy DataFrame (see temps.py), collected now if several steps read it."""
        text, inputs, empty = self._text(step)
        if step.beside_state and self._beside_state(inputs.values(), temps):
            return self._run_beside_state(step, temps, snapshot, label)
        if empty is not None and (self._skippable(step.drivers, step.skip, temps) or self._guarded(step, temps)):
            return empty.empty_table()
        for spark_name, name in inputs.items():
            self._register(spark_name, name, temps, snapshot, registered)
        try:
            frame = self.spark.sql(text)  # analysis only: errors in names and types show here
        except Exception as e:
            raise spark_error(e, label) from None
        if empty is None:
            # Known without a job, so the skip rule applies from the next run
            # on, also to steps that are never collected (read inside others).
            self._remember_schema(step, arrow_schema(frame))
        lazy = Lazy(frame, small=all(name in temps and temps.small(name) for name in inputs.values()))
        if self._readers[step.out] > 1:
            # Read twice: collect it now, not its plan computed by every reader.
            if lazy.small and step.out in self._queried:
                lazy = self._cache(lazy, step.out)
            dict.__setitem__(temps, step.out, lazy)
            temps[step.out]
        return lazy

    def _beside_state(self, names, temps: SparkTemps) -> bool:
        """True when a step on stored state reading ``names`` runs on the driver: none is stored rows in Spark."""
        if self.driver is None:
            return False
        return all(name in temps and not temps.stored(name) for name in names)

    def _run_beside_state(self, step: Query, temps: SparkTemps, snapshot: Snapshot, label: str) -> pa.Table:
        """Run a step on stored state with the driver's executor, collecting the change it reads from Spark."""
        registered: dict[str, pa.Table] = {}
        try:
            result = self.driver.query(step, temps, snapshot, registered, label)
        finally:
            self.driver.release(registered)
        self.driver_steps += 1
        return result

    def _cache(self, lazy: Lazy, name: str) -> Lazy:
        """``lazy`` as a one-partition Spark checkpoint: its collect fills it, its Spark readers read it.

        A small plan's result stays in the JVM for its Spark readers instead
        of crossing to the driver and back (shipping rows costs more than
        the plan: Arrow decoding, decimals above all). A local checkpoint,
        not ``cache()``: the cache manager matches readers' plans to cached
        ones and missed those with CTEs, so readers recomputed the plan. Its
        physical plan is made now, so under SMALL_PLAN's settings; readers
        see one partition. Only small plans: for a plan over stored
        relations, readers planned against a cached size estimate shuffled
        where they broadcast (session 3). Dropped when the run ends (``release``).

        The collect brings only the columns driver steps read (``driver_columns``:
        a join term's lookups read its 2-3 key columns of 6), at least one (the
        skip rules count rows); the checkpoint holds all of them.
        """
        with self._small(True):
            frame = lazy.frame.coalesce(1).localCheckpoint(eager=False)
        self._cached.append(frame)
        columns = None
        if self._driver is not None and self._driver.get(name, set()) is not None:
            wanted = {c.lower() for c in self._driver.get(name, set())}
            columns = tuple(c for c in frame.columns if c.lower() in wanted) or tuple(frame.columns[:1])
        return Lazy(frame, schema=lazy.schema, small=True, cached=True, columns=columns)

    def _steps_run(self, steps, temps, snapshot, registered, label) -> None:
        for step in steps:
            if isinstance(step, Query):
                dict.__setitem__(temps, step.out, self.query(step, temps, snapshot, registered, label))
            elif isinstance(step, Lookup):
                dict.__setitem__(temps, step.out, self._lookup(step, temps, snapshot))
            else:
                super()._steps_run([step], temps, snapshot, registered, label)

    def _register(self, spark_name: str, name: str, temps: SparkTemps, snapshot: Snapshot,
                  registered: dict[str, object]) -> None:
        if name in temps:
            frame = temps.frame(name)
        elif name.startswith(SCAN_PREFIX):
            frame = self.frames.relation(snapshot[name[len(SCAN_PREFIX):]])
        else:
            raise InternalError(f"query reads {name}, which is neither a temporary nor a relation scan")
        if registered.get(spark_name) is not frame:
            frame.createOrReplaceTempView(spark_name)
            registered[spark_name] = frame

    def release(self, registered: dict[str, object]) -> None:
        for name in registered:
            self.spark.catalog.dropTempView(name)
        for frame in self._cached:  # a checkpoint's plan is a LogicalRDD over the persisted rows
            frame._jdf.logicalPlan().rdd().unpersist(False)
        self._cached.clear()

    def task_progress(self) -> dict[str, int]:
        """Tasks done and in all of the Spark stages running now (Spark's status tracker)."""
        tracker = self.spark.sparkContext.statusTracker()
        done = total = 0
        for stage in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        return {"tasks_done": done, "tasks": total}

    # --- lookups -------------------------------------------------------------------
    def _lookup(self, step: Lookup, temps: SparkTemps, snapshot: Snapshot):
        """Driver index lookup (O(probes)); a lazy Spark join for huge probes; the whole relation lazily.

        A probe still in Spark is collected first. Joining it lazily with
        small relations instead was measured slower (SF 0.1, 1% batches:
        +50% JVM CPU): Spark plans the distinct keys and the join with
        shuffles (several stages), where a collected probe costs one job.
        """
        relation = snapshot[step.relation]
        probe = temps[step.probe]
        if not step.index and probe.num_rows:
            return Lazy(self.frames.relation(relation, step.positions), schema=_schema(relation, step.positions),
                        stored=True)
        if not step.index or probe.num_rows <= self.join_probes:
            return super()._lookup(step, temps, snapshot)
        return self._join_lookup(step, temps.frame(step.probe), relation)

    def _join_lookup(self, step: Lookup, probe, relation) -> Lazy:
        """Rows of the relation whose index columns equal (NULL-safe) some probe's."""
        from pyspark.sql import functions as F

        if step.probe_filter is not None:
            probe = probe.filter(F.col(step.probe_filter))
        keys = [f"__k{i}" for i in range(len(step.index))]
        probe_keys = probe.select(*[F.col(c).alias(k) for c, k in zip(step.probe_columns, keys)]).distinct()
        stored = self.frames.relation(relation, step.positions)
        condition = None
        for column, key in zip(step.index, keys):
            equal = stored[column].eqNullSafe(probe_keys[key])
            condition = equal if condition is None else condition & equal
        return Lazy(stored.join(probe_keys, condition, "left_semi"), schema=_schema(relation, step.positions),
                    stored=True)


def _schema(relation, positions: bool) -> pa.Schema:
    """What a lookup in ``relation`` returns (Relation.lookup's columns)."""
    schema = relation.schema
    if positions:
        schema = schema.append(pa.field(RUN, pa.int32())).append(pa.field(POS, pa.int64()))
    return schema


def arrow_schema(frame) -> pa.Schema:
    """The Arrow schema ``frame.toArrow()`` returns, without running a job (pyspark's own conversion)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    large = frame.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    return to_arrow_schema(frame.schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC",
                           prefers_large_types=large)


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
