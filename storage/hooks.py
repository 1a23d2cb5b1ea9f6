"""Crash-test hook points: named places where a test may stall the process.

The crash harness (tests/crash) kills a writer process with SIGKILL at
chosen moments. Some moments are too short to hit by chance (between the two
halves of a log record, between the relation commits of a checkpoint and its
manifest), so the code calls ``hook(name)`` there. When the environment
variable ``IVM_CRASH_HOOKS`` names the point (``name=seconds,...``), the call
appends the name to the file named by ``IVM_CRASH_MARKS`` (so the test knows
where the writer is) and sleeps. Without the variable a hook is one dict
lookup: nothing happens, in production or in other tests.

``arm(False)`` makes the named hooks pass without a mark or a stall until
``arm(True)``: a crash writer recovers and creates its schema disarmed,
because the harness kills only after the writer says it is ready, and a
stall before then (every checkpoint of a fresh schema passes the
checkpoint hooks) is waiting that no kill can use.
"""

from __future__ import annotations

import os
import time

_HOOKS: dict[str, float] = {}
_ARMED = True
_MARKS = os.environ.get("IVM_CRASH_MARKS")
for _item in filter(None, os.environ.get("IVM_CRASH_HOOKS", "").split(",")):
    _name, _, _seconds = _item.partition("=")
    _HOOKS[_name.strip()] = float(_seconds or 0)


def enabled(name: str) -> bool:
    return name in _HOOKS


def arm(armed: bool) -> None:
    global _ARMED
    _ARMED = armed


def hook(name: str) -> None:
    seconds = _HOOKS.get(name)
    if seconds is None or not _ARMED:
        return
    if _MARKS:
        with open(_MARKS, "a") as marks:
            marks.write(name + "\n")
            marks.flush()
    time.sleep(seconds)
