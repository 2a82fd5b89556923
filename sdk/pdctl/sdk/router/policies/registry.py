"""The spec's ``router.policy`` names and the policy classes they stand for."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.sdk.router.policies.base import Policy
from pdctl.sdk.router.policies.cache_aware import CacheAwarePolicy
from pdctl.sdk.router.policies.least_loaded import LeastLoaded
from pdctl.sdk.router.policies.power_of_two import PowerOfTwo
from pdctl.sdk.router.policies.round_robin import RoundRobin

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (RoundRobin, LeastLoaded, PowerOfTwo, CacheAwarePolicy)
}
"""Every policy by its ``router.policy`` name."""


def policy_class(name: str) -> type[Policy]:
    """The class of the policy called ``name``; ValueError naming the known ones."""
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown router.policy {name!r} (known policies: {', '.join(POLICIES)})")
    return cls


def make_policy(name: str, turns: Iterator[int] | None = None) -> Policy:
    """A fresh policy object for ``name`` (sharing ``turns``, the tie-break order)."""
    return policy_class(name)(turns)
