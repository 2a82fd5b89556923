"""The router queue's pace: how fast places free while requests queue, and how fast each
priority class takes them; from these, a request's predicted wait in the queue before it
is queued (:class:`~pdctl.sdk.router.admission.Admission` sheds at arrival a request
predicted to miss its first-byte time).

A request of class ``k`` with ``ahead`` requests of its class or higher queued before it
waits for ``n = ahead + 1`` places, while the requests of higher classes that arrive
during its wait go first. With places freeing at ``mu`` per second (measured while
requests queue) and higher classes taking them at ``lam`` per second (their requests
let in meanwhile), the places left to its class come at ``r = mu - lam`` per second: its
place comes after about ``n / r`` seconds; when ``lam`` takes (nearly) every place that
frees, never.

Both streams are uneven. Taking the places freeing and the higher-class arrivals as
independent Poisson streams, the places left to it by time ``t`` are their difference:
mean ``r t``, variance ``s t`` with ``s = mu + lam``. The time that difference first
reaches ``n`` has mean ``n / r`` and variance ``n s / r^3`` (the first passage of a
drifting random walk, an inverse Gaussian), so the wait predicted, the one it beats with
probability ``confidence`` (``router.admission.queue_confidence``, by default 0.975:
about 39 times in 40; ``z`` spreads above the mean, 1.96 at 0.975), is::

    (n + z * sqrt(n * s / r)) / r

With no higher class (``lam = 0``) this is a Gamma wait's mean plus its spreads. The
higher classes widen the spread by ``sqrt((mu + lam) / (mu - lam))``: a class that gets
the remnant of the places waits for the difference of two large, noisy counts, and its
wait is far less certain than its mean says. A request is queued when it will almost
surely be served in time: what the router queues it serves (a shed after queueing is an
error of this prediction, counted).

Both rates are counted over the same seconds: those with requests queued (a higher-class
request let in while nothing waits overtakes no one, and time without a queue would
dilute one rate and not the other). They are exponentially decayed counts over
:data:`TAU_S` (each second weighs ``e^(-1/TAU_S)`` of the next), O(1) per event. Counts
over ``T`` seconds of queueing know each rate only to about its square root, so the
mean wait ``W = n / r`` is itself uncertain: the spread above widens by
``sqrt(1 + W / T)`` (a wait as long as the seconds the rates were measured over doubles
its variance). Until requests have queued for :data:`MIN_QUEUED_S` in all (decayed) the
pace is unknown and nothing is predicted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist

TAU_S = 10.0
"""The rates' memory (seconds): a change of load shows within a few seconds."""
MIN_QUEUED_S = 0.5
"""Seconds of queueing seen (decayed) before a wait is predicted."""
RECENT_S = 1.0
"""The memory of the onset counts (seconds): the places freed and the requests let in
over about the last second, queue or not (:meth:`Pace.outpaced`)."""
OUTPACED_BY = 2.0
"""Higher-class requests let in beyond the places freed, over about the last second,
from which a lower class is taken to be outpaced while the pace is unknown."""
STARVED = 0.02
"""Higher classes taking more than ``1 - STARVED`` of the places: the wait is endless."""
CONFIDENCE = 0.975
"""The default ``router.admission.queue_confidence``: a queued request is late about once
in 40 at the edge, and far less often below it."""
SPREAD_Z = NormalDist().inv_cdf(CONFIDENCE)
"""Spreads above the mean wait at :data:`CONFIDENCE` (1.96)."""


class Pace:
    """The rates of one router process's queue (its clock: ``clock``)."""

    def __init__(
        self, classes: int, clock: Callable[[], float], confidence: float = CONFIDENCE
    ) -> None:
        self.clock = clock
        self.z = NormalDist().inv_cdf(confidence)
        """Spreads above the mean wait that the predicted wait takes."""
        self._t = clock()
        self._queueing = False
        self._queued_s = 0.0
        """Seconds with requests queued, decayed."""
        self._freed = 0.0
        """Places that freed to the queue (requests admitted from it), decayed."""
        self._taken = [0.0] * classes
        """Per class rank, requests admitted or queued while requests queued, decayed."""
        self._recent = [0.0] * classes
        """Per class rank, requests admitted or queued, queue or not, decayed over
        :data:`RECENT_S`."""
        self._released = 0.0
        """Places freed by the requests holding them, queue or not, decayed over
        :data:`RECENT_S`."""

    def _age(self) -> None:
        now = self.clock()
        dt = now - self._t
        if dt <= 0:
            return
        self._t = now
        keep = math.exp(-dt / TAU_S)
        grown = TAU_S * (1 - keep)  # the decayed weight of the dt seconds just past
        self._queued_s = self._queued_s * keep + (grown if self._queueing else 0.0)
        self._freed *= keep
        self._taken = [x * keep for x in self._taken]
        brief = math.exp(-dt / RECENT_S)
        self._recent = [x * brief for x in self._recent]
        self._released *= brief

    def queueing(self, now_queueing: bool) -> None:
        """The queue became empty or not (call after every change to it)."""
        self._age()
        self._queueing = now_queueing

    def taken(self, rank: int) -> None:
        """A request of class ``rank`` was let in (admitted at once or queued); it counts
        only while requests queue (call after :meth:`queueing` for one queued)."""
        self._age()
        self._recent[rank] += 1
        if self._queueing:
            self._taken[rank] += 1

    def freed(self) -> None:
        """A place freed to the queue: a queued request was admitted."""
        self._age()
        self._freed += 1

    def released(self) -> None:
        """A request let in gave its place back (answered, failed or cancelled)."""
        self._age()
        self._released += 1

    def outpaced(self, rank: int) -> bool:
        """Over about the last :data:`RECENT_S`, queue or not, classes higher than
        ``rank`` were let in :data:`OUTPACED_BY` or more times beyond the places that
        freed: the onset of an overload they drive, when a queue has just formed and
        none of them has been seen overtaking it yet (:meth:`overtaken`), but they fill
        the places faster than places free."""
        self._age()
        return sum(self._recent[:rank]) >= self._released + OUTPACED_BY

    def overtaken(self, rank: int, least: float) -> bool:
        """Classes higher than ``rank`` were let in while requests queued: at least
        ``least`` of them (decayed)."""
        self._age()
        return sum(self._taken[:rank]) >= least

    @property
    def seen_s(self) -> float:
        """Seconds with requests queued, decayed: what the rates were measured over."""
        self._age()
        return self._queued_s

    def rates(self, rank: int) -> tuple[float, float] | None:
        """(places freeing per second while requests queue, places per second taken by
        classes higher than ``rank`` meanwhile), or None while the pace is unknown."""
        self._age()
        if self._queued_s < MIN_QUEUED_S:
            return None
        # one place more than seen: a queue where none freed yet still predicts a wait
        mu = (self._freed + 1) / self._queued_s
        lam = sum(self._taken[:rank]) / self._queued_s
        return mu, lam

    def wait_s(self, rank: int, ahead: int) -> float | None:
        """Predicted seconds in the queue for a request of class ``rank`` with ``ahead``
        requests of its class or higher queued before it, the one it beats with the pace's
        confidence (``inf``: never, the higher classes take the places); None while the
        pace is unknown."""
        r = self.rates(rank)
        if r is None:
            return None
        mu, lam = r
        room = mu - lam
        if room <= mu * STARVED:
            return math.inf
        n = ahead + 1
        known = 1 + n / (room * self._queued_s)  # the rates' own error (the docstring)
        return (n + self.z * math.sqrt(n * (mu + lam) / room * known)) / room
