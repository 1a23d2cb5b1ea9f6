"""Report how many SIGKILLs the crash harness delivered in this run, and where."""

from __future__ import annotations

from tests.crash.harness import KILLS


def pytest_terminal_summary(terminalreporter):
    if KILLS:
        where = ", ".join(f"{moment}: {n}" for moment, n in sorted(KILLS.items()))
        terminalreporter.write_line(f"crash harness: {sum(KILLS.values())} SIGKILLs, each reopen verified ({where})")
