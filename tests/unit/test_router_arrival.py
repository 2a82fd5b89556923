"""The router's arrival decision (router/arrival.py): a request that finds no room is
queued only when its class has room in the queue and it is predicted to be served in
time; while the queue's pace is unknown, a lower class already overtaken is not queued.
On a pace whose clock the test moves."""

from __future__ import annotations

import math

from pdctl.sdk.router.arrival import RESERVE, predicted_late, share_of, share_refusal
from pdctl.sdk.router.pace import MIN_QUEUED_S, Pace


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def known(mu: float, lams: tuple[float, float, float], seconds: float = 20.0) -> Pace:
    """A pace that saw a queue for ``seconds``: places freeing at ``mu`` per second and
    the three classes (highest first) let in at ``lams`` per second."""
    clock = Clock()
    p = Pace(3, clock)
    p.queueing(True)
    due = [0.0] * 4
    for _ in range(int(seconds / 0.01)):
        clock.t += 0.01
        for i, rate in enumerate((mu, *lams)):
            due[i] += rate * 0.01
            while due[i] >= 1:
                due[i] -= 1
                p.freed() if i == 0 else p.taken(i - 1)
    return p


def test_each_class_keeps_a_share_from_the_classes_below():
    assert RESERVE == 0.25
    assert [share_of(64, r) for r in range(3)] == [64, 48, 32]
    assert [share_of(2, r) for r in range(3)] == [2, 2, 2]  # too small to keep any
    assert share_refusal(64, 2, 31, lower=False, klass="batch") is None
    no = share_refusal(64, 2, 32, lower=False, klass="batch")
    assert no is not None
    assert (no.status, no.slo) == (429, False)
    assert "32 kept for higher classes" in no.why
    assert share_refusal(64, 1, 40, lower=False, klass="standard") is None
    # past its share, but a lower class waits: never refused while a lower one waits
    assert share_refusal(64, 1, 60, lower=True, klass="standard") is None
    assert share_refusal(64, 0, 63, lower=False, klass="interactive") is None
    full = share_refusal(64, 0, 64, lower=False, klass="interactive")
    assert full is not None
    assert full.status == 429
    assert "kept" not in full.why


def test_a_class_left_the_remnant_is_shed_at_arrival_where_the_top_one_is_queued():
    """At a pace where the top class takes 8 of 10 places, a standard request with the
    same time left as an interactive one is refused (503 slo_unreachable) and the
    interactive one queued; without a deadline, max_queue_wait_s bounds the wait."""
    p = known(10.0, (8.0, 6.0, 4.0))
    top, mid = p.wait_s(0, 0), p.wait_s(1, 0)
    assert top is not None
    assert mid is not None
    left = (top + mid) / 2
    assert predicted_late(p, 0, 0, False, left, 0.0, 10.0, 1.1) is None
    no = predicted_late(p, 1, 0, False, left, 0.0, 10.0, 1.1)
    assert no is not None
    assert (no.status, no.slo) == (503, True)
    assert "predicted queue wait" in no.why
    # the time to a first byte once placed counts too
    assert predicted_late(p, 0, 0, False, top * 1.2, top, 10.0, 1.1) is not None
    # the lowest class: the two above take every place that frees
    low = predicted_late(p, 2, 0, True, 60.0, 0.0, 100.0, 1.1)
    assert low is not None
    assert "take every place" in low.why
    assert p.wait_s(2, 0) == math.inf
    over = predicted_late(p, 1, 0, False, None, 0.0, mid, 1.1)
    assert over is not None
    assert (over.status, over.slo) == (503, False)
    assert "max_queue_wait_s" in over.why


def test_an_unknown_pace_queues_unless_a_lower_class_is_being_overtaken():
    """Before the pace is known nothing is predicted: the top class queues, and a lower
    class queues until a higher one has been let in while requests queue — then it is
    refused, unless a lower class than it waits (it is never refused before one)."""
    clock = Clock()
    p = Pace(3, clock)
    p.queueing(True)
    p.taken(2)  # a batch request queued: nothing above it yet
    assert p.wait_s(2, 0) is None
    assert predicted_late(p, 2, 1, False, 10.0, 0.0, 10.0, 1.1) is None
    assert predicted_late(p, 1, 0, True, 3.0, 0.0, 10.0, 1.1) is None
    p.taken(0)  # an interactive one queued: it takes the next place that frees
    assert predicted_late(p, 0, 1, True, 1.5, 0.0, 10.0, 1.1) is None
    no = predicted_late(p, 2, 1, False, 10.0, 0.0, 10.0, 1.1)
    assert no is not None
    assert (no.status, no.slo) == (503, True)
    assert "cannot be predicted yet" in no.why
    plain = predicted_late(p, 2, 1, False, None, 0.0, 10.0, 1.1)  # no deadline
    assert plain is not None
    assert (plain.status, plain.slo) == (503, False)
    # a standard request is overtaken too, but a batch one waits: it is queued
    assert predicted_late(p, 1, 1, True, 3.0, 0.0, 10.0, 1.1) is None
    assert predicted_late(p, 1, 1, False, 3.0, 0.0, 10.0, 1.1) is not None
    clock.t += 2 * MIN_QUEUED_S  # the pace is known: predicted from here on
    assert p.wait_s(1, 0) is not None


def test_an_unknown_pace_refuses_a_lower_class_outpaced_at_the_onset():
    """A queue that has just formed: no higher class has been let in while it queued,
    but over the last second higher classes filled the places faster than they freed
    (the onset of an overload they drive): a lower class is refused at arrival, the top
    class and one with a lower class waiting below it are queued."""
    clock = Clock()
    p = Pace(3, clock)
    for _ in range(6):  # six interactive requests took the idle places at once
        clock.t += 0.01
        p.taken(0)
    p.queueing(True)  # the queue forms; nothing let in while it queues yet
    assert p.wait_s(2, 0) is None
    assert not p.overtaken(2, 0.5)
    no = predicted_late(p, 2, 0, False, 10.0, 0.0, 10.0, 1.1)
    assert no is not None
    assert (no.status, no.slo) == (503, True)
    assert "cannot be predicted yet" in no.why
    assert predicted_late(p, 1, 0, True, 3.0, 0.0, 10.0, 1.1) is None  # batch waits below
    assert predicted_late(p, 0, 0, False, 1.5, 0.0, 10.0, 1.1) is None
    for _ in range(6):  # the places free as fast as they were taken: nothing outpaces
        p.released()
    assert predicted_late(p, 2, 0, False, 10.0, 0.0, 10.0, 1.1) is None
