"""Hostile clients against the router: does it stay up and keep answering health?

One pdctl router (a subprocess, with keys, default ``[router.http]`` limits except a
short ``header_timeout_s``) over mock workers, and at once, for ``--seconds``:

* slowloris: ``--slow`` connections trickling one header byte every 0.5 s;
* slow bodies: ``--slow`` POSTs whose body never finishes;
* header floods: requests with 500 headers, or one 1 MiB header;
* idle connections: ``--idle`` sockets opened and left silent (10k by default);
* bad input: invalid JSON, JSON nested 100k deep, wrong keys, no keys;
* a health prober (its own process): ``GET /health`` every 100 ms on a fresh
  connection, 1 s timeout.

Prints the health latency (p50, p99, max), health failures, the answers each attack got,
and whether the router process survived; exits 1 on a crash, a hang (a health probe over
1 s) or a health failure. Bounded and loopback only.

    python benchmarks/hostile.py [--seconds 20] [--idle 10000] [--slow 200] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import free_port, pair_spec

from pdctl.sdk.router.mock import MockConfig, MockServer
from pdctl.sdk.spec import FleetSpec

KEY = "hostile-bench-admin-key-0001"
Counts = collections.Counter[str]


def spec(p: int, d: int, port: int) -> FleetSpec:
    return pair_spec(
        p,
        d,
        port,
        {
            "keys": [{"name": "ops", "role": "admin", "env": "HOSTILE_KEY"}],
            "http": {"header_timeout_s": 2.0, "body_timeout_s": 2.0},
            "audit": {"path": "-"},
        },
    )


async def exchange(port: int, data: bytes, timeout: float = 5.0) -> str:  # noqa: ASYNC109
    """Send ``data`` and return the status line's code (or what went wrong)."""
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    except (OSError, TimeoutError) as e:
        return f"connect:{type(e).__name__}"
    try:
        w.write(data)
        await w.drain()
        line = await asyncio.wait_for(r.readline(), timeout)
        return line.split(b" ")[1].decode() if line.startswith(b"HTTP/") else "closed"
    except (OSError, TimeoutError) as e:
        return type(e).__name__
    finally:
        w.close()


async def repeat(stop: asyncio.Event, counts: Counts, port: int, make: Any) -> None:
    while not stop.is_set():
        counts[await exchange(port, make())] += 1


async def slowloris(stop: asyncio.Event, counts: Counts, port: int, body: bool) -> None:
    while not stop.is_set():
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
        except OSError as e:
            counts[f"connect:{type(e).__name__}"] += 1
            await asyncio.sleep(0.5)
            continue
        try:
            if body:
                w.write(
                    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n"
                    b"authorization: Bearer " + KEY.encode() + b"\r\n"
                    b"content-length: 100000\r\n\r\n{"
                )
            else:
                w.write(b"GET /health HTTP/1.1\r\nhost: x\r\n")
            while not stop.is_set() and not r.at_eof():
                w.write(b"a")
                await w.drain()
                try:
                    line = await asyncio.wait_for(r.readline(), 0.5)
                except TimeoutError:
                    continue
                counts[line.split(b" ")[1].decode() if line.startswith(b"HTTP/") else "closed"] += 1
                break
        except OSError as e:
            counts[type(e).__name__] += 1
        finally:
            w.close()


async def idle(stop: asyncio.Event, counts: Counts, port: int, n: int) -> None:
    """Open ``n`` connections (500 at a time), send nothing, hold them until the end."""
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def one() -> None:
        try:
            held.append(await asyncio.open_connection("127.0.0.1", port))
        except OSError as e:
            counts[f"connect:{type(e).__name__}"] += 1

    for i in range(0, n, 500):
        if stop.is_set():
            break
        await asyncio.gather(*(one() for _ in range(min(500, n - i))))
    counts["opened"] += len(held)
    await stop.wait()

    async def answered(r: asyncio.StreamReader) -> bool:
        try:
            await asyncio.wait_for(r.read(64), 0.5)
            return True  # an answer (408) or the end of the stream: the router closed it
        except (TimeoutError, OSError):
            return False

    closed = await asyncio.gather(*(answered(r) for r, _ in held))
    counts["closed_by_router"] += sum(closed)
    for _, w in held:
        w.close()


async def prober(stop: asyncio.Event, port: int, lat: list[float], fails: Counts) -> None:
    req = b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    while not stop.is_set():
        t = time.perf_counter()
        code = await exchange(port, req, timeout=1.0)
        dt = time.perf_counter() - t
        lat.append(dt)
        if code != "200":
            fails[code] += 1
        await asyncio.sleep(max(0.0, 0.1 - dt))


def completion(body: bytes, key: str | None = KEY) -> bytes:
    auth = b"authorization: Bearer " + key.encode() + b"\r\n" if key else b""
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + auth
        + b"content-length: "
        + str(len(body)).encode()
        + b"\r\nconnection: close\r\n\r\n"
        + body
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    pm = await MockServer(MockConfig(role="prefill", engine_id="prefill-0")).start()
    dm = await MockServer(MockConfig(role="decode")).start()
    port = free_port()
    f = Path(tempfile.mkdtemp(prefix="pdctl-hostile-")) / "spec.json"
    f.write_text(spec(pm.port, dm.port, port).model_dump_json())
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, before the run
        [sys.executable, "-m", "pdctl.sdk.router.server", "--spec-json", str(f)],
        env={**os.environ, "HOSTILE_KEY": KEY},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        if await exchange(port, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n", 1.0) == "200":
            break
        await asyncio.sleep(0.1)
    stop = asyncio.Event()
    counts: dict[str, Counts] = collections.defaultdict(collections.Counter)
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(500))
    probe = await asyncio.create_subprocess_exec(  # its own process: the attackers' loop
        sys.executable,  # is busy, and its delays must not count as the router's
        __file__,
        "--probe-only",
        str(port),
        "--seconds",
        str(args.seconds),
        stdout=asyncio.subprocess.PIPE,
    )
    attacks = [
        idle(stop, counts["idle"], port, args.idle),
        *(slowloris(stop, counts["slowloris_head"], port, False) for _ in range(args.slow)),
        *(slowloris(stop, counts["slowloris_body"], port, True) for _ in range(args.slow)),
        *(
            repeat(stop, counts[name], port, make)
            for name, make in (
                ("many_headers", lambda: b"GET /health HTTP/1.1\r\nhost: x\r\n" + many + b"\r\n"),
                (
                    "huge_header",
                    lambda: b"GET /health HTTP/1.1\r\nx: " + b"a" * (1 << 20) + b"\r\n\r\n",
                ),
                ("bad_json", lambda: completion(b'{"model": "tiny", "prompt": ')),
                ("deep_json", lambda: completion(b"[" * 100_000 + b"]" * 100_000)),
                ("wrong_key", lambda: completion(b'{"prompt": "x"}', "nope")),
                ("no_key", lambda: completion(b'{"prompt": "x"}', None)),
                ("garbage", lambda: os.urandom(512)),
            )
        ),
    ]
    tasks = [asyncio.create_task(a) for a in attacks]
    out, _ = await probe.communicate()
    probed = json.loads(out.decode().strip().splitlines()[-1])
    lat, fails = probed["lat"], collections.Counter(probed["fails"])
    stop.set()
    await asyncio.wait(tasks, timeout=15)
    alive = proc.poll() is None
    after = await exchange(port, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n", 2.0)
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    await pm.stop()
    await dm.stop()
    s = sorted(lat)
    return {
        "seconds": args.seconds,
        "health_probes": len(s),
        "health_p50_ms": s[len(s) // 2] * 1000,
        "health_p99_ms": s[min(len(s) - 1, int(len(s) * 0.99))] * 1000,
        "health_max_ms": s[-1] * 1000,
        "health_failures": dict(fails),
        "router_alive": alive,
        "health_after": after,
        "attacks": {k: dict(v) for k, v in counts.items()},
    }


async def probe_main(port: int, seconds: float) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    lat: list[float] = []
    fails: Counts = collections.Counter()
    await prober(stop, port, lat, fails)
    print(json.dumps({"lat": lat, "fails": dict(fails)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probe-only", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--idle", type=int, default=10_000)
    ap.add_argument("--slow", type=int, default=200)
    ap.add_argument("--out", default="hostile.json")
    args = ap.parse_args()
    if args.probe_only:
        asyncio.run(probe_main(args.probe_only, args.seconds))
        return
    rec = asyncio.run(run(args))
    print(json.dumps(rec, indent=2))
    Path(args.out).write_text(json.dumps(rec, indent=2) + "\n")
    ok = rec["router_alive"] and rec["health_after"] == "200" and not rec["health_failures"]
    ok = ok and rec["health_max_ms"] < 1000
    print(
        f"health p50 {rec['health_p50_ms']:.1f} ms, p99 {rec['health_p99_ms']:.1f} ms, max "
        f"{rec['health_max_ms']:.1f} ms over {rec['health_probes']} probes; failures "
        f"{sum(rec['health_failures'].values())}; router "
        + ("alive" if rec["router_alive"] else "DEAD")
    )
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
