"""The restart policy and liveness rules, on an explicit clock (no sleeping)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pdctl.sdk.fleet.policy import MAX_BACKOFF_S, Liveness, RestartPolicy, RestartTracker
from pdctl.sdk.fleetplan import build_plan, router_plan, split_cores
from pdctl.sdk.spec import FleetSpec


def spec(**group: object) -> FleetSpec:
    return FleetSpec(
        model={"path": "org/m"},
        prefill=[{"http_port": 8100, **group}],
        decode=[{"http_port": 8200}],
        router={},
    )


def test_backoff_doubles_and_is_capped():
    t = RestartTracker(RestartPolicy(backoff_s=1.0, max_restarts=10, window_s=10_000))
    delays = [t.on_failure(float(i)).delay_s for i in range(8)]
    assert delays == [1, 2, 4, 8, 16, 32, MAX_BACKOFF_S, MAX_BACKOFF_S]


def test_gives_up_after_max_restarts_in_the_window_and_forgets_old_ones():
    t = RestartTracker(RestartPolicy(backoff_s=0.5, max_restarts=2, window_s=10))
    assert t.on_failure(0).restart
    second = t.on_failure(1)
    assert (second.restart, second.delay_s) == (True, 1.0)
    third = t.on_failure(2)
    assert not third.restart
    assert "crash loop: 2 restarts in 10 s; restart policy gave up" in third.message
    # the first restart (t=0) leaves the window at t=10: one more is allowed, and its
    # backoff counts only the restart still inside
    later = t.on_failure(10)
    assert (later.restart, later.delay_s) == (True, 1.0)


def test_never_restarts_nothing_and_reset_forgets_the_count():
    assert not RestartTracker(RestartPolicy(mode="never")).on_failure(0).restart
    t = RestartTracker(RestartPolicy(max_restarts=1, window_s=100))
    assert t.on_failure(0).restart
    assert not t.on_failure(1).restart
    t.reset()
    assert t.on_failure(2).restart


def test_liveness_5xx_in_a_row_is_a_dead_engine():
    lv = Liveness(errors_to_fail=3, silent_s=30)
    assert lv.observe(503, 0) is None
    assert lv.observe(200, 1) is None  # an answer in between starts the count again
    assert lv.observe(503, 2) is None
    assert lv.observe(500, 3) is None
    why = lv.observe(503, 4)
    assert why is not None
    assert "503 3 times in a row" in why


def test_liveness_silence_counts_only_after_silent_s():
    lv = Liveness(silent_s=30)
    lv.reset(100)
    assert lv.observe(None, 110) is None
    assert lv.observe(None, 129) is None
    why = lv.observe(None, 131)
    assert why is not None
    assert "has not answered for 31 s" in why
    lv.reset(200)
    assert lv.observe(None, 201) is None


def test_router_liveness_ignores_its_503():
    lv = Liveness(errors_to_fail=1, http_errors_are_fatal=False)
    lv.reset(0)
    assert all(lv.observe(503, float(t)) is None for t in range(100))


def test_policy_comes_from_the_group_and_the_router_gets_the_default():
    s = spec(restart="never")
    plan = build_plan(s)
    assert RestartPolicy.for_plan(s, plan.by_name("prefill-0")).mode == "never"
    s = spec(restart_backoff_s=3, max_restarts=2, restart_window_s=60)
    p = RestartPolicy.for_plan(s, build_plan(s).by_name("prefill-0"))
    assert p == RestartPolicy("on-failure", 3.0, 2, 60.0)
    assert p.describe() == "on-failure (max 2 in 60 s)"
    d = RestartPolicy.for_plan(s, build_plan(s).by_name("decode-0"))
    assert d == RestartPolicy()
    rp = router_plan(s, ("router",))
    assert rp is not None
    assert RestartPolicy.for_plan(s, rp) == RestartPolicy()


@pytest.mark.parametrize(
    ("group", "field"),
    [
        ({"restart": "always"}, "restart"),
        ({"max_restarts": 0}, "max_restarts"),
        ({"restart_backoff_s": 0}, "restart_backoff_s"),
        ({"restart_window_s": -1}, "restart_window_s"),
    ],
)
def test_bad_policy_fields_are_named(group, field):
    with pytest.raises(ValidationError) as e:
        spec(**group)
    assert field in str(e.value)


@pytest.mark.parametrize(
    ("cores", "count", "want"),
    [
        ([0], 2, [(0,), (0,)]),
        ([0, 1], 3, [(0,), (0,), (1,)]),
        ([0, 1, 2], 2, [(0,), (1, 2)]),
        ([4, 5, 6, 7], 2, [(4, 5), (6, 7)]),
        (None, 2, [(), ()]),
    ],
)
def test_cores_split_as_evenly_as_they_go(cores, count, want):
    assert split_cores(cores, count) == want
