"""Admission control: what the router lets into the fleet at once, a bounded queue for
the rest, ordered by priority class, and an answer at once — with a reason — for what
cannot be served.

A request is admitted when both its stages have room: the *prefill stage* (requests
admitted with no first byte yet, at most ``prefill_in_flight_per_instance`` per eligible
prefill) and the *decode stage* (requests admitted and not finished, at most
``decode_in_flight_per_instance`` per eligible decode), and neither stage is saturated by
its instances' own gauges (:mod:`.saturation`). Otherwise it waits in the queue; the
queue admits the highest class first, then the oldest. A full queue makes room for a
request by shedding the newest request of a lower class, never a higher one; a request
that finds no room is answered at once:

* ``429`` + ``prefill_saturated`` / ``decode_saturated``: the queue is full (slow down);
* ``503`` + the same reasons: it waited ``max_queue_wait_s`` in the queue;
* ``504`` + ``slo_unreachable``: its first-byte deadline passed while it was queued;
* ``503`` + ``slo_unreachable``: no P->D pair is predicted to answer within it
  (:mod:`.predictor`; standard and batch requests only, asked by the gate);
* ``503`` + ``draining``: every instance of a stage is drained by an operator.

Every answer has ``Retry-After`` (whole seconds) and ``pdctl-retry-after-ms``. What a
request holds is a :class:`Ticket`, an ``async with`` that gives its place back exactly
once. Limits are per process: each of a router's N workers enforces 1/N of them.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pdctl.sdk.client.admission import ADMISSION_SETTINGS
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.limits import drop_headers
from pdctl.sdk.router.promreg import Registry
from pdctl.sdk.router.saturation import Saturation, Thresholds
from pdctl.sdk.spec.admission import AdmissionSpec

Clock = Callable[[], float]

CLASSES = ("interactive", "standard", "batch")
"""Priority classes, highest first (``pdctl-priority`` header; vLLM's ``priority`` field
is an integer, lower served first: below 0 is interactive, 0 standard, above 0 batch)."""
REASONS = ("prefill_saturated", "decode_saturated", "slo_unreachable", "draining")
RECHECK_S = 0.01
"""While requests queue, how often room is looked for besides at each request's end (a
request's first byte frees its prefill-stage place without telling anyone)."""


@dataclass(frozen=True)
class Shed:
    """Not admitted: the answer, and when to come back."""

    status: int
    reason: str
    message: str
    retry_after_s: float

    def headers(self) -> list[tuple[bytes, bytes]]:
        return drop_headers(self.retry_after_s, self.reason)


class Ticket:
    """One admitted request's places in both stages, given back exactly once (also as
    ``with ticket:``). Its
    prefill-stage place frees itself once :attr:`tl` (its timeline, set when routing
    starts) shows prefill done or a first byte."""

    __slots__ = ("_admission", "_held", "klass", "since", "tl")

    def __init__(self, admission: Admission, klass: str, since: float) -> None:
        self._admission, self.klass, self.since = admission, klass, since
        self._held = True
        self.tl: Any = None

    def in_prefill(self) -> bool:
        tl = self.tl
        return tl is None or (tl.prefill_done is None and tl.decode_first_byte is None)

    def release(self) -> None:
        if self._held:
            self._held = False
            self._admission._left(self)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


GAVE_UP_WEIGHT = 1.5
"""How much more than its wait a request that waited its deadline out in the queue
counts for its class's pace (it would have waited longer)."""


class _Waiter:
    __slots__ = ("ahead", "future", "klass", "rank", "since")

    def __init__(self, klass: str, since: float, ahead: int = 0) -> None:
        self.klass, self.rank, self.since = klass, CLASSES.index(klass), since
        self.ahead = ahead
        """Requests queued before it that are admitted first (its class or higher)."""
        self.future: asyncio.Future[Ticket | Shed] = asyncio.get_running_loop().create_future()


class Admission:
    """The admission state of one router process."""

    def __init__(
        self,
        spec: AdmissionSpec,
        prefills: Sequence[Upstream],
        decodes: Sequence[Upstream],
        registry: Registry,
        *,
        share: float = 1.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.spec, self.share, self.clock = spec, share, clock
        self.prefills, self.decodes = list(prefills), list(decodes)
        th = Thresholds(spec.max_waiting_per_instance, spec.max_kv_usage, spec.stale_after_s)
        self.saturation = Saturation(th, spec.scrape_interval_s, clock=clock, busy=self._busy)
        self.limits = {
            "prefill": spec.prefill_in_flight_per_instance,
            "decode": spec.decode_in_flight_per_instance,
            "queue": spec.max_queued,
        }
        """Whole-router limits (per instance for the stages); changeable at run time."""
        self.max_queue_wait_s = spec.max_queue_wait_s
        self._early: set[Ticket] = set()
        """Admitted tickets that may still be in their prefill stage."""
        self._in_flight = 0
        self._queue: list[tuple[int, int, _Waiter]] = []
        self._queued = [0] * len(CLASSES)
        """Waiters in :attr:`_queue` per class rank (so a request's place and whether a
        lower class waits are known without walking the queue)."""
        self._order = itertools.count()
        self._pump: asyncio.Task[None] | None = None
        self._hold_s = 1.0
        """Mean time an admitted request holds its decode place (for Retry-After)."""
        self._place_s: dict[str, float] = {}
        """Per class, the seconds its requests have recently waited per place ahead of
        them (absent: not seen yet); a request's predicted wait is that times the places
        ahead of it. Per class, because higher classes arriving later go first: a batch
        request's place moves slower than an interactive one's under pressure."""
        self.admitted = registry.counter(
            "pdctl_router_admitted_total",
            "Requests admitted to the fleet, per class and whether they queued first.",
            ["class", "queued"],
        )
        self.shed = registry.counter(
            "pdctl_router_shed_total",
            "Requests answered without reaching the fleet, per reason and class.",
            ["reason", "class"],
        )
        self.queue_wait = registry.histogram(
            "pdctl_router_queue_wait_seconds",
            "Time admitted requests spent in the router's queue, per class.",
            ["class"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        registry.gauge(
            "pdctl_router_queue_depth",
            "Requests waiting in the router's queue, per class.",
            ["class"],
            self._depths,
        )
        registry.gauge(
            "pdctl_router_stage_in_flight",
            "Admitted requests per stage: prefill (no first byte yet) and decode (not done).",
            ["stage"],
            lambda: {("prefill",): float(self.in_prefill()), ("decode",): float(self._in_flight)},
        )
        self.admitted.prime(CLASSES, ("false", "true"))
        self.shed.prime(REASONS, CLASSES)

    def _busy(self) -> bool:
        """Requests admitted or queued (the saturation reads are wanted only then)."""
        return bool(self._in_flight or self._queue)

    # ------------------------------------------------------------------ limits

    def _cap(self, whole: int) -> int:
        """This process's share of a whole-router limit (at least 1)."""
        return max(1, math.ceil(whole * self.share))

    def in_prefill(self) -> int:
        """Admitted requests still in their prefill stage (no prefill answer, no first
        byte); those past it leave the set for good."""
        done = [t for t in self._early if not t.in_prefill()]
        self._early.difference_update(done)
        return len(self._early)

    def room(self) -> str | None:
        """None when a request may start now, else the stage that is full."""
        p_live = sum(1 for u in self.prefills if u.eligible() and not u.drained)
        d_live = sum(1 for u in self.decodes if u.eligible() and not u.drained)
        # a stage with no eligible instance is the instance set's to answer (it waits
        # router.unavailable_wait_s for one, then 503), not overload
        # len(_early) bounds in_prefill() from above: the walk that prunes it is needed
        # only when that bound reaches the cap
        p_cap = self._cap(self.limits["prefill"] * p_live) if p_live else 0
        if p_live and len(self._early) >= p_cap and self.in_prefill() >= p_cap:
            return "prefill_saturated"
        if d_live and self._in_flight >= self._cap(self.limits["decode"] * d_live):
            return "decode_saturated"
        if self.prefills and self.saturation.stage_saturated(self.prefills):
            return "prefill_saturated"
        if self.saturation.stage_saturated(self.decodes):
            return "decode_saturated"
        return None

    def _draining(self) -> bool:
        return any(pool and all(u.drained for u in pool) for pool in (self.prefills, self.decodes))

    # ------------------------------------------------------------------ entering

    async def enter(self, klass: str, deadline: float | None = None) -> Ticket | Shed:
        """A place for one request of ``klass``, or why not. ``deadline``: the clock time
        by which its first byte must come (it never waits in the queue past it)."""
        now = self.clock()
        if self._draining():
            return self._refuse(503, "draining", klass, "every instance of a stage is drained")
        full = self.room()
        if full is None and not self._queue:
            for k in self._place_s:  # a place free at once: the queue moves
                self._place_s[k] *= 0.9
            return self._admit(klass, now, queued=False)
        cap = self._cap(self.limits["queue"]) if self.limits["queue"] else 0
        if len(self._queue) >= cap and not self._evict_below(klass, full):
            what = full or "prefill_saturated"
            return self._refuse(429, what, klass, f"the router's queue is full ({cap} waiting)")
        rank = CLASSES.index(klass)
        ahead = sum(self._queued[: rank + 1])
        late = self._predicted_late(klass, ahead, deadline, now)
        if late is not None:
            return self._refuse(503, "slo_unreachable", klass, late)
        w = _Waiter(klass, now, ahead)
        heapq.heappush(self._queue, (w.rank, next(self._order), w))
        self._queued[w.rank] += 1
        self._kick()
        wait = self.max_queue_wait_s
        by_deadline = deadline is not None and deadline - now < wait
        if deadline is not None and by_deadline:
            wait = max(0.0, deadline - now)
        try:
            async with asyncio.timeout(wait):
                return await asyncio.shield(w.future)
        except TimeoutError:
            if w.future.done():  # admitted in the same instant
                return w.future.result()
            self._drop(w)
            self._paced(w, gave_up=True)
            if by_deadline:
                return self._refuse(
                    504, "slo_unreachable", klass, "its deadline passed while it was queued"
                )
            why = self.room() or "decode_saturated"
            return self._refuse(503, why, klass, f"queued for {wait:g} s without room")
        except asyncio.CancelledError:
            self._drop(w)
            got = w.future.result() if w.future.done() else None
            if isinstance(got, Ticket):
                got.release()
            raise

    def _predicted_late(
        self, klass: str, ahead: int, deadline: float | None, now: float
    ) -> str | None:
        """Why a standard or batch request with a deadline is shed at once instead of
        queued (its predicted queue wait alone passes it, beyond ``slo_margin``), or
        None. Interactive requests, and a queue whose pace is not known yet, wait."""
        pace = self._place_s.get(klass)
        if deadline is None or klass == "interactive" or pace is None:
            return None
        if not self.spec.slo_routing:
            return None
        wait, left = (ahead + 1) * pace, deadline - now
        if wait <= left * (1 + self.spec.slo_margin):
            return None
        return (
            f"its predicted queue wait ({ahead} ahead: {wait * 1000:.0f} ms) passes the "
            f"{max(0.0, left) * 1000:.0f} ms it has left"
        )

    def _paced(self, w: _Waiter, *, gave_up: bool = False) -> None:
        """Learn the queue's pace for ``w``'s class from its wait, admitted or given up
        on (``gave_up``: a lower bound, it would have waited longer, so it counts as
        :data:`GAVE_UP_WEIGHT` times its wait: otherwise a class whose requests all
        wait their deadline out predicts a wait of just that deadline, and queues)."""
        place = (self.clock() - w.since) / (w.ahead + 1) * (GAVE_UP_WEIGHT if gave_up else 1)
        old = self._place_s.get(w.klass)
        self._place_s[w.klass] = place if old is None else old + 0.2 * (place - old)

    def _admit(self, klass: str, since: float, *, queued: bool) -> Ticket:
        self._in_flight += 1
        self.admitted.inc(klass, "true" if queued else "false")
        if queued:
            self.queue_wait.observe(self.clock() - since, klass)
        t = Ticket(self, klass, self.clock())
        if self.prefills:
            self._early.add(t)
        return t

    def _refuse(self, status: int, reason: str, klass: str, why: str) -> Shed:
        self.shed.inc(reason, klass)
        retry = self.retry_after_s()
        stage = reason.split("_", 1)[0]
        msg = {
            "draining": f"the fleet is draining: {why}",
            "slo_unreachable": f"request shed: {why}",
        }.get(reason, f"the fleet's {stage} stage is saturated: {why}")
        return Shed(status, reason, f"{msg}; retry in {retry:.1f} s", retry)

    def unreachable(self, klass: str, why: str) -> Shed:
        """Shed a request no P->D pair is predicted to serve within its SLO or deadline
        (:mod:`.predictor`): 503 ``slo_unreachable``, before it queues."""
        return self._refuse(503, "slo_unreachable", klass, why)

    def retry_after_s(self) -> float:
        """When a place may be free: the queue ahead drained at the recent pace."""
        slots = max(1, self._cap(self.limits["decode"] * max(1, len(self.decodes))))
        return min(30.0, max(0.5, (len(self._queue) + 1) * self._hold_s / slots))

    def _evict_below(self, klass: str, full: str | None) -> bool:
        """Shed the newest queued request of a class lower than ``klass`` (True), to
        make room for it; False when none is lower."""
        rank = CLASSES.index(klass)
        if not any(self._queued[rank + 1 :]):
            return False
        worst = max(self._queue, key=lambda e: (e[0], e[1]), default=None)
        if worst is None or worst[0] <= rank:
            return False
        w = worst[2]
        self._queue.remove(worst)
        heapq.heapify(self._queue)
        self._queued[w.rank] -= 1
        why = f"shed for a request of class {klass}: the queue is full"
        w.future.set_result(self._refuse(429, full or "prefill_saturated", w.klass, why))
        return True

    def _drop(self, w: _Waiter) -> None:
        for i, e in enumerate(self._queue):
            if e[2] is w:
                self._queue.pop(i)
                heapq.heapify(self._queue)
                self._queued[w.rank] -= 1
                return

    # ------------------------------------------------------------------ leaving

    def _left(self, t: Ticket) -> None:
        self._early.discard(t)
        self._in_flight -= 1
        held = self.clock() - t.since
        self._hold_s += 0.1 * (held - self._hold_s)
        self._kick()

    def _kick(self) -> None:
        """Admit from the queue while there is room (highest class, then oldest); while
        some still wait, look again every :data:`RECHECK_S`."""
        while self._queue and self.room() is None:
            _, _, w = heapq.heappop(self._queue)
            self._queued[w.rank] -= 1
            if not w.future.done():
                self._paced(w)
                w.future.set_result(self._admit(w.klass, w.since, queued=True))
        if self._queue and self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(self._recheck())

    async def _recheck(self) -> None:
        try:
            while self._queue:
                await asyncio.sleep(RECHECK_S)
                self._kick()
        finally:
            self._pump = None

    def _depths(self) -> dict[tuple[str, ...], float]:
        return {(c,): float(n) for c, n in zip(CLASSES, self._queued, strict=True)}

    # ------------------------------------------------------------------ control

    def apply(self, req: dict[str, Any]) -> tuple[int, str, str] | None:
        """``POST /v1/pdctl/admission``: change limits and thresholds at run time (every
        worker applies the same body); None when done, else the refusal."""
        ints = {
            "prefill_in_flight_per_instance": ("prefill", 1),
            "decode_in_flight_per_instance": ("decode", 1),
            "max_queued": ("queue", 0),
            "max_waiting_per_instance": (None, 0),
        }
        known = set(ADMISSION_SETTINGS)
        unknown = sorted(set(req) - known)
        if unknown or not req:
            return (
                400,
                f"unknown admission setting(s) {', '.join(unknown) or '(none given)'}; "
                f"send any of: {', '.join(sorted(known))}",
                "invalid_request_error",
            )
        for k, (_, low) in ints.items():
            v = req.get(k)
            if k in req and (not isinstance(v, int) or isinstance(v, bool) or v < low):
                return 400, f"'{k}' must be an integer >= {low}", "invalid_request_error"
        kv = _number(req.get("max_kv_usage"))
        if "max_kv_usage" in req and (kv is None or not 0 <= kv <= 1):
            return 400, "'max_kv_usage' must be a number from 0 to 1", "invalid_request_error"
        qw = _number(req.get("max_queue_wait_s"))
        if "max_queue_wait_s" in req and (qw is None or qw <= 0):
            return 400, "'max_queue_wait_s' must be a number > 0", "invalid_request_error"
        for k, (slot, _) in ints.items():
            if k in req and slot is not None:
                self.limits[slot] = int(req[k])
        if "max_waiting_per_instance" in req:
            self.saturation.thresholds.max_waiting = int(req["max_waiting_per_instance"])
        if kv is not None:
            self.saturation.thresholds.max_kv_usage = kv
        if qw is not None:
            self.max_queue_wait_s = qw
        self._kick()
        return None

    def state(self) -> dict[str, Any]:
        """The settings in force and this process's queue (``/v1/pdctl/state``)."""
        th = self.saturation.thresholds
        return {
            "enabled": True,
            "prefill_in_flight_per_instance": self.limits["prefill"],
            "decode_in_flight_per_instance": self.limits["decode"],
            "max_queued": self.limits["queue"],
            "max_queue_wait_s": self.max_queue_wait_s,
            "max_waiting_per_instance": th.max_waiting,
            "max_kv_usage": th.max_kv_usage,
            "queued": len(self._queue),
            "in_prefill": self.in_prefill(),
            "in_flight": self._in_flight,
            "saturated": sorted(
                u.name for u in (*self.prefills, *self.decodes) if self.saturation.saturated(u)
            ),
            "unknown": sorted(
                u.name for u in (*self.prefills, *self.decodes) if not self.saturation.known(u)
            ),
        }


def _number(v: Any) -> float | None:
    """``v`` as a finite number, or None."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None
