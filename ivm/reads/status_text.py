"""``ivm status`` for people: the status facts as text that fits a terminal (80 columns).

One formatter for both ways of getting the facts: ``db.status()`` of a
database opened here (``ivm status --data``) and ``SHOW STATUS`` of a
running server (``ivm status --connect``, whose rows are the relations and
whose schema metadata ``ivm.status`` holds the rest; see ivm/reads/status.py).
``--json`` prints the facts themselves, for scripts.

Durations read ``1.2 s``, sizes ``12.3 MiB``, moments ``3 s ago``; a
failure's whole message is printed below the table it would not fit in.
"""

from __future__ import annotations

import textwrap
import time
from typing import Any

from ivm.cli.text_table import ago, cut, duration, render, size

WIDTH = 80


def _kind(kind: str) -> str:
    """Short names for the kinds of SHOW STATUS, so the table fits."""
    if kind == "materialized view":
        return "view"
    if kind.startswith("materialized view (computed on read)"):
        return "on-read view"
    if kind == "view state":
        return "state"
    if kind.startswith("watermark of "):
        return "watermark"
    if kind.startswith("on-time rows of "):
        return "on-time rows"
    return kind


def _lag(changes: int | None, seconds: float | None) -> str:
    if not changes:
        return "0"
    return f"{changes} ({duration(seconds)})"


def _pairs(width: int, pairs: list[tuple[str, str]]) -> list[str]:
    """``label  value`` lines, labels aligned, values cut to the width."""
    pairs = [(label, value) for label, value in pairs if value]
    if not pairs:
        return []
    label_width = max(len(label) for label, _ in pairs)
    return [cut(f"{label.ljust(label_width)}  {value}", width) for label, value in pairs]


def _failures(title: str, failed: list[tuple[str, str]], width: int) -> list[str]:
    lines = []
    for name, message in failed:
        lines += textwrap.wrap(f"{title} {name}: {message}", width, subsequent_indent="    ") or [name]
    return lines


def status_lines(facts: dict[str, Any], *, width: int = WIDTH, now: float | None = None) -> list[str]:
    """The status facts as lines of at most ``width`` characters."""
    now = time.time() if now is None else now
    lines: list[str] = []
    if "relations" in facts:
        lines += _overview(facts, width)
        lines += ["", *_relations(facts["relations"], width)]
        views = facts.get("maintenance", {}).get("views", {})
        if views:
            lines += ["", *_views(views, facts["relations"], width)]
        if facts.get("backfills"):
            lines += ["", *_backfills(facts["backfills"], width)]
    if facts.get("sources"):
        lines += ["", *_sources(facts["sources"], width, now)]
    elif "relations" not in facts:  # only the sources were asked for (the database is open elsewhere)
        lines.append("no sources (CREATE SOURCE, ivm replicate)")
    return lines[1:] if lines and lines[0] == "" else lines


def _overview(facts: dict, width: int) -> list[str]:
    where = facts.get("path") or "in memory"
    offsets = [f"log head {facts['log_head']}", f"published {facts['published_offset']}"]
    if facts.get("stored_offset") is not None:
        offsets.append(f"stored {facts['stored_offset']}")
    if facts.get("durable_offset") is not None:
        offsets.append(f"on disk {facts['durable_offset']}")
    log = ""
    if "log_segments" in facts:
        segments = facts["log_segments"]
        log = f"{segments} segment{'s' if segments != 1 else ''}, {size(facts.get('log_bytes'))}"
        if facts.get("log_truncations"):
            log += f"; {len(facts['log_truncations'])} torn tail(s) repaired at open"
    checkpoints = ""
    if "checkpoints" in facts:
        checkpoints = f"{facts['checkpoints']}, the last took {duration(facts.get('last_checkpoint_seconds'))}"
        if facts.get("checkpoint_error"):
            checkpoints += f"; FAILING: {facts['checkpoint_error']}"
    recovery = ""
    if facts.get("recovered_records") is not None:
        recovery = (f"{facts['recovered_records']} log records replayed in "
                    f"{duration(facts.get('recovery_seconds'))}")
    memory = facts.get("memory") or {}
    spill = facts.get("spill") or {}
    held = ""
    if memory:
        held = f"relations {size(memory.get('relation_bytes'))}, Arrow {size(memory.get('arrow_allocated_bytes'))}"
        if spill.get("bytes"):
            held += f", spilled to disk {size(spill['bytes'])}"
    steps = facts.get("steps") or {}
    step_text = ", ".join(f"{count} {path}" for path, count in steps.items() if count)
    maintenance = (facts.get("maintenance") or {}).get("mode")
    return _pairs(width, [
        ("database", where), ("engine", facts.get("engine") or ""), ("maintenance", maintenance or ""),
        ("offsets", ", ".join(offsets)), ("log", log), ("checkpoints", checkpoints), ("recovery", recovery),
        ("memory", held), ("query steps", step_text),
    ])


def _relations(relations: list[dict], width: int) -> list[str]:
    if not relations:
        return ["no tables or views yet"]
    rows, view = [], None
    for r in relations:
        name = r["name"]
        if r["kind"] == "view state" and view is not None and name.startswith(view + "."):
            name = "  " + name[len(view):]  # a view's states follow it: ".agg3" under "region_sales"
        elif r["kind"].startswith("materialized view"):
            view = r["name"]
        rows.append([name, _kind(r["kind"]), r["rows"], r.get("buffer_rows") or 0,
                     _lag(r.get("lag_changes"), r.get("lag_seconds")), size(r.get("stored_bytes")),
                     size(r.get("memory_bytes")), "ok" if r["status"] == "ok" else "FAILED"])
    # queued: changed rows acknowledged, not yet in the views; lag: changes not yet checkpointed (their age)
    lines = render(["name", "kind", "rows", "queued", "lag", "stored", "memory", "status"], rows,
                   width=width, right=[False, False, True, True, True, True, True, False], null="")
    watermarks = [(r["name"], r["watermark"]) for r in relations if r.get("watermark")]
    lines += [cut(f"watermark of {name}: {mark}", width) for name, mark in watermarks]
    failed = [(r["name"], r["status"].removeprefix("failed: ")) for r in relations if r["status"] != "ok"]
    return lines + _failures("failed:", failed, width)


def _views(views: dict[str, dict], relations: list[dict], width: int) -> list[str]:
    engines = {r["name"]: r.get("engine") for r in relations}
    rows = []
    for name, facts in views.items():
        batches = facts.get("batches") or {}
        seconds = facts.get("seconds") or {}
        counted = ", ".join(f"{n} {path} ({duration(seconds.get(path))})" if n else f"0 {path}"
                            for path, n in batches.items())
        rows.append([name, facts.get("last") or "not yet", counted, engines.get(name) or ""])
    return render(["view", "last batch", "batches maintained (time)", "engine"], rows, width=width,
                  right=[False] * 4)


def _backfills(backfills: dict[str, dict], width: int) -> list[str]:
    rows = [[name, entry.get("engine", ""), f"{entry.get('step')}/{entry.get('steps')}",
             duration(entry.get("seconds"))] for name, entry in backfills.items()]
    return render(["computing", "engine", "step", "for"], rows, width=width, right=[False, False, True, True])


def _sources(sources: list[dict], width: int, now: float) -> list[str]:
    rows = []
    for s in sources:
        lag = size(s.get("lag_bytes")) if s.get("lag_bytes") is not None else ""
        if s.get("lag_seconds") is not None:
            lag = f"{lag}, {duration(s['lag_seconds'])}" if lag else duration(s["lag_seconds"])
        rows.append([s["name"], s.get("phase") or "", s.get("confirmed_lsn") or "", lag, s.get("rows"),
                     ago(s.get("updated"), now), "ok" if s.get("status") == "ok" else "FAILED"])
    lines = render(["source", "phase", "confirmed LSN", "lag", "rows", "updated", "status"], rows, width=width,
                   right=[False, False, False, True, True, False, False])
    failed = [(s["name"], s["status"].removeprefix("failed: ")) for s in sources if s.get("status") != "ok"]
    return lines + _failures("source failed:", failed, width)
