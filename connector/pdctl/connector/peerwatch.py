"""Decode's watch on the prefills it waits for: is their side channel still there?

A decode request that registered with a prefill waits for that prefill's WRITE. When the
prefill's engine dies (killed, crashed) between its registration and the WRITE, nothing
in vLLM's push protocol tells the decode: it waits for ``push_registration_timeout``
(vLLM #50754, #21570: decode blindness). The prefill's NIXL side channel (the ZMQ
listener every handshake goes to) lives in the engine's process, so a TCP connect to it
is a cheap liveness check that needs nothing from the peer: refused (or unanswered) on
``misses`` probes in a row means no WRITE will ever come from that engine.

:class:`PeerWatch` probes, on one daemon thread, only the addresses the engine thread
asked about recently (the prefills of requests still awaiting KV), so an idle decode
makes no connections. Pure Python (no vLLM, no NIXL).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterable

Address = tuple[str, int]

FORGET_S = 5.0
"""An address nobody asked about for this long is no longer probed."""


def tcp_accepts(addr: Address, timeout_s: float) -> bool:
    """Whether something listens at ``addr`` (a connect completes in ``timeout_s``)."""
    try:
        with socket.create_connection(addr, timeout=timeout_s):
            return True
    except OSError:
        return False


class PeerWatch:
    """Addresses found unreachable ``misses`` times in a row, probed every
    ``interval_s`` while someone keeps asking about them."""

    def __init__(
        self,
        interval_s: float,
        *,
        misses: int = 2,
        timeout_s: float = 0.5,
        probe: Callable[[Address, float], bool] = tcp_accepts,
    ) -> None:
        self.interval_s = interval_s
        self.misses = max(1, misses)
        self.timeout_s = timeout_s
        self._probe = probe
        self._lock = threading.Lock()
        self._asked: dict[Address, float] = {}
        self._missed: dict[Address, int] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def dead(self, addrs: Iterable[Address], now: float | None = None) -> set[Address]:
        """Ask about ``addrs`` (keeps them probed); those found unreachable so far."""
        now = time.monotonic() if now is None else now
        with self._lock:
            for a in addrs:
                self._asked[a] = now
            out = {a for a, n in self._missed.items() if n >= self.misses and a in self._asked}
            start = self._thread is None and bool(self._asked)
            if start:
                self._thread = threading.Thread(
                    target=self._run, name="pdctl-peer-watch", daemon=True
                )
        if start and self._thread is not None:
            self._thread.start()
        return out

    def probe_once(self, now: float | None = None) -> None:
        """One round over the addresses still asked about (the thread's body)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            for a in [a for a, t in self._asked.items() if now - t > FORGET_S]:
                del self._asked[a]
                self._missed.pop(a, None)
            addrs = list(self._asked)
        for a in addrs:
            ok = self._probe(a, self.timeout_s)
            with self._lock:
                if ok:
                    self._missed.pop(a, None)
                elif a in self._asked:
                    self._missed[a] = self._missed.get(a, 0) + 1

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):  # a watch must never take the engine down
                self.probe_once()
