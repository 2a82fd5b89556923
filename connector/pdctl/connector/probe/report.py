"""A probe run's figures from its closed requests (pure)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pdctl.connector.probe.plan import Geometry, block_runs

if TYPE_CHECKING:
    from pdctl.connector.probe.records import ProbeConfig, ProbeRequest


def percentiles_ms(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "mean": None, "max": None}
    a = np.asarray(values) * 1e3
    return {
        "p50": round(float(np.percentile(a, 50)), 3),
        "p99": round(float(np.percentile(a, 99)), 3),
        "mean": round(float(a.mean()), 3),
        "max": round(float(a.max()), 3),
    }


def descriptor_counts(geo: Geometry, src: Sequence[int], dst: Sequence[int]) -> tuple[int, int]:
    """Descriptors of one rank's WRITE: (contiguous runs merged, one per block)."""
    return len(block_runs(src, dst, merge=True)) * geo.regions, len(src) * geo.regions


def ucx_environment() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("UCX_")}


def summarize(
    cfg: ProbeConfig,
    closed: Sequence[ProbeRequest],
    window_s: float | None,
    notes: Sequence[str],
    target: dict[str, Any],
) -> dict[str, Any]:
    geo = cfg.geometry
    measured = [r for r in closed if not r.warmup]
    good = [r for r in measured if not r.errors]
    per_request = geo.request_bytes * cfg.tp
    xfer = [max(d.xfer_s for d in r.done.values()) for r in good]
    post = [max(d.post_s for d in r.done.values()) for r in good]
    recv = [float(r.received["elapsed_s"]) for r in good if r.received]
    counts = [descriptor_counts(geo, r.blocks, r.dst_blocks) for r in good if r.dst_blocks]
    nixl = [d.nixl_descs for r in good for d in r.done.values() if d.nixl_descs is not None]
    firsts = [d.first for r in good for d in r.done.values()]
    checked = [r for r in closed if r.verify and not r.errors]
    bad = [r.target_id for r in checked if not _checksums_match(r)]
    total = per_request * len(good)
    errors = [f"{r.target_id}: {'; '.join(r.errors)}" for r in closed if r.errors]
    return {
        "ok": not errors and not bad and len(good) == cfg.count,
        "config": cfg.as_dict(),
        "bytes_per_request": per_request,
        "requests": {
            "warmup": cfg.warmup,
            "measured": cfg.count,
            "completed": len(good),
            "failed": len(measured) - len(good),
        },
        "gbps": round(total / window_s / 1e9, 3) if window_s and good else None,
        "gbps_per_request_p50": (
            round(per_request / float(np.median(xfer)) / 1e9, 3) if xfer else None
        ),
        "transfer_ms": percentiles_ms(xfer),
        "post_ms": percentiles_ms(post),
        "receive_ms": percentiles_ms(recv),
        "descriptors": {
            "merged": _median([c[0] for c in counts]),
            "unmerged": _median([c[1] for c in counts]),
            "posted": _median([r.done[0].descs for r in good if 0 in r.done]),
            "nixl_reported": _median(nixl),
            "per": "request and rank",
        },
        "arrival": {
            "registration_first": firsts.count("registration"),
            "finished_first": firsts.count("finished"),
        },
        "integrity": {
            "checked": len(checked),
            "matched": len(checked) - len(bad),
            "mismatched": bad,
        },
        "ucx": {"env": ucx_environment(), "transports": None},
        "target": target,
        "errors": errors,
        "notes": list(dict.fromkeys(notes))[:20],
    }


def _median(values: Sequence[int]) -> int | None:
    return int(np.median(values)) if values else None


def _checksums_match(r: ProbeRequest) -> bool:
    if r.received is None:
        return False
    crc = r.received.get("crc") or []
    sent = [r.done[k].checksum for k in sorted(r.done)]
    return len(crc) == len(sent) and all(a == b for a, b in zip(crc, sent, strict=True))
