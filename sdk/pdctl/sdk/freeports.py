"""Free TCP ports for fleets started on the fly (tests, benchmarks, scripts).

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` lies in the ephemeral range,
the same range every *outgoing* connection draws its source port from. On a busy machine
(a vLLM instance opens dozens of loopback connections: ZMQ, NIXL/UCX, health checks) such
a port is often taken by someone's outgoing socket between the moment it was chosen and
the moment the server binds it, and the instance fails to start with "address already in
use". :func:`free_ports` therefore picks ports *outside* the ephemeral range, checks each
one binds, and never hands the same port out twice in one process.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

#: Linux's default when the range cannot be read.
DEFAULT_EPHEMERAL = (32768, 60999)
#: Never hand out ports below this: well-known and registered services live low, and
#: Ray's workers take 10002-19999 by default (its ``--min/max-worker-port``).
LOWEST = 20000
HIGHEST = 65535

_lock = threading.Lock()
_handed: set[int] = set()


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive), or Linux's default."""
    try:
        lo, hi = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return (lo, hi) if 0 < lo <= hi <= HIGHEST else DEFAULT_EPHEMERAL


def candidate_span(ephemeral: tuple[int, int] | None = None) -> tuple[int, int]:
    """The larger stretch of ports outside the ephemeral range (inclusive bounds)."""
    lo, hi = ephemeral or ephemeral_range()
    below = (LOWEST, lo - 1)
    above = (hi + 1, HIGHEST)
    below_n = below[1] - below[0] + 1
    above_n = above[1] - above[0] + 1
    if max(below_n, above_n) < 64:
        # the ephemeral range covers (nearly) everything: take what is left of it
        return (LOWEST, HIGHEST)
    return below if below_n >= above_n else above


def _binds(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(n: int, host: str = "127.0.0.1", *, attempts: int = 10000) -> list[int]:
    """``n`` distinct ports outside the ephemeral range that bind on ``host`` now and
    were not handed out before by this process.

    Raises :class:`RuntimeError` when ``attempts`` candidates are not enough.
    """
    lo, hi = candidate_span()
    rng = random.Random()
    out: list[int] = []
    with _lock:
        for _ in range(attempts):
            if len(out) == n:
                break
            port = rng.randint(lo, hi)
            if port in _handed or not _binds(host, port):
                continue
            _handed.add(port)
            out.append(port)
    if len(out) < n:
        raise RuntimeError(
            f"found only {len(out)} of {n} free ports in {lo}-{hi} on {host}"
            f" after {attempts} tries; free some ports or widen the range"
        )
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """One port as :func:`free_ports` picks them."""
    return free_ports(1, host)[0]
