"""PNG plots of the TPC-H benchmark (matplotlib, no display needed)."""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from bench.tpch_run import ScaleResult  # noqa: E402

IVM, RECOMPUTE = "#1f77b4", "#d62728"


def plot_latency(result: ScaleResult, out: Path) -> str:
    """Per view: ivm median per refresh (whisker to p95) beside DuckDB full recompute; log scale."""
    views = [v for v in result.views.values() if v.ivm]
    labels = [v.label.replace(" (without LIMIT)", "*") for v in views]
    ivm = np.array([statistics.median(v.ivm) * 1000 for v in views])
    p95 = np.array([np.percentile(v.ivm, 95) * 1000 for v in views])
    rec = np.array([statistics.median(v.recompute) * 1000 for v in views])
    y = np.arange(len(views))
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(views) + 1.6))
    ax.barh(y - 0.2, ivm, 0.4, color=IVM, label="ivm: incremental maintenance (median; whisker: p95)",
            xerr=[np.zeros_like(ivm), p95 - ivm], error_kw={"elinewidth": 1, "capsize": 2})
    ax.barh(y + 0.2, rec, 0.4, color=RECOMPUTE, label="DuckDB: full recompute (median)")
    for i, v in enumerate(views):
        factor = rec[i] / ivm[i] if ivm[i] else float("inf")
        runs = sum(v.paths.values())
        chosen = f"  engine recomputed {v.paths['recompute']}/{runs} runs" if v.paths.get("recompute") else ""
        text = f"{factor:.0f}x" if factor >= 10 else f"{factor:.1f}x" if factor >= 1 else f"{factor:.2f}x (slower)"
        ax.text(max(rec[i], p95[i]) * 1.15, y[i], text + chosen, va="center", fontsize=8)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(right=max(rec.max(), p95.max()) * 12)
    ax.set_xlabel("milliseconds per refresh (log scale)")
    ax.set_title(f"TPC-H SF {result.sf:g}: keeping each view fresh after a ~{result.batch}-row refresh\n"
                 "ivm (blue) vs recomputing it (red); label: speedup" + ("; * = without LIMIT" if "*" in "".join(labels) else ""),
                 fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.25)
    fig.tight_layout()
    name = "latency_by_view.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def plot_scaling(results: list[ScaleResult], out: Path) -> str:
    """Cost against the scale factor: ivm nearly flat, recompute growing with the data."""
    sfs = [r.sf for r in results]
    common = set.intersection(*({n for n, v in r.views.items() if v.ivm} for r in results))

    def med(r: ScaleResult, attr: str) -> float:
        return statistics.median(statistics.median(getattr(r.views[n], attr)) for n in common) * 1000

    def total(r: ScaleResult, attr: str) -> float:
        return sum(statistics.median(getattr(r.views[n], attr)) for n in common) * 1000

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(sfs, [med(r, "ivm") for r in results], "o-", color=IVM, label="ivm, median over views")
    left.plot(sfs, [med(r, "recompute") for r in results], "o-", color=RECOMPUTE, label="recompute, median over views")
    left.plot(sfs, [total(r, "ivm") for r in results], "s--", color=IVM, alpha=0.6, label="ivm, all views")
    left.plot(sfs, [total(r, "recompute") for r in results], "s--", color=RECOMPUTE, alpha=0.6,
              label="recompute, all views")
    left.set_title(f"cost per ~{results[0].batch}-row refresh ({len(common)} views)", fontsize=10)
    right.set_title("each view: ivm (blue) and recompute (red)", fontsize=10)
    for name in sorted(common):
        right.plot(sfs, [statistics.median(r.views[name].ivm) * 1000 for r in results], "-", color=IVM, alpha=0.35)
        right.plot(sfs, [statistics.median(r.views[name].recompute) * 1000 for r in results], "-",
                   color=RECOMPUTE, alpha=0.35)
    ideal = [sfs[0] and (s / sfs[0]) * med(results[0], "recompute") for s in sfs]
    left.plot(sfs, ideal, ":", color="gray", label="linear in SF (from the first recompute)")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("TPC-H scale factor (log)")
        ax.set_ylabel("milliseconds (log)")
        ax.set_xticks(sfs, [f"{s:g}" for s in sfs])
        ax.grid(which="both", alpha=0.25)
    left.legend(fontsize=7, loc="best", framealpha=0.9)
    fig.tight_layout()
    name = "scaling.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name
