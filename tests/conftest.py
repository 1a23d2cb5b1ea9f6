"""Test configuration shared by every suite.

Hypothesis profiles bound the randomized suites: ``ci`` (default) keeps the
whole run well under CI's budget, ``thorough`` (HYPOTHESIS_PROFILE=thorough)
explores much more for local soak runs.

Every suite runs in shadow mode (IVM_SHADOW=1, ivm/execute/executor.py): each
compiled step also runs on DuckDB and any difference in rows or types fails
the test, so the oracle suites check the compiled operators against DuckDB.
IVM_SHADOW=0 in the environment turns it off.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
settings.register_profile(
    "thorough",
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
os.environ.setdefault("IVM_SHADOW", "1")  # inherited by the subprocesses tests start


@pytest.fixture
def lookups_run(monkeypatch):
    """Every lookup step a maintenance run ran, with the rows it returned: [(Lookup, rows)]."""
    from ivm.execute import executor

    seen: list = []
    lookup = executor.StepRunner._lookup

    def recorded(self, step, temps, snapshot):  # noqa: ANN001, ANN202
        result = lookup(self, step, temps, snapshot)
        seen.append((step, result.num_rows))
        return result

    monkeypatch.setattr(executor.StepRunner, "_lookup", recorded)
    return seen


# One SparkSession for the whole test session (Spark allows one per process):
# two local cores and two shuffle partitions keep the Spark suites small.
SPARK_TEST_CONF = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
}


@pytest.fixture(scope="session")
def spark_conf():
    """Settings for ``ivm.connect(engine="spark", spark_conf=...)``; starts the session once."""
    from ivm.execute.spark.session import session

    session(SPARK_TEST_CONF)
    return dict(SPARK_TEST_CONF)


def _uses_module_fixture(item) -> bool:
    fixtures = getattr(item, "_fixtureinfo", None)
    if fixtures is None:
        return False
    return any(d.scope in ("module", "package") for defs in fixtures.name2fixturedefs.values() for d in defs)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the markers into groups
def pytest_collection_modifyitems(config, items):
    """Schedule for two xdist workers: Spark tests in one group, long modules first.

    ``./dev test`` runs two workers with ``--dist loadgroup``. Every Spark
    test is in one group, so the suite starts one SparkSession. A module
    whose tests share a module-scoped fixture (a server, a loaded database)
    is one group: the fixture is built once, and its tests run in file
    order on one worker. Modules
    holding ``slow`` tests go first (each module's own order is kept, so its
    fixtures are built once), so the run does not end with one worker busy
    on a long test while the other idles. Without xdist both are harmless.
    """
    for item in items:
        if "spark" in item.nodeid.lower():
            item.add_marker(pytest.mark.xdist_group("spark"))
        elif _uses_module_fixture(item):  # a server, a stream, a database: built once
            item.add_marker(pytest.mark.xdist_group(f"module:{item.nodeid.split('::')[0]}"))
    slow_modules = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_modules)  # stable: order within a module kept


def pytest_collection_finish(session):
    """Fail the run when ``--dist loadgroup`` did not turn the groups above into node ids.

    pytest-xdist tags each grouped test's node id with ``@group`` in its own
    collection hook; with a pytest it does not know (9.x keeps node ids
    elsewhere) the tags are silently lost, every group is split across the
    workers, and shared fixtures (a SparkSession, a server, the TPC-H stream)
    are built once per worker. That went unnoticed for a whole session.
    """
    if not getattr(session.config.option, "loadgroup", False):
        return  # not an xdist worker scheduling by group
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest-xdist did not apply --dist loadgroup groups (e.g. {lost[0]}); "
                                "use a pytest version it supports (see pyproject.toml)")


def pytest_terminal_summary(terminalreporter):
    """Report how many SIGKILLs the crash harness (tests/crash) delivered, and where.

    Each crash test records its kills in its report's ``user_properties``,
    which xdist carries from the workers to the controller (this hook lives
    here, not in tests/crash/conftest.py, because the controller only loads
    this conftest).
    """
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
