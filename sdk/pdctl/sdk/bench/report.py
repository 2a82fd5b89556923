"""Benchmark outputs: JSON (one record per cell), CSV, and PNG plots like the published
figures (TTFT and TPOT against request rate, one line per mode, one panel per input
length). matplotlib is imported only to plot (the ``bench`` extra)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pdctl.sdk.bench.plan import BenchPlan

CSV_FIELDS = (
    "mode",
    "input_len",
    "output_len",
    "request_rate",
    "num_prompts",
    "completed",
    "failed",
    "mismatched",
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
    "goodput",
    "kv_bytes_moved",
    "median_kv_xfer_ms",
    "registration_first_ratio",
    "policy",
    "prefill_prefix_hit_rate",
    "fleet_prefix_hit_rate",
    "decode_alone_share",
)


def write_json(
    path: Path, plan: BenchPlan, records: Sequence[dict[str, Any]], meta: dict[str, Any]
) -> None:
    doc = {"plan": plan.as_dict(), "meta": meta, "results": list(records)}
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")


def write_csv(path: Path, records: Sequence[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow({k: _cell(r.get(k)) for k in CSV_FIELDS})


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else v


def _rate(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.inf


def compares_policies(records: Sequence[dict[str, Any]]) -> bool:
    """Whether the records compare router policies (the shared-prefix preset)."""
    return len({r.get("policy") for r in records}) > 1


def arm_of(records: Sequence[dict[str, Any]]) -> Callable[[dict[str, Any]], str]:
    """A record's arm: its mode, or its mode and router policy when the records compare
    policies."""
    if compares_policies(records):
        return lambda r: f"{r['mode']}/{r.get('policy')}"
    return lambda r: str(r["mode"])


def _bars(ax: Any, cells: Sequence[dict[str, Any]], arms: list[str], arm: Any, metric: str) -> None:
    """One bar per arm: the median, with the p99 as a whisker."""
    xs, med, hi = [], [], []
    for i, a in enumerate(arms):
        r = next((c for c in cells if arm(c) == a), None)
        m = r.get(f"median_{metric}_ms") if r else None
        if r is None or m is None:
            continue
        p99 = r.get(f"p99_{metric}_ms")
        xs.append(i)
        med.append(float(m))
        hi.append(max(0.0, float(p99) - float(m)) if p99 is not None else 0.0)
    ax.bar(xs, med, yerr=[[0.0] * len(hi), hi], capsize=3, color="tab:blue", alpha=0.8)
    ax.set_xticks(range(len(arms)), arms, rotation=15, fontsize="small")
    ax.grid(alpha=0.3, axis="y")


def plot(path: Path, records: Sequence[dict[str, Any]], title: str = "") -> Path | None:
    """TTFT (top row) and TPOT (bottom row) medians with p99 whiskers against the
    request rate; one panel per input length, one line per arm (a mode, or a mode and a
    router policy when the records compare policies). Cells without a finite rate (all
    at once, or a closed loop) are bars, one per arm. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    lens = sorted({int(r["input_len"]) for r in records})
    arm = arm_of(records)
    arms = list(dict.fromkeys(arm(r) for r in records))
    fig, axes = plt.subplots(
        2, max(1, len(lens)), figsize=(4.2 * max(1, len(lens)), 6.4), squeeze=False
    )
    for col, n in enumerate(lens):
        for row, (metric, label) in enumerate((("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"))):
            ax = axes[row][col]
            cells = [r for r in records if int(r["input_len"]) == n]
            if not any(math.isfinite(_rate(r["request_rate"])) for r in cells):
                _bars(ax, cells, arms, arm, metric)
                ax.set_ylabel(label)
                if row == 0:
                    ax.set_title(f"input {n} tokens")
                continue
            for mode in arms:
                pts = sorted(
                    (
                        (
                            _rate(r["request_rate"]),
                            r.get(f"median_{metric}_ms"),
                            r.get(f"p99_{metric}_ms"),
                        )
                        for r in records
                        if arm(r) == mode and int(r["input_len"]) == n
                    ),
                    key=lambda p: p[0],
                )
                xs = [p[0] for p in pts if p[1] is not None and math.isfinite(p[0])]
                med = [float(p[1]) for p in pts if p[1] is not None and math.isfinite(p[0])]
                top = [
                    float(p[2]) if p[2] is not None else float(p[1])
                    for p in pts
                    if p[1] is not None and math.isfinite(p[0])
                ]
                if not xs:
                    continue
                hi = [max(0.0, t - m) for t, m in zip(top, med, strict=True)]
                ax.errorbar(xs, med, yerr=[[0.0] * len(hi), hi], marker="o", capsize=3, label=mode)
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(label)
            if row == 0:
                ax.set_title(f"input {n} tokens")
            ax.grid(alpha=0.3)
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(loc="best", fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
