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
that finds no room is answered at once.

The decision is meant to be final at arrival: a request is queued only when it is
predicted, with high probability, to be admitted and answered in time, and its class has
room in the queue. Its predicted queue wait (:mod:`.pace`: the places ahead of it of its
class or higher, and the higher-class requests expected during its wait, at the pace
places free: the wait it beats ``queue_confidence`` of the time, of a first passage that
counts both streams' unevenness and the rates' own error) plus its predicted time to a
first byte once placed (:mod:`.predictor`), times ``1 + slo_margin``, must be within its
first-byte time left (or the wait within ``max_queue_wait_s``); while that pace is
unknown, a lower class already overtaken by higher ones is not queued. And each class
keeps a share of the queue from each class below it: a class past its share is refused
at arrival unless a lower class waits (a higher class is never refused while a lower one
waits). :mod:`.arrival` makes the decision. Otherwise it is answered at once:

* ``429`` + ``prefill_saturated`` / ``decode_saturated``: the queue is full for its class
  (slow down);
* ``503`` + the same reasons: its predicted wait passes ``max_queue_wait_s`` (or,
  without an SLO or deadline, it cannot be predicted yet and is overtaken);
* ``503`` + ``slo_unreachable``: it is predicted to miss its SLO or deadline (or it
  cannot be predicted yet and is overtaken); a lower class's wait counts the higher
  classes that overtake it, so lower classes are shed first; an interactive request
  only when it would miss with every lower class out of its way;
* ``503`` + ``draining``: every instance of a stage is drained by an operator.

Predictions err, so a queued request may still be shed later (each counted by
``pdctl_router_shed_answer_seconds{when="queued"}``, its answer marked
``pdctl-shed-when: queued``): ``504`` + ``slo_unreachable`` when its deadline passes in
the queue, ``503`` + the stage's reason after ``max_queue_wait_s``, and — the last
resort, when the whole queue is full and a lower class waits in it — ``429`` when a
higher class needs its place.

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

from pdctl.sdk.router.admissionctl import change
from pdctl.sdk.router.arrival import predicted_late, share_refusal
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.limits import drop_headers
from pdctl.sdk.router.looplag import LoopLag
from pdctl.sdk.router.pace import Pace
from pdctl.sdk.router.promreg import Registry
from pdctl.sdk.router.saturation import Saturation, Thresholds
from pdctl.sdk.spec.admission import AdmissionSpec

Clock = Callable[[], float]

CLASSES = ("interactive", "standard", "batch")
"""Priority classes, highest first (``pdctl-priority`` header; vLLM's ``priority`` field
is an integer, lower served first: below 0 is interactive, 0 standard, above 0 batch)."""
REASONS = ("prefill_saturated", "decode_saturated", "slo_unreachable", "draining")
WHEN = ("arrival", "queued")
"""When a request was shed: on arrival, or after it was queued."""
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
    klass: str = "standard"
    queued: bool = False
    """Shed after it was queued (not at arrival)."""

    def headers(self) -> list[tuple[bytes, bytes]]:
        """:func:`~.limits.drop_headers` and ``pdctl-shed-when``: ``arrival`` or
        ``queued``."""
        when = WHEN[self.queued].encode()
        return [*drop_headers(self.retry_after_s, self.reason), (b"pdctl-shed-when", when)]


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


class _Waiter:
    __slots__ = ("future", "klass", "rank", "since")

    def __init__(self, klass: str, since: float) -> None:
        self.klass, self.rank, self.since = klass, CLASSES.index(klass), since
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
        self.pace = Pace(len(CLASSES), clock, spec.queue_confidence)
        """How fast places free and each class takes them (a queued request's wait)."""
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
        self.shed_answer = registry.histogram(
            "pdctl_router_shed_answer_seconds",
            "Time from reading a request to its shed answer sent, per class and when it "
            "was shed (at arrival, or after it was queued).",
            ["class", "when"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        lag = registry.histogram(
            "pdctl_router_loop_lag_seconds",
            "How late this router process's event loop wakes from a 50 ms sleep (a request "
            "not read yet waits as long; the read-to-answer times cannot see it).",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        lag.prime()
        self.loop_lag = LoopLag(lag.observe, period_s=0.05)
        """Started and stopped with the router (the app's lifespan)."""
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
        self.shed_answer.prime(CLASSES, WHEN)

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

    async def enter(
        self, klass: str, deadline: float | None = None, service_s: float = 0.0
    ) -> Ticket | Shed:
        """A place for one request of ``klass``, or why not. ``deadline``: the clock time
        by which its first byte must come (it never waits in the queue past it);
        ``service_s``: its predicted time from being placed to its first byte."""
        now = self.clock()
        if self._draining():
            return self._refuse(503, "draining", klass, "every instance of a stage is drained")
        rank = CLASSES.index(klass)
        full = self.room()
        if full is None and not self._queue:
            self.pace.taken(rank)
            return self._admit(klass, now, queued=False)
        cap = self._cap(self.limits["queue"]) if self.limits["queue"] else 0
        lower = any(self._queued[rank + 1 :])
        no = share_refusal(cap, rank, len(self._queue), lower, klass)
        if no is None and self.spec.slo_routing:
            left = None if deadline is None else deadline - now
            m, most = 1 + self.spec.slo_margin, self.max_queue_wait_s
            ahead = sum(self._queued[: rank + 1])
            no = predicted_late(self.pace, rank, ahead, lower, left, service_s, most, m)
        if no is not None:
            stage = full or ("prefill_saturated" if no.status == 429 else "decode_saturated")
            return self._refuse(no.status, "slo_unreachable" if no.slo else stage, klass, no.why)
        if len(self._queue) >= cap:  # a lower class waits: it goes, never this one
            self._evict_below(klass, full)
        w = _Waiter(klass, now)
        heapq.heappush(self._queue, (w.rank, next(self._order), w))
        self._queued[w.rank] += 1
        self.pace.queueing(True)
        self.pace.taken(rank)
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
            if by_deadline:
                why = "its deadline passed while it was queued"
                return self._refuse(504, "slo_unreachable", klass, why, queued=True)
            why = f"queued for {wait:g} s without room"
            return self._refuse(503, self.room() or "decode_saturated", klass, why, queued=True)
        except asyncio.CancelledError:
            self._drop(w)
            got = w.future.result() if w.future.done() else None
            if isinstance(got, Ticket):
                got.release()
            raise

    def _admit(self, klass: str, since: float, *, queued: bool) -> Ticket:
        self._in_flight += 1
        self.admitted.inc(klass, "true" if queued else "false")
        if queued:
            self.queue_wait.observe(self.clock() - since, klass)
        t = Ticket(self, klass, self.clock())
        if self.prefills:
            self._early.add(t)
        return t

    def _refuse(
        self, status: int, reason: str, klass: str, why: str, *, queued: bool = False
    ) -> Shed:
        self.shed.inc(reason, klass)
        retry = self.retry_after_s()
        stage = reason.split("_", 1)[0]
        msg = {
            "draining": f"the fleet is draining: {why}",
            "slo_unreachable": f"request shed: {why}",
        }.get(reason, f"the fleet's {stage} stage is saturated: {why}")
        return Shed(status, reason, f"{msg}; retry in {retry:.1f} s", retry, klass, queued)

    def answered(self, shed: Shed, seconds: float) -> None:
        """A shed answer was sent ``seconds`` after its request was read."""
        self.shed_answer.observe(seconds, shed.klass, WHEN[shed.queued])

    def unreachable(self, klass: str, why: str) -> Shed:
        """Shed a request no P->D pair is predicted to serve within its SLO or deadline
        (:mod:`.predictor`) even with nothing queued before it: 503 ``slo_unreachable``,
        at arrival."""
        return self._refuse(503, "slo_unreachable", klass, why)

    def retry_after_s(self) -> float:
        """When a place may be free: the queue ahead drained at the recent pace."""
        slots = max(1, self._cap(self.limits["decode"] * max(1, len(self.decodes))))
        return min(30.0, max(0.5, (len(self._queue) + 1) * self._hold_s / slots))

    def _evict_below(self, klass: str, full: str | None) -> None:
        """Shed the newest queued request of the lowest class, lower than ``klass`` (one
        is queued), to make room for it."""
        worst = max(self._queue, key=lambda e: (e[0], e[1]))
        w = worst[2]
        self._queue.remove(worst)
        heapq.heapify(self._queue)
        self._queued[w.rank] -= 1
        self.pace.queueing(bool(self._queue))
        why = f"shed for a request of class {klass}: the queue is full"
        shed = self._refuse(429, full or "prefill_saturated", w.klass, why, queued=True)
        w.future.set_result(shed)

    def _drop(self, w: _Waiter) -> None:
        for i, e in enumerate(self._queue):
            if e[2] is w:
                self._queue.pop(i)
                heapq.heapify(self._queue)
                self._queued[w.rank] -= 1
                self.pace.queueing(bool(self._queue))
                return

    # ------------------------------------------------------------------ leaving

    def _left(self, t: Ticket) -> None:
        self._early.discard(t)
        self._in_flight -= 1
        self.pace.released()
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
                self.pace.freed()
                w.future.set_result(self._admit(w.klass, w.since, queued=True))
        self.pace.queueing(bool(self._queue))
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
        worker applies the same body); None when done, else the refusal
        (:func:`.admissionctl.change`)."""
        refused = change(self, req)
        if refused is None:
            self._kick()
        return refused

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
