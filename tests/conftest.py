"""Test configuration shared by every suite.

Hypothesis profiles bound the randomized suites: ``ci`` (default) keeps the
whole run well under CI's budget, ``thorough`` (HYPOTHESIS_PROFILE=thorough)
explores much more for local soak runs.
"""

from __future__ import annotations

import os

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
    from ivm.spark.session import session

    session(SPARK_TEST_CONF)
    return dict(SPARK_TEST_CONF)


def pytest_collection_modifyitems(config, items):
    """Put every Spark test in one xdist group, so the suite starts one SparkSession.

    ``./dev test`` runs two workers with ``--dist loadgroup``; without xdist
    the mark is inert.
    """
    for item in items:
        if "spark" in item.nodeid.lower():
            item.add_marker(pytest.mark.xdist_group("spark"))
