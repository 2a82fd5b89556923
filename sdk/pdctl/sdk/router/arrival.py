"""Whether a request that finds no room in the fleet joins the router's queue: the
decision :class:`~pdctl.sdk.router.admission.Admission` makes at its arrival, meant to
be final — what is queued is served (with high probability), what is not is answered at
once. Pure functions of the queue's counts and pace; the admission answers.

A request of class rank ``r`` (0: the highest) is refused at arrival when

1. **its class's share of the queue is full** (:func:`share_refusal`): each class keeps
   :data:`RESERVE` of the queue from each class below it, so a class of rank ``r`` joins
   only while the queue holds fewer than :func:`share_of` requests — unless a lower
   class waits in it, for a higher class is never refused while a lower one waits. The
   places kept let a higher class in at a busy queue without evicting a lower class
   already promised its place (eviction stays the admission's last resort, at a queue
   full to its last place);
2. **its wait cannot be foreseen and it is already being overtaken**
   (:func:`predicted_late`): while the queue's pace is unknown (:mod:`.pace`: too few
   seconds of queueing seen), a request of a class below the highest is refused if
   higher classes have been let in while requests queued, or over the last second have
   been let in faster than places freed (:meth:`.pace.Pace.outpaced`: a queue that has
   just formed), and no lower class waits: the onset of overload, when the higher
   classes may take every place that frees for as long as they arrive, is when a lower
   class's promise would be least safe;
3. **it is predicted to be late** (:func:`predicted_late`): its predicted queue wait
   (:meth:`.pace.Pace.wait_s`, the wait beaten ``queue_confidence`` of the time, counting
   the higher classes that will overtake it) plus its predicted time to a first byte once
   placed, times ``margin``, passes its first-byte time left, or the wait times ``margin`` passes
   ``max_queue_wait_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdctl.sdk.router.pace import Pace

RESERVE = 0.25
"""The share of the queue each class keeps from each class below it (:func:`share_of`)."""
OVERTAKEN = 0.5
"""Higher-class requests let in while requests queued (decayed) from which a lower class
is taken to be overtaken while the pace is unknown: about one, recently."""


@dataclass(frozen=True)
class Refusal:
    """Why a request is not queued: its status, whether its reason is
    ``slo_unreachable`` (else the saturated stage's), and the words."""

    status: int
    slo: bool
    why: str


def share_of(cap: int, rank: int) -> int:
    """The queue's length below which a request of class ``rank`` may join a queue of
    ``cap`` places: ``cap`` less :data:`RESERVE` of it (rounded down) for each class
    above (a queue of 1 to 3 places keeps none)."""
    return cap - math.floor(cap * RESERVE) * rank


def share_refusal(cap: int, rank: int, queued: int, lower: bool, klass: str) -> Refusal | None:
    """429 when a queue of ``cap`` places holding ``queued`` has no room for class
    ``rank`` (its share, or the whole queue) and no lower class waits (``lower``)."""
    share = share_of(cap, rank)
    if queued < share or lower:
        return None
    kept = f", {cap - share} kept for higher classes" if share < cap else ""
    return Refusal(
        429, False, f"the router's queue is full for class {klass} ({queued} waiting{kept})"
    )


def predicted_late(
    pace: Pace,
    rank: int,
    ahead: int,
    lower: bool,
    left_s: float | None,
    service_s: float,
    max_wait_s: float,
    margin: float,
) -> Refusal | None:
    """The refusal of a request of class ``rank`` that would queue with ``ahead`` of its
    class or higher before it (``lower``: a lower class waits), ``left_s`` to its
    first-byte deadline (None: none) and ``service_s`` predicted from its place to its
    first byte; None when it queues. ``margin``: ``1 + slo_margin``."""
    wait = pace.wait_s(rank, ahead)
    if wait is None:
        if rank == 0 or lower:
            return None
        if not (pace.overtaken(rank, OVERTAKEN) or pace.outpaced(rank)):
            return None
        why = (
            "its queue wait cannot be predicted yet (the queue's pace is not known) and "
            "higher classes are taking the places that free"
        )
        return Refusal(503, left_s is not None, why)
    if left_s is not None and (wait + service_s) * margin > left_s:
        how = (
            "the higher classes take every place that frees"
            if math.isinf(wait)
            else f"{ahead} ahead: {wait * 1000:.0f} ms in the queue"
        )
        why = (
            f"its predicted queue wait ({how}) and {service_s * 1000:.0f} ms to a "
            f"first byte pass the {max(0.0, left_s) * 1000:.0f} ms it has left"
        )
        return Refusal(503, True, why)
    if wait * margin > max_wait_s:
        why = f"its predicted queue wait ({ahead} ahead) passes max_queue_wait_s ({max_wait_s:g} s)"
        return Refusal(503, False, why)
    return None
