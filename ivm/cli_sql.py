"""``ivm sql``: run statements on a durable database, with a progress bar during backfills.

CREATE MATERIALIZED VIEW over large tables computes the view first (the
backfill, on Spark when the view's engine says so). While a statement runs, a
thread polls ``db.status()["backfills"]``: the steps of the view's program
done so far and, on Spark, the tasks of the stages running now (Spark's
status tracker). Query results are printed as a table.
"""

from __future__ import annotations

import sys
import threading

from sql_frontend.statements import statement_texts

POLL_SECONDS = 0.2


def run_sql(path: str, statements: str, options: dict) -> int:
    import ivm

    try:
        db = ivm.connect(path, **options)
    except ivm.IvmError as e:
        print(f"ivm sql: {e}", file=sys.stderr)
        return 1
    # Like psql -c: a script runs one statement at a time, in order (db.sql takes one),
    # stops at the first error, and prints the last statement's result.
    texts = statement_texts(statements) or [statements]  # None: let db.sql report the syntax error
    with db:
        try:
            for text in texts:
                result = _with_progress(db, lambda text=text: db.sql(text))
        except ivm.IvmError as e:
            print(f"ivm sql: {e}", file=sys.stderr)
            return 1
        _print(result)
    return 0


def _with_progress(db, work):
    """Run ``work()`` while a rich progress bar shows any backfill in db.status()."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    done = threading.Event()
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as e:  # re-raised in the calling thread
            outcome["error"] = e
        finally:
            done.set()

    worker = threading.Thread(target=target, name="ivm-sql", daemon=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[detail]}"),
                  TimeElapsedColumn(), transient=True) as progress:
        bars: dict[str, int] = {}
        worker.start()
        while not done.wait(POLL_SECONDS):
            for name, entry in db.status()["backfills"].items():
                if name not in bars:
                    bars[name] = progress.add_task(f"computing {name} on {entry['engine']}",
                                                   total=entry["steps"], detail="")
                detail = f"step {entry['step']}/{entry['steps']}"
                if entry.get("tasks"):
                    detail += f", tasks {entry['tasks_done']}/{entry['tasks']}"
                progress.update(bars[name], completed=entry["step"], detail=detail)
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _print(result) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for name in result.column_names:
        table.add_column(name)
    for row in result.to_pylist():
        table.add_row(*("" if v is None else str(v) for v in row.values()))
    Console().print(table)
