"""Selection policies, one file each, picked by name from the registry."""

from pdctl.sdk.router.policies.base import Policy, candidates
from pdctl.sdk.router.policies.registry import POLICIES, make_policy, policy_class

__all__ = ["POLICIES", "Policy", "candidates", "make_policy", "policy_class"]
