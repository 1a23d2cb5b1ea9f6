"""The SQL shell of ``ivm sql``: statements in, aligned tables out.

``ivm sql --connect URL`` (a running server, ivm/cli/remote.py) or ``ivm sql
--data DIR`` (a database opened here) with no statements reads them from
stdin. On a terminal: prompts, readline editing and a history kept in
``~/.ivm_history`` (one entry per statement, however many lines it took).
A statement ends at a ``;`` outside strings and comments, so it may span
lines; ``\\q`` or end of input quits (a last statement without ``;`` still
runs), Ctrl-C drops the statement being typed. Results print as an aligned
table (wide cells cut, the terminal's width when there is one) with the row
count and the time taken; an error prints its message and the shell goes
on. From a pipe there are no prompts and no history, and the exit status is
1 when any statement failed.

>>> ends_statement("SELECT 1"), ends_statement("SELECT ';'"), ends_statement("SELECT 1; -- done")
(False, False, True)
>>> ends_statement("SELECT 'it''s;")  # an open string: the ';' is inside it
False
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Callable, TextIO

import sqlglot
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

from ivm.cli.remote import RemoteError, Result
from ivm.cli.text_table import duration, render
from sql_frontend.statements import DIALECT, statement_texts

PROMPT, MORE = "ivm> ", "...> "
HISTORY_FILE = "~/.ivm_history"
HISTORY_LENGTH = 2000
MAX_CELL = 40
_INTERRUPTED = "\x03"  # what _read returns for Ctrl-C at a prompt: the statement being typed is dropped
HELP = ("Statements end with ';' and may span lines. \\q (or Ctrl-D) quits, Ctrl-C drops the statement "
        "being typed.\nTry: SHOW TABLES;  SHOW STATUS;  SHOW SOURCES;")

Execute = Callable[[str], Result]  # raises RemoteError (or ivm.IvmError) with a message for people


def ends_statement(text: str) -> bool:
    """Does ``text`` end with a ';' that ends a statement (not one inside a string or comment)?"""
    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(text)
    except TokenError:  # e.g. a string still open: more lines to come
        return False
    return bool(tokens) and tokens[-1].token_type == TokenType.SEMICOLON


def print_result(result: Result, out: TextIO, width: int | None = None) -> None:
    took = duration(result.seconds)
    if result.tag is not None:
        print(f"{result.tag} ({took})", file=out)
        return
    for line in render(result.columns, result.rows, width=width, max_cell=MAX_CELL):
        print(line, file=out)
    count = len(result.rows)
    print(f"({count} row{'s' if count != 1 else ''}, {took})", file=out)


def run_one(execute: Execute, text: str, out: TextIO, err: TextIO, width: int | None, errors: tuple) -> bool:
    """Run one statement and print its result or its error; True when it succeeded."""
    try:
        result = execute(text)
    except errors as e:
        print(f"ERROR: {e}", file=err)
        return False
    print_result(result, out, width)
    return True


def run_shell(execute: Execute, *, errors: tuple = (RemoteError,), stdin: TextIO | None = None,
              out: TextIO | None = None, err: TextIO | None = None, banner: str | None = None) -> int:
    """Read statements until ``\\q`` or end of input; 0, or 1 when piped input had a failing statement."""
    stdin, out, err = stdin or sys.stdin, out or sys.stdout, err or sys.stderr
    interactive = stdin.isatty() and out.isatty()
    history = _History(Path(os.path.expanduser(HISTORY_FILE))) if interactive else None
    if interactive and banner:
        print(banner, file=out)
    failed = False
    lines: list[str] = []
    try:
        while True:
            line = _read(stdin, PROMPT if not lines else MORE, interactive)
            if line is None:
                break
            if line is _INTERRUPTED:
                lines = []
                continue
            if not lines and line.strip() in ("\\q", "\\quit", "quit", "exit"):
                break
            if not lines and line.strip().startswith("\\"):
                if line.strip() in ("\\?", "\\h", "help"):
                    print(HELP, file=out)
                else:
                    print(f"ERROR: unknown command {line.strip().split()[0]}; \\? for help, \\q to quit", file=err)
                    failed = True
                if history:
                    history.statement(line.strip())
                continue
            if not lines and not line.strip():
                continue
            lines.append(line)
            text = "\n".join(lines)
            if not ends_statement(text):
                continue
            lines = []
            if history:
                history.statement(text)
            width = shutil.get_terminal_size().columns if interactive else None
            for statement in statement_texts(text) or [text]:
                if not run_one(execute, statement, out, err, width, errors):
                    failed = True
        if lines and "".join(lines).strip():  # end of input after a statement without ';': run it
            text = "\n".join(lines)
            if history:
                history.statement(text)
            for statement in statement_texts(text) or [text]:
                if not run_one(execute, statement, out, err, None, errors):
                    failed = True
    finally:
        if history:
            history.save()
    return 1 if failed and not interactive else 0


def _read(stdin: TextIO, prompt: str, interactive: bool) -> str | None:
    """One line without its newline; None at end of input."""
    if interactive:
        try:
            return input(prompt)
        except EOFError:
            print()
            return None
        except KeyboardInterrupt:
            print("^C")
            return _INTERRUPTED
    line = stdin.readline()
    return None if line == "" else line.rstrip("\n")


class _History:
    """readline's history, one entry per statement, kept in a file across sessions."""

    def __init__(self, path: Path):
        self.path = path
        try:
            import readline
        except ImportError:  # a Python without readline: the shell works, without editing or history
            self.readline = None
            return
        self.readline = readline
        readline.set_history_length(HISTORY_LENGTH)
        try:
            readline.read_history_file(path)
        except OSError:  # none yet, or one readline cannot read: start afresh rather than refuse to start
            pass
        self.mark = readline.get_current_history_length()

    def _drop_lines(self) -> None:
        """Forget the lines input() added since the last statement."""
        readline = self.readline
        for position in range(readline.get_current_history_length() - 1, self.mark - 1, -1):
            readline.remove_history_item(position)

    def statement(self, text: str) -> None:
        """The statement on one line, instead of the lines it was typed on."""
        if self.readline is None:
            return
        self._drop_lines()
        self.readline.add_history(" ".join(part.strip() for part in text.splitlines() if part.strip()))
        self.mark = self.readline.get_current_history_length()

    def save(self) -> None:
        if self.readline is None:
            return
        self._drop_lines()  # \q, or a statement dropped with Ctrl-C
        try:
            self.readline.write_history_file(self.path)
        except OSError as e:
            print(f"ivm sql: history not saved to {self.path}: {e.strerror}", file=sys.stderr)
