"""``ivm bench nexmark`` end to end on a short stream: it runs every query, checks, writes the report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_nexmark_runs_checks_and_reports(tmp_path):
    script = Path(sys.executable).parent / "ivm"  # the installed command, run from elsewhere
    command = [str(script)] if script.exists() else [sys.executable, "-m", "ivm"]
    run = subprocess.run(
        [*command, "bench", "nexmark", "--events", "30000", "--batch", "10000", "--rate", "2000",
         "--out", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    report = (tmp_path / "report.md").read_text()
    assert "2 batches counted after 1 warm-up" in report
    for name in ("q5", "q7", "q11"):
        row = next(line for line in report.splitlines() if line.startswith(f"| {name} |"))
        assert row.endswith("| incremental 2 | equal |"), row


def test_bench_nexmark_rejects_unknown_queries_and_empty_runs(tmp_path):
    for args, message in ((["--queries", "q5,q99"], "unknown query q99"),
                          (["--events", "1000", "--batch", "1000"], "at least one counted batch")):
        run = subprocess.run([sys.executable, "-m", "ivm", "bench", "nexmark", *args, "--out", str(tmp_path)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode != 0 and message in run.stderr, run.stderr
    assert not (tmp_path / "report.md").exists()
