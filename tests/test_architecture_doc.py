"""ARCHITECTURE.md stays true: every folder it names exists, every entry function it names resolves
to the code, and every stage package under ivm/ is in it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "ARCHITECTURE.md").read_text()

# The entry points the page names, as written there -> where they live.
ENTRIES = {
    "planner.plan_view": "sql_frontend.planner.plan_view",
    "compiler.compile_view": "delta_operators.compiler.compile_view",
    "define_view": "ivm.view_definition.define_view",
    "Engine.ingest": "ivm.engine.Engine.ingest",
    "group_commit.take_and_commit": "ivm.ingest.group_commit.take_and_commit",
    "changes.ChangeApplier.apply": "ivm.ingest.changes.ChangeApplier.apply",
    "Engine.maintain_and_publish": "ivm.engine.Engine.maintain_and_publish",
    "executor.StepRunner.run": "ivm.execute.executor.StepRunner.run",
    "Relation.replace_rows": "storage.relation.Relation.replace_rows",
    "Engine.publish": "ivm.engine.Engine.publish",
    "reads.Reader.query": "ivm.reads.reads.Reader.query",
    "DurableEngine.ingest": "ivm.durable.durable.DurableEngine.ingest",
    "Maintainer.fold": "ivm.durable.maintainer.Maintainer.fold",
    "main: ivm serve": "ivm.cli.main",
}


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            value = getattr(value, name)
        return value
    raise ModuleNotFoundError(dotted)


def test_every_entry_point_named_is_in_the_code():
    for written, dotted in ENTRIES.items():
        assert written in TEXT, f"ARCHITECTURE.md no longer names {written}"
        assert callable(_resolve(dotted)), dotted


def test_every_folder_named_exists_and_every_stage_package_is_named():
    folders = set(re.findall(r"(?<![\w./])((?:ivm|storage|sql_frontend|delta_operators|flight_server)/[\w/]*(?:\.py)?)", TEXT))
    assert "ivm/ingest/" in folders and "storage/" in folders
    for folder in folders:
        assert (ROOT / folder).exists(), f"ARCHITECTURE.md names {folder}, which does not exist"
    packages = {p.parent.name for p in (ROOT / "ivm").glob("*/__init__.py")}
    for package in packages:
        assert f"ivm/{package}/" in TEXT, f"ivm/{package}/ is not on the page"
