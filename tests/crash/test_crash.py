"""Crash recovery under SIGKILL (issue 4, acceptance 1 and 2): 50 kills in the slow suites.

See tests/crash/harness.py for what each cycle checks.
"""

from __future__ import annotations

import random

import pytest

from tests.crash.harness import Kill, crash_cycles


def test_a_few_kills(tmp_path):
    kills = [Kill(delay=0.4), Kill(hook="log.torn_record"), Kill(hook="checkpoint.before_manifest")]
    statuses = crash_cycles(tmp_path, kills, seed=1)
    assert any(s["log_truncations"] for s in statuses)  # the torn record was found and cut


@pytest.mark.slow
def test_kills_during_ingest_and_maintenance(tmp_path):
    rng = random.Random(2)
    kills = [Kill(delay=rng.uniform(0.05, 1.5)) for _ in range(16)]
    kills += [Kill(hook="log.torn_record") for _ in range(4)]
    kills += [Kill(hook="log.before_sync") for _ in range(3)]
    kills += [Kill(hook="fold.before_publish") for _ in range(4)]
    rng.shuffle(kills)
    statuses = crash_cycles(tmp_path, kills, seed=2)
    assert sum(bool(s["log_truncations"]) for s in statuses) >= 4
    assert sum(s["recovered_records"] for s in statuses) > 0  # recovery replayed the log


@pytest.mark.slow
def test_kills_during_checkpoints(tmp_path):
    kills = [Kill(hook=h) for h in ("checkpoint.between_relations", "checkpoint.before_manifest",
                                    "checkpoint.after_manifest") for _ in range(4)]
    random.Random(3).shuffle(kills)
    crash_cycles(tmp_path, kills[:11], seed=3)


@pytest.mark.slow
def test_kills_during_compaction(tmp_path):
    kills = [Kill(hook=h, compact_every=5) for h in ("compact.write", "compact.before_unlink") for _ in range(3)]
    kills += [Kill(hook="compact.vacuum", compact_every=5) for _ in range(2)]
    kills += [Kill(delay=d, compact_every=3) for d in (0.3, 0.6, 0.9, 1.2)]
    random.Random(4).shuffle(kills)
    crash_cycles(tmp_path, kills, seed=4)
