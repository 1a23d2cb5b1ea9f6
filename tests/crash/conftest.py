"""Report how many SIGKILLs the crash harness delivered in this run, and where.

Each crash test records its kills in its report's ``user_properties`` (see
``test_crash._run``), which pytest-xdist carries from the workers to the
controller, so the total is right with or without ``-n``.
"""

from __future__ import annotations

from collections import Counter


def pytest_terminal_summary(terminalreporter):
    kills: Counter = Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", ()):
                if name == "crash_kills":
                    kills.update(value)
    if kills:
        where = ", ".join(f"{moment}: {n}" for moment, n in sorted(kills.items()))
        terminalreporter.write_line(f"crash harness: {sum(kills.values())} SIGKILLs, each reopen verified ({where})")
