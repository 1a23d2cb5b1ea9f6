"""Every code block of README.md and docs/*.md runs here, and the output shown is the output produced.

A fenced block's language says how it runs; an HTML comment on the line
just before the fence, ``<!-- docs-test: DIRECTIVE -->``, changes that:

* ```` ```python ````: the page's blocks run in order in one namespace, in a
  temporary working directory; what they print is their output.
* ```` ```sql ````: statements (one at a time) against a fresh in-memory
  ``ivm.connect()`` per page; the output of the last query is formatted as
  psql prints it.
* ```` ```sh ````: ``bash -e`` in that directory, with ``ivm`` on PATH
  meaning this checkout's ``python -m ivm``; stdout is the output.
* ```` ```text ````: not code (a diagram, a shape of output), unless marked
  ``output``: then it must equal the output of the block before it
  (lines compared with trailing blanks removed).
* ``skip (REASON)``: not run; the reason is required, and ``SKIPS`` below
  lists how many each page has, so a new skip is a decision this file shows.
* ``server``: an ``sh`` block holding one ``ivm serve …`` command; the test
  starts it with free ports (``--port 0``, ``--pg-port 0``) and a temporary
  ``--data`` directory, and from then on the page's blocks reach it where
  they say ``127.0.0.1:8815`` (Flight) or port ``6875`` (PostgreSQL).
* ``psql``: an ``sql`` block run by ``psql`` against that server's
  PostgreSQL door, as a reader would type it.
* ``upstream``: an ``sql`` block run in a real PostgreSQL (a throwaway
  server with ``wal_level=logical`` and a database ``shop``; the page's
  ``host=localhost dbname=shop user=postgres`` means it).
* ``subscribe``: an ``sql`` ``COPY (SUBSCRIBE …) TO STDOUT`` run with psycopg
  until it has sent as many lines as the output block that follows; the
  first column (the offset) is not compared.
* ``error NAME``: the block must raise an error whose type or message
  holds NAME.

Replication is asynchronous: on a page with ``upstream`` blocks, a ``psql``
query whose output differs (or that fails) is run again for up to 30 s.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

import ivm
from flight_server.pgwire.types import text_values
from sql_frontend.statements import statement_texts

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
CONTRIBUTOR_PAGES = {"docs/architecture.md", "docs/testing.md"}  # may name source files and tests
LANGUAGES = {"python", "sql", "sh", "text"}
DIRECTIVE = re.compile(r"<!-- docs-test: (\w+)(?: (.*?))? -->")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")

# How many blocks each page marks ``skip``: a new skip must be counted here (and so reviewed).
SKIPS = {
    "README.md": 3,  # ./dev start and ./dev test; a PostgreSQL in Docker; pip install
    "docs/durability.md": 1,  # reading stored files with Spark
    "docs/sources.md": 1,  # ivm replicate runs until stopped
    "docs/spark.md": 1,  # a Spark cluster
}

FLIGHT_ADDRESS = "127.0.0.1:8815"
PG_PORT = "6875"
UPSTREAM_DSN = "host=localhost dbname=shop user=postgres"
CONVERGE_SECONDS = 30.0


@dataclass
class Block:
    page: str
    line: int
    language: str
    code: str
    directive: str | None
    argument: str | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.language}{', ' + self.directive if self.directive else ''})"


def blocks(page: str) -> list[Block]:
    """The fenced blocks of a page, each with the directive on the line before its fence."""
    found, lines = [], (ROOT / page).read_text().split("\n")
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, language, start = fence[1], fence[2], i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        assert i < len(lines), f"{page}:{start + 1}: unterminated code block"
        i += 1
        marker = DIRECTIVE.fullmatch(lines[start - 1].strip()) if start else None
        found.append(Block(page, start + 1, language, "\n".join(body) + "\n",
                           marker[1] if marker else None, marker[2] if marker else None))
    return found


# --- the things blocks run against ----------------------------------------------------------------
class Upstream:
    """A throwaway PostgreSQL (tests/cdc/pg_server.py) holding an empty database ``shop``."""

    def __init__(self):
        import psycopg

        from tests.cdc.pg_server import PostgresServer
        self.server = PostgresServer()
        with psycopg.connect(self.server.dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE shop")
        self.dsn = self.server.dsn.replace("dbname=postgres", "dbname=shop")

    def run(self, sql: str) -> str:
        import psycopg
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql)
        return ""

    def stop(self) -> None:
        self.server.stop()


def psql_table(table: pa.Table) -> str:
    """A query result as psql's aligned format prints it."""
    names = table.column_names
    cells = [["" if v is None else v for v in text_values(table.column(i))] for i in range(table.num_columns)]
    numeric = [pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
               for t in table.schema.types]
    widths = [max([len(n)] + [len(v) for v in column]) for n, column in zip(names, cells)]

    def center(text, width):
        left = (width - len(text)) // 2
        return " " * left + text + " " * (width - len(text) - left)

    lines = [" " + " | ".join(center(n, w) for n, w in zip(names, widths)),
             "-" + "-+-".join("-" * w for w in widths) + "-"]
    for row in zip(*cells):
        lines.append(" " + " | ".join(v.rjust(w) if num else v.ljust(w)
                                      for v, w, num in zip(row, widths, numeric)))
    lines.append(f"({table.num_rows} row{'' if table.num_rows == 1 else 's'})")
    return "\n".join(lines) + "\n"


def same_text(a: str, b: str) -> bool:
    return normal(a) == normal(b)


def normal(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.strip("\n").split("\n")]
    return lines


class Page:
    """The state a page's blocks share: a namespace, a directory, a database, a server, an upstream."""

    def __init__(self, page: str, tmp: Path):
        self.page, self.tmp = page, tmp
        self.blocks = blocks(page)
        self.namespace: dict = {"__name__": "__docs__"}
        self.db: ivm.Database | None = None
        self.server = None
        self.upstream: Upstream | None = None
        self.output: str | None = None
        self.previous: Block | None = None
        self.bin = tmp / ".bin"
        self.bin.mkdir()
        shim = self.bin / "ivm"
        shim.write_text(f'#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))} exec {shlex.quote(sys.executable)} -m ivm "$@"\n')
        shim.chmod(0o755)
        dbt = Path(sys.executable).with_name("dbt")  # docs/serving.md's dbt section (dbt-postgres: the test extras)
        if dbt.exists():
            (self.bin / "dbt").symlink_to(dbt)
        self.work = tmp / "work"
        self.work.mkdir()

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
        if self.server is not None:
            self.server.stop()
        if self.upstream is not None:
            self.upstream.stop()

    def here(self, code: str) -> str:
        """The code with the server's and the upstream's real addresses in place of the documented ones."""
        if self.server is not None:
            code = code.replace(FLIGHT_ADDRESS, self.server.uri.split("//", 1)[1])
            if self.server.pg_port:
                code = re.sub(rf"\b{PG_PORT}\b", str(self.server.pg_port), code)
        if self.upstream is not None:
            code = code.replace(UPSTREAM_DSN, self.upstream.dsn)
        return code

    # --- one block ------------------------------------------------------------------------------
    def run(self, block: Block) -> None:
        if block.directive == "output":
            assert block.language == "text", f"{block}: output blocks are ```text"
            self.check_output(block)
            return
        if block.directive == "error":
            assert block.argument, f"{block}: error needs the name of the error"
            with pytest.raises(Exception) as caught:
                self.execute(block)
            assert block.argument in f"{type(caught.value).__name__}: {caught.value}", f"{block}: {caught.value!r}"
            self.output = str(caught.value)
        elif self.converges(block):
            try:
                self.execute(block)
            except RuntimeError as e:  # say, the source has not yet created the table: check_output retries
                self.output = str(e)
        else:
            try:
                self.execute(block)
            except Exception as e:
                raise AssertionError(f"{block} failed: {type(e).__name__}: {e}\n--- the block:\n{block.code}") from e
        self.previous = block

    def converges(self, block: Block) -> bool:
        """A psql query on a page that changes an upstream, shown with its output: it may take a moment."""
        following = self.blocks[self.blocks.index(block) + 1:][:1]
        return (block.directive == "psql" and any(b.directive == "upstream" for b in self.blocks)
                and bool(following) and following[0].directive == "output")

    def execute(self, block: Block) -> None:
        kind = block.language if block.directive in (None, "error") else block.directive
        self.output = {"python": self.python, "sql": self.sql, "sh": self.sh, "server": self.start_server,
                       "psql": self.psql, "upstream": self.run_upstream, "subscribe": self.subscribe,
                       }[kind](block)

    def python(self, block: Block) -> str:
        printed = io.StringIO()
        cwd = os.getcwd()
        os.chdir(self.work)
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(self.here(block.code), str(block), "exec"), self.namespace)
        finally:
            os.chdir(cwd)
        return printed.getvalue()

    def sql(self, block: Block) -> str:
        if self.db is None:
            self.db = ivm.connect()
        output = ""
        for statement in statement_texts(block.code):
            result = self.db.sql(statement)
            if result.column_names != ["rows_affected"]:
                output = psql_table(result)
        return output

    def sh(self, block: Block) -> str:
        env = {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", self.here(block.code)], cwd=self.work,
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def start_server(self, block: Block) -> str:
        from flight_server.process import ServerProcess
        assert self.server is None, f"{block}: one server per page"
        words = shlex.split(block.code.split("#")[0])
        assert words[:2] in (["ivm", "serve"], [".venv/bin/ivm", "serve"]), f"{block}: not an ivm serve command"
        args, rest = [], words[2:]
        while rest:
            word = rest.pop(0)
            if word == "--port":
                rest.pop(0)  # ServerProcess passes --port 0
            elif word == "--pg-port":
                args += [word, "0"]
                rest.pop(0)
            elif word == "--data":
                args += [word, str(self.work / rest.pop(0))]
            else:
                args.append(word)
        self.server = ServerProcess(*args)
        return ""

    def psql(self, block: Block) -> str:
        assert self.server is not None and self.server.pg_port, f"{block}: no server with --pg-port runs"
        command = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.server.pg_port),
                   "-U", "ivm", "ivm"]
        done = subprocess.run(command, input=self.here(block.code), capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"psql: {done.stderr.strip()}")
        return done.stdout

    def run_upstream(self, block: Block) -> str:
        if self.upstream is None:
            self.upstream = Upstream()
        return self.upstream.run(block.code)

    def subscribe(self, block: Block) -> str:
        import psycopg
        assert self.server is not None and self.server.pg_port, f"{block}: no server with --pg-port runs"
        expected = self.blocks[self.blocks.index(block) + 1]
        assert expected.directive == "output", f"{block}: a subscription is checked against its output block"
        wanted = len(normal(expected.code))
        lines: list[str] = []
        failed: list[BaseException] = []

        def consume(conn):
            try:
                with conn.cursor().copy(block.code.strip().rstrip(";")) as copy:
                    for data in copy:
                        lines.extend(bytes(data).decode().splitlines())
            except psycopg.errors.QueryCanceled:
                pass
            except BaseException as e:  # noqa: BLE001 - reported by the test's thread
                failed.append(e)

        with psycopg.connect(host="127.0.0.1", port=self.server.pg_port, user="ivm", dbname="ivm",
                             autocommit=True, connect_timeout=20) as conn:
            thread = threading.Thread(target=consume, args=(conn,), daemon=True)
            thread.start()
            deadline = time.monotonic() + CONVERGE_SECONDS
            while len(lines) < wanted and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            conn.cancel()
            thread.join(20)
            assert not thread.is_alive(), f"{block}: the subscription did not end when cancelled"
        if failed:
            raise failed[0]
        return "\n".join(lines) + "\n"

    # --- output ---------------------------------------------------------------------------------
    def check_output(self, block: Block) -> None:
        shown = self.previous
        assert shown is not None, f"{block}: an output block follows the block it shows"
        compare = self.compare_subscription if shown.directive == "subscribe" else same_text
        if self.converges(shown):
            deadline = time.monotonic() + CONVERGE_SECONDS
            while time.monotonic() < deadline and not self.output_matches(compare, block):
                time.sleep(0.3)
                try:
                    self.output = self.psql(shown)
                except RuntimeError as e:
                    self.output = str(e)
        assert self.output is not None and compare(self.output, block.code), (
            f"{block}: the output shown is not what {shown} printed:\n{self.output}")

    def output_matches(self, compare, block: Block) -> bool:
        return self.output is not None and compare(self.output, block.code)

    @staticmethod
    def compare_subscription(got: str, shown: str) -> bool:
        def rows(text):
            return sorted(line.split("\t")[1:] for line in normal(text))
        return rows(got) == rows(shown)


# --- the tests ------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES)
def test_every_block_of_the_page_runs_and_shows_its_output(page, tmp_path):
    state = Page(page, tmp_path)
    try:
        for block in blocks(page):
            assert block.language in LANGUAGES, f"{block}: say the language (one of {sorted(LANGUAGES)})"
            if block.directive == "skip":
                continue
            if block.language == "text" and block.directive != "output":
                continue
            state.run(block)
    finally:
        state.close()


def test_skips_are_counted_and_give_a_reason():
    counted = {}
    for page in PAGES:
        for block in blocks(page):
            if block.directive == "skip":
                assert block.argument and block.argument.startswith("("), f"{block}: skip (why)"
                counted[page] = counted.get(page, 0) + 1
    assert counted == SKIPS, "a block marked skip is a decision: count it in SKIPS"


def test_directives_are_known_and_stand_right_before_a_block():
    known = {"skip", "output", "server", "psql", "upstream", "subscribe", "error"}
    for page in PAGES:
        lines = (ROOT / page).read_text().split("\n")
        for number, line in enumerate(lines):
            marker = DIRECTIVE.fullmatch(line.strip())
            if line.strip().startswith("<!-- docs-test"):
                assert marker and marker[1] in known, f"{page}:{number + 1}: unknown directive {line.strip()}"
                assert number + 1 < len(lines) and FENCE.match(lines[number + 1]), (
                    f"{page}:{number + 1}: a directive stands on the line just before a code block")


def test_user_docs_name_no_source_files_or_tests():
    source = re.compile(r"\b(?:ivm|sql_frontend|delta_operators|storage|flight_server|tests|bench)/[\w/]*\w\.py\b"
                        r"|\btest_\w+|\btests/")
    for page in PAGES:
        if page in CONTRIBUTOR_PAGES:
            continue
        for number, line in enumerate((ROOT / page).read_text().split("\n"), 1):
            assert not source.search(line), f"{page}:{number}: user docs name no source files or tests: {line}"


def anchors(path: Path) -> set[str]:
    """The fragments GitHub gives a page's headings."""
    found = set()
    for line in path.read_text().split("\n"):
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_links_between_pages_resolve():
    link = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")
    for page in PAGES:
        for target, fragment in link.findall((ROOT / page).read_text()):
            if target.startswith("http"):
                continue
            path = (ROOT / page).parent.joinpath(target).resolve() if target else ROOT / page
            assert path.exists(), f"{page}: broken link {target}"
            if fragment and path.suffix == ".md":
                assert fragment in anchors(path), f"{page}: {target}#{fragment}: no such heading"


def test_the_readme_opens_with_the_two_commands_ci_runs():
    first = blocks("README.md")[0]
    assert [line.split("#")[0].strip() for line in first.code.strip().split("\n")] == ["./dev start", "./dev test"]
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("exec ./dev test")
