"""Selection policies as objects: the registry knows every name the spec accepts, refuses
others by listing the known ones, and each policy picks as its name says."""

from __future__ import annotations

import itertools
import typing

import pytest

from pdctl.sdk.router.httpclient import Pool
from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.policies import POLICIES, candidates, make_policy, policy_class
from pdctl.sdk.router.policies.cache_aware import CacheAwarePolicy
from pdctl.sdk.router.policies.least_loaded import LeastLoaded
from pdctl.sdk.router.policies.power_of_two import PowerOfTwo
from pdctl.sdk.router.policies.round_robin import RoundRobin
from pdctl.sdk.router.replies import RouteError
from pdctl.sdk.spec.base import RouterPolicy


def ups(*loads: int) -> list[Upstream]:
    out = []
    for i, n in enumerate(loads):
        url = f"http://127.0.0.1:{9000 + i}"
        u = Upstream(f"d{i}", "decode", url, Pool(url))
        u.outstanding = n
        out.append(u)
    return out


def test_the_registry_has_exactly_the_spec_names():
    assert set(POLICIES) == set(typing.get_args(RouterPolicy))
    for name, cls in POLICIES.items():
        assert cls.name == name
        assert make_policy(name).name == name


def test_an_unknown_name_fails_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown router\.policy 'fastest'") as e:
        policy_class("fastest")
    for name in POLICIES:
        assert name in str(e.value)


def test_policies_share_the_turns_they_are_given():
    turns = itertools.count(5)
    a, b = make_policy("round_robin", turns), make_policy("least_loaded", turns)
    assert a.turns is b.turns is turns


def test_round_robin_takes_turns():
    pool = ups(0, 9, 0)
    rr = RoundRobin(itertools.count())
    assert [rr.choose(pool).name for _ in range(4)] == ["d0", "d1", "d2", "d0"]


def test_least_loaded_takes_the_idlest_ties_in_turn():
    pool = ups(3, 1, 1)
    ll = LeastLoaded(itertools.count())
    assert [ll.choose(pool).name for _ in range(3)] == ["d1", "d2", "d1"]


def test_power_of_two_never_takes_the_busier_of_two():
    pool = ups(5, 0)
    p2 = PowerOfTwo()
    assert {p2.choose(pool).name for _ in range(20)} == {"d1"}


def test_cache_aware_takes_the_best_score_and_without_scores_the_idlest():
    pool = ups(0, 2, 0)
    ca = CacheAwarePolicy(itertools.count())
    assert ca.uses_scores
    assert not LeastLoaded.uses_scores
    assert ca.choose(pool, scores={"d0": 0.1, "d1": 0.9, "d2": 0.1}).name == "d1"
    assert ca.choose(pool, scores={"d0": 0.5, "d1": 0.0, "d2": 0.5}).name in ("d0", "d2")
    assert ca.choose(pool).name in ("d0", "d2")


def test_no_candidate_is_503_naming_the_drained():
    pool = ups(0, 0)
    pool[0].drained = True
    pool[1].healthy = False
    with pytest.raises(RouteError, match=r"no healthy decode instance available \(drained: d0\)"):
        candidates(pool)
    for cls in POLICIES.values():
        with pytest.raises(RouteError) as e:
            cls().choose(pool)
        assert e.value.status == 503


def test_excluded_and_open_breakers_are_not_candidates():
    pool = ups(0, 0, 0)
    for _ in range(5):
        pool[1].breaker.failure()
    assert [u.name for u in candidates(pool, exclude=(pool[2],))] == ["d0"]


def test_place_chooses_decode_then_prefill_or_decode_alone():
    decodes, prefills = ups(3, 1), ups(0, 2)
    for u in prefills:
        u.role = "prefill"
    ll = LeastLoaded()
    d, p = ll.place(decodes, prefills)
    assert (d.name, p.name if p else None) == ("d1", "d0")
    d, p = ll.place(decodes, prefills, alone_on={"d1"})  # few tokens uncached on d1
    assert (d.name, p) == ("d1", None)
    d, p = ll.place(decodes, prefills, alone_on={"d0"})  # not the chosen decode
    assert p is not None
    assert ll.place(decodes, None) == (decodes[1], None)  # colocated, or decode-only asked
    for u in prefills:
        u.healthy = False
    with pytest.raises(RouteError, match="no healthy prefill"):
        ll.place(decodes, prefills)
