"""Router under many long streams: 10,000 concurrent streaming clients, and a soak.

pdctl's router in push mode (one process, pinned with ``taskset``) in front of pdctl's mock
prefill and decode (``python -m pdctl.sdk.router.mock``: decode streams ``--events`` SSE
events, ``--event-interval`` seconds apart, so each stream stays open for their product).
The load generator is this script: one asyncio socket per client, HTTP/1.1, each reading
its stream to the end and checking it ended with ``[DONE]``.

* ``--streams N`` (default 10,000): N clients connect over ``--ramp`` seconds and each
  holds one stream; reported: errors by kind, the router's open files and memory (RSS of
  its process tree) idle, at the plateau and after, memory per 1,000 streams, time to
  first byte p50/p99, stream duration, and how long the router takes to exit on SIGTERM
  afterwards;
* ``--soak S`` seconds at ``--rate R`` new streams per second (open loop; default 70% of
  the capacity measured first with ``--capacity-s`` seconds of 64 clients streaming back
  to back — the capacity of the whole setup, load generator included, which on a small
  machine is below the router's own): the router's RSS sampled every 10 s, the last
  fifth of the run against the second fifth (flat: within ±10%).

The router is started with ``router.http.max_connections`` above N, admission's limits
and queue at N in each worker (its defaults shed most of them at once;
``_bench.admission_room`` says why per worker), and, when this process may raise it
(root), an open-files limit of ``--nofile``; the router raises its own soft limit to the
hard one and warns when that is too low.

    python benchmarks/router_streams.py [--streams 10000] [--events 32] [--workers 1]
        [--event-interval 1.0] [--ramp 20] [--soak 0] [--rate R] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _bench import admission_room, free_port, pdctl_router_argv, write_record
from router_scale import Contender, rss_mb, tree_pids, wait_up

BODY = {"model": "tiny", "prompt": "hello there", "max_tokens": 8, "stream": True}


def open_files(pid: int) -> int:
    """Open files of ``pid``'s process tree (a router with workers: the parent's and every
    worker's; each process has its own limit: :func:`most_open_files`)."""
    return sum(max(0, _fds(p)) for p in tree_pids(pid))


def most_open_files(pid: int) -> int:
    """The most open files of one process in ``pid``'s tree (what a process limit bounds)."""
    return max((_fds(p) for p in tree_pids(pid)), default=-1)


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def raise_nofile(n: int) -> None:
    """In the child before exec: as many open files as asked when allowed (root)."""
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


CHILDREN: list[subprocess.Popen[bytes]] = []
"""Every process this script started, for :func:`on_sigterm`."""


def start(argv: list[str], cpus: str, nofile: int, log: Path) -> subprocess.Popen[bytes]:
    """``argv`` pinned to ``cpus``, its standard error to ``log`` (a pipe nobody reads
    would stop a process that writes much there once it is full)."""
    with log.open("ab") as err:
        proc = subprocess.Popen(
            ["taskset", "-c", cpus, *argv],
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=lambda: raise_nofile(nofile),
        )
    CHILDREN.append(proc)
    return proc


def on_sigterm(*_: object) -> None:
    """Stop the mocks and the router, then exit. Done here rather than by raising
    SystemExit: raised inside the event loop's callbacks (a weakref finaliser, a
    transport's), that exception is printed and ignored, and the children outlived us."""
    for p in CHILDREN:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 10
    for p in CHILDREN:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
    os._exit(143)


class Stats:
    def __init__(self) -> None:
        self.errors: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()
        """Answers other than 200 by status, ``pdctl-drop-reason`` and message (what
        refused them: admission, a leg that could not be opened, the connection cap)."""
        self.ttfb: list[float] = []
        self.duration: list[float] = []
        self.ok = 0
        self.open = 0
        self.peak_open = 0


async def refusal(status: int, head: bytes, reader: asyncio.StreamReader) -> str:
    """``status``, the drop reason and the error message of a refused request."""
    reason = "-"
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"pdctl-drop-reason":
            reason = value.strip().decode(errors="replace")
    try:
        body = await asyncio.wait_for(reader.read(4096), 5.0)
    except (OSError, TimeoutError):
        body = b""
    text = body.decode(errors="replace")
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        # a JSON error body (maybe chunked: its JSON starts at the first brace)
        text = json.loads(text[text.index("{") : text.rindex("}") + 1])["error"]["message"]
    return f"{status} {reason}: {text[:200]}"


async def one_stream(host: str, port: int, payload: bytes, stats: Stats) -> None:
    t0 = time.perf_counter()
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        stats.open += 1
        stats.peak_open = max(stats.peak_open, stats.open)
        writer.write(payload)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            stats.errors[f"http {status}"] += 1
            stats.refusals[await refusal(status, head, reader)] += 1
            return
        first = True
        tail = b""
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            if first:
                stats.ttfb.append(time.perf_counter() - t0)
                first = False
            tail = (tail + chunk)[-64:]
            if tail.endswith(b"0\r\n\r\n"):
                break
        if b"[DONE]" not in tail:
            stats.errors["stream cut short"] += 1
            return
        stats.ok += 1
        stats.duration.append(time.perf_counter() - t0)
    except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as e:
        stats.errors[type(e).__name__] += 1
    finally:
        if writer is not None:
            stats.open -= 1
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def request_bytes(port: int) -> bytes:
    body = json.dumps(BODY).encode()
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


def tail(log: Path, lines: int = 20) -> list[str]:
    """The last ``lines`` lines of a process's standard error."""
    try:
        return log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 1)


async def many(port: int, n: int, ramp_s: float, pid: int) -> dict[str, Any]:
    stats, payload = Stats(), request_bytes(port)
    idle = {"rss_mb": round(rss_mb(pid), 1), "open_files": open_files(pid)}
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(one_stream("127.0.0.1", port, payload, stats)))
        if ramp_s > 0 and i % 100 == 99:  # a ramp, not a SYN flood on one backlog
            await asyncio.sleep(ramp_s * 100 / n)
    peak_rss, peak_fds, peak_one = 0.0, 0, 0
    while not all(t.done() for t in tasks):
        peak_rss = max(peak_rss, rss_mb(pid))
        peak_fds = max(peak_fds, open_files(pid))
        peak_one = max(peak_one, most_open_files(pid))
        print(
            f"\r  open streams {stats.open:6d}  done {stats.ok:6d}  errors "
            f"{sum(stats.errors.values()):5d}  router {rss_mb(pid):7.1f} MiB "
            f"{open_files(pid):6d} files",
            end="",
            flush=True,
        )
        await asyncio.sleep(1.0)
    print()
    await asyncio.sleep(2.0)
    after = {"rss_mb": round(rss_mb(pid), 1), "open_files": open_files(pid)}
    return {
        "streams": n,
        "completed": stats.ok,
        "errors": dict(stats.errors),
        "refusals": dict(stats.refusals),
        "peak_concurrent_client_streams": stats.peak_open,
        "idle": idle,
        "peak": {
            "rss_mb": round(peak_rss, 1),
            "open_files": peak_fds,
            "open_files_one_process": peak_one,
        },
        "after": after,
        "mib_per_1000_streams": round((peak_rss - idle["rss_mb"]) / (n / 1000), 2) if n else None,
        "ttfb_ms": {"p50": pct(stats.ttfb, 0.5), "p99": pct(stats.ttfb, 0.99)},
        "stream_s": {
            "p50": (pct(stats.duration, 0.5) or 0) / 1000,
            "p99": (pct(stats.duration, 0.99) or 0) / 1000,
        },
    }


async def capacity(port: int, seconds: float, conc: int = 64) -> float:
    """Streams per second through the whole setup at ``conc`` clients back to back."""
    stats, payload = Stats(), request_bytes(port)
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < deadline:
            await one_stream("127.0.0.1", port, payload, stats)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(conc)))
    return stats.ok / (time.perf_counter() - t0)


async def soak(port: int, seconds: float, rate: float, pid: int) -> dict[str, Any]:
    stats, payload = Stats(), request_bytes(port)
    samples: list[tuple[float, float]] = []
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter()
    next_sample = 0.0
    sent = 0
    while (now := time.perf_counter() - t0) < seconds:
        while sent < now * rate:
            t = asyncio.create_task(one_stream("127.0.0.1", port, payload, stats))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            sent += 1
        if now >= next_sample:
            samples.append((round(now, 1), round(rss_mb(pid), 1)))
            next_sample += 10.0
            print(
                f"\r  {now:6.0f} s  sent {sent}  ok {stats.ok}  errors "
                f"{sum(stats.errors.values())}  router {samples[-1][1]:.1f} MiB",
                end="",
                flush=True,
            )
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    print()
    fifth = seconds / 5
    early = [m for t, m in samples if fifth <= t < 2 * fifth]
    late = [m for t, m in samples if t >= 4 * fifth]
    ratio = statistics.median(late) / statistics.median(early) if early and late else None
    return {
        "seconds": seconds,
        "rate_per_s": rate,
        "sent": sent,
        "completed": stats.ok,
        "errors": dict(stats.errors),
        "refusals": dict(stats.refusals),
        "rss_mb_samples": samples,
        "rss_late_over_early": round(ratio, 3) if ratio is not None else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=10_000)
    ap.add_argument("--events", type=int, default=32)
    ap.add_argument("--event-interval", type=float, default=1.0)
    ap.add_argument("--ramp", type=float, default=20.0, help="seconds to connect every client")
    ap.add_argument("--soak", type=float, default=0.0, help="seconds of soak (0: none)")
    ap.add_argument("--rate", type=float, default=None, help="soak: new streams per second")
    ap.add_argument("--capacity-s", type=float, default=10.0)
    ap.add_argument("--soak-events", type=int, default=16)
    ap.add_argument("--soak-interval", type=float, default=0.0, help="soak: s between events")
    ap.add_argument("--router-cpus", default="0")
    ap.add_argument("--load-cpus", default="1")
    ap.add_argument("--nofile", type=int, default=65536)
    ap.add_argument(
        "--workers", type=int, default=1, help="router.workers (each has its own files limit)"
    )
    ap.add_argument("--out", default="router_streams.json")
    args = ap.parse_args()
    # a SIGTERM (a timeout, an impatient operator) still stops the mocks and the router
    signal.signal(signal.SIGTERM, on_sigterm)
    raise_nofile(args.nofile)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft < args.streams + 256:
        print(f"this process may open {soft} files: too few for {args.streams} clients")
        return 2
    # the router holds two descriptors per stream (the client's and the decode leg's)
    per_worker = 2 * args.streams // max(1, args.workers) + 512
    if soft < per_worker:
        print(
            f"note: a router process may open {soft} files and each of its {args.workers} "
            f"worker(s) needs about {per_worker} for {args.streams} streams: expect refused "
            "legs (503) unless the hard limit is raised or --workers is larger",
            flush=True,
        )
    tmp = Path(tempfile.mkdtemp(prefix="pdctl-streams-"))
    py = [sys.executable, "-m", "pdctl.sdk.router.mock", "--no-record"]
    pport, dport, rport = free_port(), free_port(), free_port()
    procs = [
        start(
            [*py, "--role", "prefill", "--port", str(pport)],
            args.load_cpus,
            args.nofile,
            tmp / "prefill.log",
        ),
    ]
    rec: dict[str, Any] = {"args": vars(args)}
    try:
        for events, interval, label in (
            (args.events, args.event_interval, "many"),
            (args.soak_events, args.soak_interval, "soak"),
        ):
            if label == "soak" and args.soak <= 0:
                break
            dec = [*py, "--role", "decode", "--port", str(dport), "--chunks", str(events)]
            dec += ["--chunk-delay-s", str(interval)]
            decode = start(dec, args.load_cpus, args.nofile, tmp / f"decode-{label}.log")
            router_cfg = {
                "http": {"max_connections": args.streams + 1024},
                **admission_room(args.streams, args.workers),
                **({"workers": args.workers} if args.workers > 1 else {}),
            }
            argv = pdctl_router_argv(
                f"http://127.0.0.1:{pport}", f"http://127.0.0.1:{dport}", rport, tmp, router_cfg
            )
            router_log = tmp / f"router-{label}.log"
            router = start(argv, args.router_cpus, args.nofile, router_log)
            procs += [decode, router]
            time.sleep(1.0)
            wait_up(Contender("pdctl", f"http://127.0.0.1:{rport}", router))
            if label == "many":
                print(f"{args.streams} streams of {events} events {interval:g} s apart")
                rec["many"] = asyncio.run(many(rport, args.streams, args.ramp, router.pid))
                print(json.dumps(rec["many"], indent=1))
            else:
                rate = args.rate
                if rate is None:
                    cap = asyncio.run(capacity(rport, args.capacity_s))
                    rec["capacity_streams_per_s"] = round(cap, 1)
                    rate = 0.7 * cap
                    print(f"capacity {cap:.1f} streams/s; soak at 70%: {rate:.1f}/s")
                rec["soak"] = asyncio.run(soak(rport, args.soak, rate, router.pid))
                print(json.dumps({k: v for k, v in rec["soak"].items() if k != "rss_mb_samples"}))
            t = time.perf_counter()
            router.terminate()
            try:
                router.wait(60)
                rec[f"{label}_router_exit_s"] = round(time.perf_counter() - t, 2)
            except subprocess.TimeoutExpired:
                rec[f"{label}_router_exit_s"] = None  # not out within 60 s of SIGTERM
            decode.terminate()
            decode.wait(10)
            rec[f"{label}_router_stderr_tail"] = tail(router_log)
            procs = procs[:1]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    write_record(args.out, rec)
    many_ok = "many" not in rec or (
        rec["many"]["completed"] == args.streams and not rec["many"]["errors"]
    )
    return 0 if many_ok else 1


if __name__ == "__main__":
    sys.exit(main())
