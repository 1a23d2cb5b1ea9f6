"""Crash recovery under SIGKILL (issue 4, acceptance 1 and 2).

The suite's kills are planned here, in one place (``PLANS``): 4 in the fast
suite, the rest in the slow one, at random moments (a random delay after the
writer is ready: mostly during ingest, sometimes inside a fold, a checkpoint
or a compaction) and inside each crash hook (storage/hooks.py), which stall
the writer at the named moment so the kill lands there: a log record half
written, a log sync, a fold before it publishes, a checkpoint between its
relation commits and around its manifest, a compaction's rewrite, unlink
and vacuum, and a DDL (a CREATE or DROP of objects whose names no path could
hold) after its catalog change, between its relation commits and around its
manifest. ``test_the_plan_kills_at_least_50_times`` asserts the total and
that every moment is covered; each test asserts that every planned kill
happened and was verified, and tests/conftest.py prints the count of
SIGKILLs the run delivered (``harness.KILLS``). See tests/crash/harness.py
for what each reopen checks.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tests.crash.harness import KILLS, Kill, crash_cycles
from tests.crash.workload import DDL_STEPS, SideFiles

INGEST = ["log.torn_record", "log.before_sync"]
FOLD = ["fold.before_publish"]
CHECKPOINT = ["checkpoint.between_relations", "checkpoint.before_manifest", "checkpoint.after_manifest"]
COMPACTION = ["compact.write", "compact.before_unlink", "compact.vacuum"]
# Inside a DDL (CREATE/DROP of objects with names no path could hold): the catalog changed in memory
# only, a new relation committed, the manifest synced but not renamed, renamed but not acknowledged.
DDL = ["ddl.before_checkpoint", "ddl.between_relations", "ddl.before_manifest", "ddl.after_manifest"]


def _fast() -> list[Kill]:
    return [Kill(delay=0.4), Kill(hook="log.torn_record"), Kill(hook="checkpoint.before_manifest"),
            Kill(hook="ddl.between_relations", ddl_every=2)]


def _ingest_and_maintenance() -> list[Kill]:
    rng = random.Random(2)
    # Ten random moments (each half's database gets five across its growing history) and three
    # kills per ingest hook: the suite's whole plan stays above 50 (each cycle costs ~8 s).
    kills = [Kill(delay=rng.uniform(0.05, 1.5)) for _ in range(10)]
    kills += [Kill(hook="log.torn_record") for _ in range(3)]
    kills += [Kill(hook="log.before_sync") for _ in range(3)]
    kills += [Kill(hook="fold.before_publish") for _ in range(3)]
    rng.shuffle(kills)
    return kills


def _checkpoints() -> list[Kill]:
    kills = [Kill(hook=h) for h in CHECKPOINT for _ in range(3)]
    random.Random(3).shuffle(kills)
    return kills


def _compaction() -> list[Kill]:
    kills = [Kill(hook=h, compact_every=5) for h in ("compact.write", "compact.before_unlink") for _ in range(2)]
    kills += [Kill(hook="compact.vacuum", compact_every=5) for _ in range(2)]
    kills += [Kill(delay=d, compact_every=3) for d in (0.3, 0.6, 0.9, 1.2)]
    random.Random(4).shuffle(kills)
    return kills


def _ddl() -> list[Kill]:
    kills = [Kill(hook=h, ddl_every=2) for h in DDL for _ in range(2)]
    kills += [Kill(delay=d, ddl_every=1) for d in (0.3, 0.8, 1.3)]
    random.Random(5).shuffle(kills)
    return [Kill(delay=0.3, ddl_every=2)] + kills  # the first cycle creates the schema: no hook stalls it


PLANS = {"fast": _fast, "ingest_and_maintenance": _ingest_and_maintenance, "checkpoints": _checkpoints,
         "compaction": _compaction, "ddl": _ddl}


def _run(request, tmp_path, plan: str, seed: int, part: slice = slice(None)) -> list[dict]:
    kills = PLANS[plan]()[part]
    before = KILLS.copy()
    statuses = crash_cycles(tmp_path, kills, seed=seed)
    delivered = KILLS - before
    assert len(statuses) == len(kills)  # every cycle ended in a SIGKILL and a verified reopen
    assert sum(delivered.values()) == len(kills)
    request.node.user_properties.append(("crash_kills", dict(delivered)))  # summed in tests/conftest.py
    return statuses


def test_the_plan_kills_at_least_50_times():
    kills = [kill for plan in PLANS.values() for kill in plan()]
    moments = Counter(kill.hook or "random" for kill in kills)
    assert len(kills) >= 50, moments
    for hook in INGEST + FOLD + CHECKPOINT + COMPACTION + DDL + ["random"]:
        assert moments[hook] >= 1, f"no kill at {hook}: {moments}"
    assert sum(1 for k in kills if k.hook is None and k.compact_every) >= 3  # random moments while compacting
    assert sum(1 for k in kills if k.hook is None and k.ddl_every) >= 3  # random moments amid DDL


def test_a_few_kills(request, tmp_path):
    statuses = _run(request, tmp_path, "fast", seed=1)
    assert any(s["log_truncations"] for s in statuses)  # the torn record was found and cut


@pytest.mark.slow
@pytest.mark.parametrize("half", [0, 1])
def test_kills_during_ingest_and_maintenance(request, tmp_path, half):
    # The longest plan, in two halves on two databases, so two test workers share it.
    kills = PLANS["ingest_and_maintenance"]()
    part = slice(0, len(kills) // 2) if half == 0 else slice(len(kills) // 2, None)
    statuses = _run(request, tmp_path, "ingest_and_maintenance", seed=2 + 10 * half, part=part)
    torn = sum(kill.hook == "log.torn_record" for kill in kills[part])
    assert sum(bool(s["log_truncations"]) for s in statuses) >= torn  # every torn record was found and cut
    assert sum(s["recovered_records"] for s in statuses) > 0  # recovery replayed the log


@pytest.mark.slow
def test_kills_during_checkpoints(request, tmp_path):
    statuses = _run(request, tmp_path, "checkpoints", seed=3)
    assert statuses[-1]["append_commits"] > 0  # checkpoints appended differences under the kills
    # how many reopens recovered relations stored with appended differences (timing decides)
    request.node.user_properties.append(("appended_reopens", sum(bool(s["appended_relations"]) for s in statuses)))


@pytest.mark.slow
def test_kills_during_compaction(request, tmp_path):
    _run(request, tmp_path, "compaction", seed=4)


@pytest.mark.slow
def test_kills_during_ddl(request, tmp_path):
    _run(request, tmp_path, "ddl", seed=5)
    assert SideFiles(tmp_path / "side").read_ddl()[1] >= len(DDL_STEPS)  # a whole cycle of DDL steps ran
