"""Test configuration shared by every suite.

Hypothesis profiles bound the randomized suites: ``ci`` (default) keeps the
whole run well under CI's budget, ``thorough`` (HYPOTHESIS_PROFILE=thorough)
explores much more for local soak runs.
"""

from __future__ import annotations

import os

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
