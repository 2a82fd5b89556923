"""The router queue's pace: how fast places free while requests queue, and how fast each
priority class takes them; from these, a request's predicted wait in the queue before it
is queued (:class:`~pdctl.sdk.router.admission.Admission` sheds at arrival a request
predicted to miss its first-byte time).

A request of class ``k`` with ``ahead`` requests of its class or higher queued before it
waits for ``ahead + 1`` places, while the requests of higher classes that arrive during
its wait go first. With places freeing at ``mu`` per second (measured while requests
queue) and higher classes taking them at ``lam`` per second (measured over all their
admissions), its place comes after about ``(ahead + 1) / (mu - lam)`` seconds; when
``lam`` takes (nearly) every place that frees, never. Places free unevenly: taking the
``k = ahead + 1`` places as a Poisson stream at ``mu - lam``, the wait is Gamma(k)
distributed with mean ``k / (mu - lam)`` and spread ``sqrt(k) / (mu - lam)``, and the wait
predicted is the one it beats about 9 times in 10 (:data:`SPREAD_Z` spreads above the
mean): a request is queued when it will most likely be served in time, not as likely
as not.

Both rates are exponentially decayed counts over :data:`TAU_S` (each second weighs
``e^(-1/TAU_S)`` of the next), O(1) per event. Until requests have queued for
:data:`MIN_QUEUED_S` in all (decayed) the pace is unknown and nothing is predicted.
"""

from __future__ import annotations

import math
from collections.abc import Callable

TAU_S = 10.0
"""The rates' memory (seconds): a change of load shows within a few seconds."""
MIN_QUEUED_S = 0.5
"""Seconds of queueing seen (decayed) before a wait is predicted."""
STARVED = 0.02
"""Higher classes taking more than ``1 - STARVED`` of the places: the wait is endless."""
SPREAD_Z = 1.28
"""Spreads above the mean wait the prediction takes (1.28: the 90th percentile of a
normal distribution)."""


class Pace:
    """The rates of one router process's queue (its clock: ``clock``)."""

    def __init__(self, classes: int, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._t = clock()
        self._queueing = False
        self._queued_s = 0.0
        """Seconds with requests queued, decayed."""
        self._freed = 0.0
        """Places that freed to the queue (requests admitted from it), decayed."""
        self._span_s = 0.0
        """Seconds seen, decayed (the denominator of the classes' rates)."""
        self._taken = [0.0] * classes
        """Per class rank, requests admitted or queued, decayed."""

    def _age(self) -> None:
        now = self.clock()
        dt = now - self._t
        if dt <= 0:
            return
        self._t = now
        keep = math.exp(-dt / TAU_S)
        grown = TAU_S * (1 - keep)  # the decayed weight of the dt seconds just past
        self._queued_s = self._queued_s * keep + (grown if self._queueing else 0.0)
        self._span_s = self._span_s * keep + grown
        self._freed *= keep
        self._taken = [x * keep for x in self._taken]

    def queueing(self, now_queueing: bool) -> None:
        """The queue became empty or not (call after every change to it)."""
        self._age()
        self._queueing = now_queueing

    def taken(self, rank: int) -> None:
        """A request of class ``rank`` was let in (admitted at once or queued)."""
        self._age()
        self._taken[rank] += 1

    def freed(self) -> None:
        """A place freed to the queue: a queued request was admitted."""
        self._age()
        self._freed += 1

    def rates(self, rank: int) -> tuple[float, float] | None:
        """(places freeing per second while requests queue, places per second taken by
        classes higher than ``rank``), or None while the pace is unknown."""
        self._age()
        if self._queued_s < MIN_QUEUED_S:
            return None
        # one place more than seen: a queue where none freed yet still predicts a wait
        mu = (self._freed + 1) / self._queued_s
        lam = sum(self._taken[:rank]) / self._span_s if self._span_s > 0 else 0.0
        return mu, lam

    def wait_s(self, rank: int, ahead: int) -> float | None:
        """Predicted seconds in the queue for a request of class ``rank`` with ``ahead``
        requests of its class or higher queued before it, about the 90th percentile
        (``inf``: never, the higher classes take the places); None while the pace is
        unknown."""
        r = self.rates(rank)
        if r is None:
            return None
        mu, lam = r
        room = mu - lam
        if room <= mu * STARVED:
            return math.inf
        k = ahead + 1
        return (k + SPREAD_Z * math.sqrt(k)) / room
