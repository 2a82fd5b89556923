"""Router at scale: pdctl's router vs vllm-router (Rust) from c=1 to c=1024, under h2load.

Both routers in P/D push mode in front of pdctl's own mock prefill and decode
(``python -m pdctl.sdk.router.mock``: answers at once, a streamed answer is
``--stream-events`` SSE events), each router pinned to its own core(s) with ``taskset``,
the mocks and the load generator pinned to the others. Load comes from ``h2load``
(nghttp2's C load generator) over HTTP/1.1, one connection per concurrent client:

* req/s, router CPU milliseconds per request (user+system of the router's whole process
  tree, from /proc, read as h2load's measured phase starts and ends: ``--warm-up``
  seconds of load first, so connecting the clients is not measured), p50/p99 latency
  (h2load's per-request log), errors;
* at c = 1, 64, 256, 1024 (``--conc``), not streamed and streamed;
* pdctl with ``router.workers`` = 1 and 2 (``--workers``) when the router has workers;
* vllm-router in the same run when it is installed (``--vllm-router PATH``, or the
  ``PDCTL_BENCH_VLLM_ROUTER`` environment variable, or ``vllm-router`` on PATH). Install
  it apart from pdctl's own environment, e.g.
  ``python -m venv ~/.cache/pdctl/bench-vllm-router &&
  ~/.cache/pdctl/bench-vllm-router/bin/pip install vllm-router==0.1.17``;
* pdctl's admission control is given room for every client (stage limits and queue at
  the highest ``--conc``, in each worker): its defaults shed most of c=1024 with 429 at once, which
  vllm-router, with no admission control, never does;
* every cell is run ``--rounds`` times, the contenders alternating within a round;
  medians of the rounds are reported, with ratios (pdctl / vllm-router per cell, pdctl's
  CPU ms/req at c over c=1, 2 workers over 1).

    python benchmarks/router_scale.py [--rounds 2] [--duration 4] [--warm-up 2]
        [--conc 1,64,256,1024] [--streamed 0,1] [--baseline main] [--vllm-router PATH]
        [--router-cpus 0] [--load-cpus 1] [--workers 1,2] [--out router_scale.json]

h2load is required (``apt-get install nghttp2-client`` on Debian/Ubuntu,
``brew install nghttp2`` on macOS, or ``--h2load PATH``): without it the benchmark says
so and exits 2 rather than measuring a Python load generator instead of the router.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _bench import (
    admission_room,
    build_at,
    free_port,
    pdctl_router_argv,
    vllm_router_argv,
    write_record,
)

TICKS = os.sysconf("SC_CLK_TCK")
PROMPT = "hello there, how are the prefill and decode doing"
INSTALL_H2LOAD = (
    "h2load not found: install it (Debian/Ubuntu: apt-get install -y nghttp2-client; "
    "macOS: brew install nghttp2) or pass --h2load PATH"
)


def tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants (a router with workers is a process tree)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo.extend(int(c) for c in task.read_text().split())
    return out


def cpu_s(pid: int) -> float:
    """User+system CPU seconds of ``pid``'s process tree (all threads)."""
    total = 0.0
    for p in tree_pids(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        f = stat[stat.rfind(")") + 2 :].split()
        total += (int(f[11]) + int(f[12])) / TICKS
    return total


def rss_mb(pid: int) -> float:
    total = 0.0
    for p in tree_pids(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            pass
    return total


@dataclass
class Contender:
    name: str
    url: str
    proc: subprocess.Popen[bytes]


def post(url: str, stream: bool, timeout: float = 5.0) -> int:
    body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "stream": stream})
    req = urllib.request.Request(
        url + "/v1/completions", body.encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()
        return int(r.status)


def wait_up(c: Contender, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if c.proc.poll() is not None:
            raise RuntimeError(f"{c.name} exited with {c.proc.returncode} while starting")
        try:
            if post(c.url, False) == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{c.name} never answered a completion")


def start(argv: list[str], cpus: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["taskset", "-c", cpus, *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )


def baseline_env(ref: str, tmp: Path) -> dict[str, str]:
    """An environment whose ``pdctl`` is this repository's sources at git ``ref`` (the
    router as it was, measured in the same run as the router as it is)."""
    root = Path(__file__).resolve().parent.parent
    ours = {str(root / part) for part in ("sdk", "tui", "connector")}
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in ours]
    paths = build_at(ref, tmp / "baseline") + rest
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def has_workers() -> bool:
    from pdctl.sdk.spec import RouterSpec

    return "workers" in RouterSpec.model_fields


_FINISHED = re.compile(r"finished in ([\d.]+)m?s, ([\d.]+) req/s")
_REQUESTS = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed"
)
_STATUS = re.compile(r"status codes: (\d+) 2xx")


def h2load(
    binary: str,
    url: str,
    conc: int,
    body: Path,
    cpus: str,
    log: Path,
    pid: int,
    *,
    duration_s: float,
    warm_s: float,
) -> dict[str, Any]:
    """One h2load run: ``warm_s`` seconds of warm-up (every client connected and sending;
    not counted), then ``duration_s`` measured. The router's CPU is read when h2load says
    the measured phase starts and ends, so connecting c clients is in neither the
    request counts nor the CPU; returns req/s, counts, CPU ms/req, p50/p99 latency."""
    log.unlink(missing_ok=True)
    argv = [
        "taskset", "-c", cpus, binary, "--h1", "-t", "1", "-c", str(conc), "-m", "1",
        "-D", f"{int(duration_s * 1000)}ms", "--warm-up-time", f"{int(warm_s * 1000)}ms",
        "-d", str(body), "-H", "Content-Type: application/json", f"--log-file={log}",
        url + "/v1/completions",
    ]  # fmt: skip
    unbuffered = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
    proc = subprocess.Popen(
        [*unbuffered, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    c0 = c1 = None
    try:
        for line in proc.stdout:
            lines.append(line)
            if "Main benchmark duration is started" in line:
                c0 = cpu_s(pid)
            elif "Main benchmark duration is over" in line:
                c1 = cpu_s(pid)
        err = proc.stderr.read() if proc.stderr is not None else ""
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines)
    fin, req = _FINISHED.search(out), _REQUESTS.search(out)
    if fin is None or req is None or c0 is None or c1 is None:
        raise RuntimeError(f"h2load gave no summary or phases:\n{out[-2000:]}{err[-2000:]}")
    lat = sorted(int(line.split("\t")[2]) for line in log.read_text().splitlines() if line)
    done = int(req.group(3))
    return {
        "rps": float(fin.group(2)),
        "done": done,
        "errors": int(req.group(5)),  # refused, reset or not 2xx (not: in flight at the end)
        "cpu_ms_per_req": (c1 - c0) * 1000 / max(done, 1),
        "p50_ms": lat[len(lat) // 2] / 1000 if lat else float("nan"),
        "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] / 1000 if lat else float("nan"),
        "logged": len(lat),
    }


def start_contenders(
    args: argparse.Namespace, p: str, d: str, vr: str | None, tmp: Path
) -> list[Contender]:
    out: list[Contender] = []
    for n in args.worker_counts:
        port = free_port()
        extra = (
            {**admission_room(max(args.conc_list), n), "workers": n}
            if has_workers()
            else admission_room(max(args.conc_list))
        )
        cpus = args.router_cpus if n == 1 else ",".join(str(c) for c in range(n))
        argv = pdctl_router_argv(p, d, port, tmp, extra)
        name = "pdctl" if n == 1 else f"pdctl-w{n}"
        out.append(Contender(name, f"http://127.0.0.1:{port}", start(argv, cpus)))
    if args.baseline:
        port = free_port()
        argv = pdctl_router_argv(p, d, port, tmp, admission_room(max(args.conc_list)))
        env = baseline_env(args.baseline, tmp)
        url = f"http://127.0.0.1:{port}"
        out.append(Contender(f"pdctl@{args.baseline}", url, start(argv, args.router_cpus, env)))
    if vr:
        port = free_port()
        argv = vllm_router_argv(vr, p, d, port)
        out.append(
            Contender("vllm-router", f"http://127.0.0.1:{port}", start(argv, args.router_cpus))
        )
    return out


def run(args: argparse.Namespace, h2: str, vr: str | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="pdctl-scale-"))
    py = [sys.executable, "-m", "pdctl.sdk.router.mock", "--no-record"]
    pport, dport = free_port(), free_port()
    mocks = [
        start([*py, "--role", "prefill", "--port", str(pport)], args.load_cpus),
        start(
            [*py, "--role", "decode", "--port", str(dport), "--chunks", str(args.stream_events)],
            args.load_cpus,
        ),
    ]
    p, d = f"http://127.0.0.1:{pport}", f"http://127.0.0.1:{dport}"
    bodies = {}
    for stream in (False, True):
        f = tmp / f"body-{stream}.json"
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "stream": stream}
        f.write_text(json.dumps(body))
        bodies[stream] = f
    contenders: list[Contender] = []
    results: list[dict[str, Any]] = []
    try:
        time.sleep(1.0)
        contenders = start_contenders(args, p, d, vr, tmp)
        for c in contenders:
            wait_up(c)
            for stream in (False, True):  # warm-up (vllm-router learns the prefill here)
                h2load(
                    h2, c.url, 64, bodies[stream], args.load_cpus, tmp / "warm.log",
                    c.proc.pid, duration_s=1.0, warm_s=0.5,
                )  # fmt: skip
        for stream in args.stream_list:
            for conc in args.conc_list:
                reps: dict[str, list[dict[str, Any]]] = {c.name: [] for c in contenders}
                for r in range(args.rounds):
                    order = contenders if r % 2 == 0 else contenders[::-1]
                    for c in order:
                        res = h2load(
                            h2, c.url, conc, bodies[stream], args.load_cpus, tmp / "run.log",
                            c.proc.pid, duration_s=args.duration, warm_s=args.warm_up,
                        )  # fmt: skip
                        reps[c.name].append(res)
                for c in contenders:
                    rs = reps[c.name]
                    row: dict[str, Any] = {"router": c.name, "stream": stream, "concurrency": conc}
                    for k in ("rps", "cpu_ms_per_req", "p50_ms", "p99_ms"):
                        row[k] = round(statistics.median(x[k] for x in rs), 3)
                    row["errors"] = sum(x["errors"] for x in rs)
                    row["rounds"] = [
                        {k: round(v, 3) for k, v in x.items() if k != "ok_2xx"} for x in rs
                    ]
                    results.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
        rss = {c.name: round(rss_mb(c.proc.pid), 1) for c in contenders}
    finally:
        for proc in [c.proc for c in contenders] + mocks:
            proc.terminate()
        for proc in [c.proc for c in contenders] + mocks:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return {"results": results, "rss_mb": rss}


def summarize(rec: dict[str, Any], conc: list[int], baseline: str | None) -> dict[str, Any]:
    def get(router: str, stream: bool, c: int) -> dict[str, Any] | None:
        rows: list[dict[str, Any]] = rec["results"]
        for r in rows:
            if (r["router"], r["stream"], r["concurrency"]) == (router, stream, c):
                return r
        return None

    ratios: dict[str, Any] = {}
    for stream in (False, True):
        kind = "stream" if stream else "json"
        base = get("pdctl", stream, conc[0])
        for c in conc:
            pd, vr, w2 = get("pdctl", stream, c), get("vllm-router", stream, c), None
            w2 = get("pdctl-w2", stream, c)
            if pd is None:
                continue
            bl = get(f"pdctl@{baseline}", stream, c) if baseline else None
            if bl is not None:
                ratios[f"{kind}_c{c}_rps_pdctl_over_{baseline}"] = round(
                    pd["rps"] / max(bl["rps"], 1e-9), 2
                )
                ratios[f"{kind}_c{c}_cpu_pdctl_over_{baseline}"] = round(
                    pd["cpu_ms_per_req"] / max(bl["cpu_ms_per_req"], 1e-9), 2
                )
            if vr is not None:
                ratios[f"{kind}_c{c}_rps_pdctl_over_vllm_router"] = round(
                    pd["rps"] / max(vr["rps"], 1e-9), 2
                )
                ratios[f"{kind}_c{c}_cpu_pdctl_over_vllm_router"] = round(
                    pd["cpu_ms_per_req"] / max(vr["cpu_ms_per_req"], 1e-9), 2
                )
            if base is not None:
                ratios[f"{kind}_c{c}_cpu_over_c{conc[0]}"] = round(
                    pd["cpu_ms_per_req"] / max(base["cpu_ms_per_req"], 1e-9), 2
                )
            if w2 is not None:
                ratios[f"{kind}_c{c}_rps_2_workers_over_1"] = round(
                    w2["rps"] / max(pd["rps"], 1e-9), 2
                )
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=4.0, help="measured seconds per run")
    ap.add_argument(
        "--warm-up", type=float, default=2.0, help="seconds of load before each measured run"
    )
    ap.add_argument("--conc", default="1,64,256,1024")
    ap.add_argument("--stream-events", type=int, default=64)
    ap.add_argument("--router-cpus", default="0", help="taskset list for a 1-worker router")
    ap.add_argument("--load-cpus", default="1", help="taskset list for mocks and h2load")
    ap.add_argument("--workers", default="1,2", help="pdctl router.workers values to run")
    ap.add_argument("--h2load", default=None)
    ap.add_argument(
        "--vllm-router",
        default=os.environ.get("PDCTL_BENCH_VLLM_ROUTER"),
        help="vllm-router binary (default: $PDCTL_BENCH_VLLM_ROUTER, else on PATH)",
    )
    ap.add_argument("--no-vllm-router", action="store_true")
    ap.add_argument(
        "--baseline",
        default=None,
        metavar="GIT_REF",
        help="also run the router as it is at this git ref (e.g. main), for ratios",
    )
    ap.add_argument("--streamed", default="0,1", help="0: not streamed, 1: streamed")
    ap.add_argument("--out", default="router_scale.json")
    args = ap.parse_args()
    h2 = args.h2load or shutil.which("h2load")
    if not h2:
        print(INSTALL_H2LOAD, file=sys.stderr)
        return 2
    args.conc_list = [int(c) for c in args.conc.split(",")]
    args.stream_list = [s == "1" for s in args.streamed.split(",")]
    wanted = [int(n) for n in args.workers.split(",")]
    if not has_workers() and wanted != [1]:
        print("note: this router has no router.workers; measuring 1 worker only", flush=True)
        wanted = [1]
    args.worker_counts = sorted(set(wanted) | {1})
    vr = None
    if not args.no_vllm_router:
        vr = args.vllm_router or shutil.which("vllm-router")
        if not vr:
            print(
                "note: vllm-router not found (install it in its own venv, see --help, and "
                "pass --vllm-router PATH); it is left out of this run",
                flush=True,
            )
    # a terminated run still stops the routers and mocks it started (the finally blocks)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load0 = os.getloadavg()[0]
    rec = run(args, h2, vr)
    rec["ratios"] = summarize(rec, args.conc_list, args.baseline)
    rec["setup"] = {
        "router_cpus": args.router_cpus,
        "load_cpus": args.load_cpus,
        "rounds": args.rounds,
        "duration_s": args.duration,
        "warm_up_s": args.warm_up,
        "stream_events": args.stream_events,
        "vllm_router": vr,
        "h2load": h2,
        "baseline": args.baseline,
        "loadavg_1m_start_end": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }
    print("load average (1 min) at start and end:", rec["setup"]["loadavg_1m_start_end"])
    print("\nrouter RSS at the end (MiB):", rec["rss_mb"])
    print("ratios:", json.dumps(rec["ratios"], indent=1))
    write_record(args.out, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
