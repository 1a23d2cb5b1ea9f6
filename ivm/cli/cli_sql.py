"""``ivm sql``: run statements, or a shell, on a durable database or a running server.

``--data DIR`` opens the database here, with a progress bar while a
statement runs: CREATE MATERIALIZED VIEW over large tables computes the view
first (the backfill, on Spark when the view's engine says so), and a thread
polls ``db.status()["backfills"]``: the steps of the view's program done so
far and, on Spark, the tasks of the stages running now (Spark's status
tracker). ``--connect URL`` sends the statements to ``ivm serve`` instead
(ivm/cli/remote.py), which is the only way while the server holds the directory.

Given statements, it runs them in order and prints each result (like psql
-f), stopping at the first error; without, it is the shell of ivm/cli/shell.py.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time

from ivm.cli.remote import RemoteError, Result, connect
from ivm.cli.shell import print_result, run_shell
from sql_frontend.statements import statement_texts

POLL_SECONDS = 0.2
SHELL_KEYS = "\\? for help, \\q to quit"


def run_sql(path: str, statements: str | None, options: dict) -> int:
    import ivm
    from ivm.cli.serving import connect_hint

    try:
        db = ivm.connect(path, **options)
    except ivm.IvmError as e:
        hint = f"\n{connect_hint(path, 'ivm sql')}" if "open in another process" in str(e) else ""
        print(f"ivm sql: {e}{hint}", file=sys.stderr)
        return 1

    def execute(text: str) -> Result:
        start = time.perf_counter()
        table = _with_progress(db, lambda: db.sql(text))
        return Result.of_table(table, time.perf_counter() - start)

    with db:
        if statements is None:
            return run_shell(execute, errors=(ivm.IvmError,), banner=f"ivm sql on {path}; {SHELL_KEYS}")
        return run_statements(execute, statements, (ivm.IvmError,))


def run_remote(url: str, statements: str | None, auth_token: str | None, tls_root_certs: str | None) -> int:
    try:
        connection = connect(url, auth_token, tls_root_certs)
    except RemoteError as e:
        print(f"ivm sql: {e}", file=sys.stderr)
        return 1
    try:
        if statements is None:
            return run_shell(connection.execute, banner=f"connected to {url}; {SHELL_KEYS}")
        return run_statements(connection.execute, statements, (RemoteError,))
    finally:
        connection.close()


def run_statements(execute, statements: str, errors: tuple) -> int:
    """Like psql -f: one statement at a time, in order, each result printed; stop at the first error."""
    texts = statement_texts(statements) or [statements]  # None: let the database report the syntax error
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    for text in texts:
        try:
            result = execute(text)
        except errors as e:
            print(f"ivm sql: {e}", file=sys.stderr)
            return 1
        print_result(result, sys.stdout, width)
    return 0


def _with_progress(db, work):
    """Run ``work()`` while a rich progress bar shows any backfill in db.status()."""
    from rich.console import Console
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
    # On stderr, and only on a terminal: stdout holds the results, which a pipe reads without bars.
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[detail]}"),
                  TimeElapsedColumn(), transient=True, console=Console(stderr=True),
                  disable=not sys.stderr.isatty()) as progress:
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
