"""The router queue's pace (router/pace.py): places freeing while requests queue, the
classes' rates, a queued request's predicted wait; on a clock the test moves."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from pdctl.sdk.router.pace import MIN_QUEUED_S, RECENT_S, SPREAD_Z, TAU_S, Pace


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def steady(mu: float, lams: tuple[float, ...], seconds: float = 10 * TAU_S) -> Pace:
    """A pace that saw a queue all along, places freeing at ``mu`` per second and the
    classes (highest first) let in at ``lams`` per second, in 10 ms steps."""
    clock = Clock()
    p = Pace(len(lams), clock)
    p.queueing(True)
    step = 0.01
    due = [0.0] * (len(lams) + 1)
    for _ in range(int(seconds / step)):
        clock.t += step
        for i, rate in enumerate((mu, *lams)):
            due[i] += rate * step
            while due[i] >= 1:
                due[i] -= 1
                p.freed() if i == 0 else p.taken(i - 1)
    return p


def test_unknown_until_requests_have_queued_a_while():
    clock = Clock()
    p = Pace(3, clock)
    assert p.wait_s(0, 0) is None
    clock.t += 60  # time without a queue teaches nothing of the queue's pace
    assert p.wait_s(0, 0) is None
    p.queueing(True)
    clock.t += MIN_QUEUED_S / 2
    assert p.wait_s(0, 0) is None
    clock.t += MIN_QUEUED_S
    assert p.wait_s(0, 0) is not None


def test_steady_rates_are_measured():
    p = steady(10.0, (4.0, 3.0, 2.0))
    r = p.rates(2)
    assert r is not None
    mu, lam = r
    assert mu == pytest.approx(10.0, rel=0.05)
    assert lam == pytest.approx(7.0, rel=0.05)  # the two higher classes
    assert p.rates(0) == pytest.approx((mu, 0.0))


def test_wait_counts_the_places_ahead_and_the_higher_classes_meanwhile():
    p = steady(10.0, (4.0, 3.0, 2.0))
    top, mid, low = (p.wait_s(r, 4) for r in range(3))
    assert top is not None
    assert mid is not None
    assert low is not None
    seen = p.seen_s
    assert seen == pytest.approx(TAU_S, rel=0.01)

    def wait(mu: float, lam: float) -> float:
        """Five places left to it at mu - lam, the spread of a first passage, widened
        by what the rates' counts over ``seen`` seconds do not know."""
        r = mu - lam
        return (5 + SPREAD_Z * math.sqrt(5 * (mu + lam) / r * (1 + 5 / r / seen))) / r

    assert top == pytest.approx(wait(10, 0), rel=0.05)  # at 10/s
    assert mid == pytest.approx(wait(10, 4), rel=0.05)  # 4/s of them go to the top class
    assert low == pytest.approx(wait(10, 7), rel=0.05)
    # a class left the remnant of the places waits far less surely than its mean says
    means = (5 / 10, 5 / 6, 5 / 3)
    spreads = [(w - m) / m for w, m in zip((top, mid, low), means, strict=True)]
    assert spreads[0] < spreads[1] < spreads[2]


def test_the_wait_predicted_is_the_one_beaten_with_the_confidence_asked():
    clock = Clock()
    waits: dict[float, float] = {}
    for confidence in (0.5, 0.975, 0.99):
        p = Pace(1, clock, confidence)
        p.queueing(True)
        for _ in range(100):  # 10 places freeing per second for 10 s
            clock.t += 0.1
            p.freed()
        rates = p.rates(0)
        assert rates is not None
        mu, seen = rates[0], p.seen_s
        z = NormalDist().inv_cdf(confidence)
        w = p.wait_s(0, 3)
        assert w is not None
        waits[confidence] = w
        assert w == pytest.approx((4 + z * math.sqrt(4 * (1 + 4 / mu / seen))) / mu)
        if confidence == 0.5:
            assert w == pytest.approx(4 / mu)  # the mean wait
    assert waits[0.5] < waits[0.975] < waits[0.99]
    assert NormalDist().inv_cdf(0.975) == pytest.approx(SPREAD_Z)


def test_higher_classes_let_in_with_no_queue_overtake_no_one():
    """The rates count only the seconds with requests queued: a higher class let in at
    once while nothing waited, or time without a queue, changes no class's wait."""
    clock = Clock()
    p = Pace(2, clock)
    for _ in range(100):  # a busy top class, never queued
        clock.t += 0.01
        p.taken(0)
    p.queueing(True)
    for _ in range(100):  # then a queue, places freeing at 10/s, nothing else let in
        clock.t += 0.1
        p.freed()
    assert p.rates(1) == pytest.approx(p.rates(0))
    assert p.wait_s(1, 0) == p.wait_s(0, 0)
    p.queueing(False)
    before = p.rates(1)
    clock.t += 3  # seconds without a queue: the rates it knew still hold
    assert p.rates(1) == pytest.approx(before, rel=0.05)


def test_a_pace_seen_briefly_predicts_longer_waits():
    """The same rates counted over fewer seconds of queueing are known less well: the
    wait predicted is longer."""
    brief, long_ = steady(10.0, (4.0, 2.0), seconds=2.0), steady(10.0, (4.0, 2.0))
    b, lg = brief.wait_s(1, 2), long_.wait_s(1, 2)
    assert b is not None
    assert lg is not None
    assert b > lg


def test_a_class_whose_betters_take_every_place_waits_for_ever():
    p = steady(10.0, (6.0, 4.5, 2.0))
    assert p.wait_s(2, 0) == math.inf
    mid = p.wait_s(1, 0)
    assert mid is not None
    assert math.isfinite(mid)


def test_the_rates_forget_an_old_load():
    clock = Clock()
    p = Pace(1, clock)
    p.queueing(True)
    for _ in range(200):  # 2 s at 100 places per second
        clock.t += 0.01
        p.freed()
    fast = p.wait_s(0, 0)
    p.queueing(True)
    for _ in range(int(10 * TAU_S)):  # then one a second, for a long while
        clock.t += 1
        p.freed()
    slow = p.wait_s(0, 0)
    assert fast is not None
    assert slow is not None
    assert slow > 20 * fast
    one = 1 + SPREAD_Z  # one place, and its spread
    assert slow == pytest.approx(one, rel=0.15)  # the one place more than seen: 10%


async def test_loop_lag_sees_a_loop_held_up():
    """A loop blocked for 60 ms wakes the sampler at least 50 ms late (its 10 ms sleep
    started before the block); stopped, it samples no more."""
    import asyncio
    import time

    from pdctl.sdk.router.looplag import LoopLag

    lags: list[float] = []
    async with LoopLag(lags.append, period_s=0.01) as lag:
        await asyncio.sleep(0.03)
        time.sleep(0.06)  # noqa: ASYNC251 - the loop held up on purpose
        await asyncio.sleep(0.03)
    assert max(lags) >= 0.05
    seen = len(lags)
    await asyncio.sleep(0.05)
    assert len(lags) == seen
    await lag.stop()  # stopping twice is harmless


def test_higher_classes_filling_places_faster_than_they_free_outpace_the_lower():
    """Over about the last second, queue or not: higher classes let in two or more times
    beyond the places that freed outpace a lower class; a class is never outpaced by
    itself or by lower ones, and a burst is forgotten within seconds."""
    clock = Clock()
    p = Pace(3, clock)
    for _ in range(10):  # an idle fleet filled by the top class in 0.2 s
        clock.t += 0.02
        p.taken(0)
    assert p.outpaced(1)
    assert p.outpaced(2)
    assert not p.outpaced(0)
    for _ in range(10):  # the places free as fast: even again
        p.released()
    assert not p.outpaced(1)
    clock.t += 5.0
    for _ in range(50):  # a light load: places free faster than the top class takes them
        clock.t += 0.1
        p.taken(0)
        p.released()
        p.released()
    assert not p.outpaced(2)
    q = Pace(3, clock)
    for _ in range(5):  # a burst of standard requests: batch is outpaced, standard not
        q.taken(1)
    assert q.outpaced(2)
    assert not q.outpaced(1)
    clock.t += 5 * RECENT_S
    assert not q.outpaced(2)  # forgotten
