"""Least-loaded balance with ``router.workers`` = 1 and 2: does splitting the router into
processes that each count only their own requests in flight spread the load as well?

One mock prefill and two mock decodes (``python -m pdctl.sdk.router.mock``; each decode
answers after ``--delay`` seconds, the second one ``--slow`` times slower in the uneven
case), pdctl's router with ``policy = "least_loaded"``, load from ``h2load`` (one
connection per client; the kernel spreads the connections over the workers). Per router
and case, medians over ``--rounds``:

* even case (two equal decodes): while the load runs, the router's merged
  ``/v1/pdctl/state`` is sampled every 50 ms; ``imbalance`` = mean |in flight on the
  first decode - in flight on the second| / mean in flight on both (0: perfectly even);
* uneven case (decode-1 slower): the share of requests sent to the faster decode (from
  the merged ``pdctl_router_pair_requests_total``); least-loaded should favour it.

Ratios: 2 workers over 1 for each. Each worker's in-flight counts are its own (no shared
memory): this measures the error that costs.

    python benchmarks/router_workers_balance.py [--rounds 3] [--duration 5] [--conc 32]
        [--delay 0.02] [--slow 3] [--out router_workers_balance.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from _bench import free_port, write_record
from router_scale import INSTALL_H2LOAD, PROMPT

from pdctl.sdk.spec import FleetSpec


def spec(p: int, d0: int, d1: int, port: int, workers: int) -> FleetSpec:
    return FleetSpec(
        model={"path": "org/m", "served_name": "tiny"},
        fleet={"mode": "push", "platform": "gpu"},
        prefill=[{"http_port": p, "devices": [0]}],
        decode=[{"http_port": d0, "devices": [1]}, {"http_port": d1, "devices": [2]}],
        router={"port": port, "workers": workers, "policy": "least_loaded"},
    )


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        data: bytes = r.read()
        return data


def wait_up(url: str, proc: subprocess.Popen[bytes], limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: exited with {proc.returncode}")
        try:
            if b'"ok"' in get(url + "/health"):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} never became healthy")


def decodes(url: str) -> list[str]:
    """The two decodes' names, in spec order (the first is the fast one)."""
    st = json.loads(get(url + "/v1/pdctl/state"))
    return [i["name"] for i in st["instances"] if i["role"] == "decode"]


def sample_in_flight(url: str, stop: threading.Event, out: list[tuple[int, int]]) -> None:
    names = decodes(url)
    while not stop.is_set():
        try:
            st = json.loads(get(url + "/v1/pdctl/state"))
            by = {i["name"]: int(i["in_flight"]) for i in st["instances"]}
            out.append((by[names[0]], by[names[1]]))
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)


def pair_counts(url: str) -> dict[str, float]:
    counts = dict.fromkeys(decodes(url), 0.0)
    for line in get(url + "/metrics").decode().splitlines():
        if line.startswith("pdctl_router_pair_requests_total{") and 'outcome="ok"' in line:
            for d in counts:
                if f'decode="{d}"' in line:
                    counts[d] += float(line.rsplit(" ", 1)[1])
    return counts


def one_run(args: argparse.Namespace, h2: str, workers: int, slow: float) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="pdctl-balance-"))
    py = [sys.executable, "-m", "pdctl.sdk.router.mock", "--no-record"]
    p, d0, d1, port = free_port(), free_port(), free_port(), free_port()
    procs = [
        subprocess.Popen([*py, "--role", "prefill", "--port", str(p)]),
        subprocess.Popen([*py, "--role", "decode", "--port", str(d0), "--delay", str(args.delay)]),
        subprocess.Popen(
            [*py, "--role", "decode", "--port", str(d1), "--delay", str(args.delay * slow)]
        ),
    ]
    f = tmp / "spec.json"
    f.write_text(spec(p, d0, d1, port, workers).model_dump_json())
    url = f"http://127.0.0.1:{port}"
    body = tmp / "body.json"
    body.write_text(json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 8}))
    router = subprocess.Popen(
        [sys.executable, "-m", "pdctl.sdk.router.server", "--spec-json", str(f)],
        stdout=subprocess.DEVNULL,
    )
    procs.append(router)
    try:
        time.sleep(1.0)
        wait_up(url, router)
        time.sleep(1.0 if workers == 1 else 3.0)  # every worker registered
        samples: list[tuple[int, int]] = []
        stop = threading.Event()
        t = threading.Thread(target=sample_in_flight, args=(url, stop, samples))
        before = pair_counts(url)
        t.start()
        h2argv = [
            h2, "--h1", "-t", "1", "-c", str(args.conc), "-m", "1",
            "-D", f"{int(args.duration * 1000)}ms", "-d", str(body),
            "-H", "Content-Type: application/json", url + "/v1/completions",
        ]  # fmt: skip
        out = subprocess.run(h2argv, capture_output=True, text=True, timeout=120).stdout
        stop.set()
        t.join()
        after = pair_counts(url)
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    shutil.rmtree(tmp, ignore_errors=True)
    done = [after[d] - before[d] for d in after]
    total = sum(done) or 1.0
    busy = [s for s in samples if sum(s) > 0]
    mean_total = statistics.mean(sum(s) for s in busy) if busy else 0.0
    gap = statistics.mean(abs(a - b) for a, b in busy) if busy else 0.0
    failed = "0 failed" not in out
    return {
        "fast_share": round(done[0] / total, 3),
        "imbalance": round(gap / mean_total, 3) if mean_total else None,
        "mean_in_flight": round(mean_total, 2),
        "samples": len(busy),
        "requests": int(total),
        "h2load_errors": failed,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--conc", type=int, default=32)
    ap.add_argument("--delay", type=float, default=0.02, help="decode answer delay, seconds")
    ap.add_argument("--slow", type=float, default=3.0, help="the uneven case's slow decode")
    ap.add_argument("--h2load", default=None)
    ap.add_argument("--out", default="router_workers_balance.json")
    args = ap.parse_args()
    h2 = args.h2load or shutil.which("h2load")
    if not h2:
        print(INSTALL_H2LOAD, file=sys.stderr)
        return 2
    load0 = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    for case, slow in (("even", 1.0), ("uneven", args.slow)):
        for workers in (1, 2):
            runs = [one_run(args, h2, workers, slow) for _ in range(args.rounds)]
            row: dict[str, Any] = {"case": case, "workers": workers}
            for k in ("fast_share", "imbalance", "mean_in_flight", "requests"):
                vals = [r[k] for r in runs if r[k] is not None]
                row[k] = round(statistics.median(vals), 3) if vals else None
            row["runs"] = runs
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)

    def cell(case: str, workers: int, key: str) -> float:
        r = next(r for r in rows if (r["case"], r["workers"]) == (case, workers))
        return float(r[key] or 0.0)

    ratios = {
        "even_imbalance_2_workers_minus_1": round(
            cell("even", 2, "imbalance") - cell("even", 1, "imbalance"), 3
        ),
        "uneven_fast_share_2_workers_over_1": round(
            cell("uneven", 2, "fast_share") / max(cell("uneven", 1, "fast_share"), 1e-9), 3
        ),
    }
    rec: dict[str, Any] = {
        "results": rows,
        "ratios": ratios,
        "setup": {
            **{k: getattr(args, k) for k in ("rounds", "duration", "conc", "delay", "slow")},
            "loadavg_1m_start_end": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "cpus": os.cpu_count(),
        },
    }
    print("load average (1 min) at start and end:", rec["setup"]["loadavg_1m_start_end"])
    print("ratios:", json.dumps(ratios, indent=1))
    write_record(args.out, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
