"""KV transfer through the probe's push engine vs the memory-copy ceiling, one run.

Side by side on this machine, the same bytes per request:

* ``memcpy``: one in-process copy between two pre-touched host buffers (the physical
  ceiling for DRAM -> DRAM on one host);
* ``merged``: ``python -m pdctl.connector.probe`` (two processes, NIXL WRITE + completion
  notification) with contiguous blocks merged into one descriptor per region;
* ``unmerged``: the same with one descriptor per block (fragmented KV: 16 KiB blocks).

GB/s is per request (bytes / WRITE time, median over the measured requests: warm-up
excluded, pools pre-touched, checksums only on warm-up requests); the probe's throughput
over its whole window (control round trips included) is printed alongside. Goals:
merged >= 1.3x unmerged; memcpy / merged <= 3.

    python benchmarks/transfer.py [--mib 64] [--block-kib 16] [--count 10] [--json FILE]

``--sync-modes none,strict`` instead compares NIXL agent thread-sync modes on the merged
and unmerged paths in one run (arms interleaved ``--repeat`` times, medians compared):
what ``NIXL_THREAD_SYNC_STRICT`` — pdctl's connector's mode without a progress thread —
costs on the bare transfer path.

    python benchmarks/transfer.py --sync-modes none,strict [--repeat 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def memcpy_gbps(nbytes: int, reps: int) -> float:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)  # np.zeros is lazy: the copies below touch it
    times = []
    for _ in range(reps + 2):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times[2:]) / 1e9


def probe(args: argparse.Namespace, merge: bool, sync_mode: str = "none") -> dict[str, Any]:
    block = args.block_kib * 1024
    tokens = args.mib * (1 << 20) // block  # block size 1 token: one block = block_kib KiB
    argv = [
        sys.executable, "-m", "pdctl.connector.probe",
        "--bytes-per-token", str(block), "--block-size", "1", "--prompt-len", str(tokens),
        "--count", str(args.count), "--warmup", "3", "--timeout", "60",
    ]  # fmt: skip
    if not merge:
        argv.append("--no-merge")
    if sync_mode != "none":
        argv += ["--sync-mode", sync_mode]
    if args.ucx_tls:
        argv += ["--ucx-tls", args.ucx_tls]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    try:
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SystemExit(f"probe failed: {out.stderr.strip()[-500:]}") from None
    if not result.get("ok"):
        raise SystemExit(f"probe failed: {result.get('error') or result.get('errors')}")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="MiB per request (64)")
    ap.add_argument("--block-kib", type=int, default=16, help="KiB per block (16)")
    ap.add_argument("--count", type=int, default=10, help="measured requests per probe (10)")
    ap.add_argument("--ucx-tls", help="UCX_TLS for the probe (default: UCX's choice)")
    ap.add_argument("--json", type=Path, help="write the record here too")
    ap.add_argument("--sync-modes", help="compare NIXL sync modes instead (e.g. none,strict)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs per arm (3)")
    args = ap.parse_args()
    if args.sync_modes:
        return sync_modes(args)
    nbytes = args.mib << 20
    copy = memcpy_gbps(nbytes, reps=7)
    merged = probe(args, merge=True)
    unmerged = probe(args, merge=False)
    m, u = merged["gbps_per_request_p50"], unmerged["gbps_per_request_p50"]
    record = {
        "bytes_per_request": nbytes,
        "block_bytes": args.block_kib * 1024,
        "memcpy_gbps": round(copy, 3),
        "merged": _row(merged),
        "unmerged": _row(unmerged),
        "merged_over_unmerged": round(m / u, 2),
        "memcpy_over_merged": round(copy / m, 2),
        "goals": {
            "merged_over_unmerged>=1.3": m / u >= 1.3,
            "memcpy_over_merged<=3": copy / m <= 3,
        },
        "ucx_transports": merged["ucx"]["transports"],
    }
    print(f"{'path':<10} {'GB/s':>7} {'window GB/s':>12} {'p50 ms':>8} {'p99 ms':>8} {'descs':>6}")
    print(f"{'memcpy':<10} {copy:>7.2f}")
    for name, r in (("merged", merged), ("unmerged", unmerged)):
        row = _row(r)
        print(
            f"{name:<10} {row['gbps']:>7.2f} {row['window_gbps']:>12.2f} "
            f"{row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} {row['descs']:>6}"
        )
    print(
        f"merged / unmerged = {record['merged_over_unmerged']}x (goal >= 1.3); "
        f"memcpy / merged = {record['memcpy_over_merged']}x (goal <= 3); "
        f"UCX: {record['ucx_transports']}"
    )
    print(json.dumps(record))
    if args.json:
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


def sync_modes(args: argparse.Namespace) -> int:
    """Each sync mode on the merged and unmerged paths, arms interleaved; per-request
    GB/s and WRITE p50 (median over the repeats) and each mode's ratio to the first."""
    modes = [m.strip() for m in args.sync_modes.split(",") if m.strip()]
    runs: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for _ in range(args.repeat):
        for merge in (True, False):
            for mode in modes:
                runs.setdefault((mode, merge), []).append(_row(probe(args, merge, mode)))
    record: dict[str, Any] = {"bytes_per_request": args.mib << 20, "repeat": args.repeat}
    print(
        f"{'mode':<8} {'path':<9} {'best GB/s':>10} {'median':>7} {'p50 ms':>7}  "
        f"best vs {modes[0]}  paired ratio (median)"
    )
    for merge in (True, False):
        path = "merged" if merge else "unmerged"
        first = runs[(modes[0], merge)]
        for mode in modes:
            rows = runs[(mode, merge)]
            best = max(r["gbps"] for r in rows)
            # the same repeat's arms ran back to back: their ratio cancels slow drift
            paired = statistics.median(
                r["gbps"] / f["gbps"] for r, f in zip(rows, first, strict=True)
            )
            record[f"{mode}_{path}"] = {
                "best_gbps": round(best, 3),
                "median_gbps": round(statistics.median(r["gbps"] for r in rows), 3),
                "p50_ms_best": round(min(r["p50_ms"] for r in rows), 3),
                "best_over_first": round(best / max(f["gbps"] for f in first), 3),
                "paired_ratio_median": round(paired, 3),
                "runs": rows,
            }
            row = record[f"{mode}_{path}"]
            print(
                f"{mode:<8} {path:<9} {best:>10.2f} {row['median_gbps']:>7.2f} "
                f"{row['p50_ms_best']:>7.2f}  x{row['best_over_first']:<14.3f} x{paired:.3f}"
            )
    print(json.dumps({k: v for k, v in record.items()}))
    if args.json:
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


def _row(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "gbps": r["gbps_per_request_p50"],
        "window_gbps": r["gbps"],
        "p50_ms": r["transfer_ms"]["p50"],
        "p99_ms": r["transfer_ms"]["p99"],
        "descs": r["descriptors"]["posted"],
    }


if __name__ == "__main__":
    sys.exit(main())
