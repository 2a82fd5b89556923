"""``least_loaded``: the candidate with the fewest legs in flight (ties in turn)."""

from __future__ import annotations

from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.policies.base import Policy


class LeastLoaded(Policy):
    name = "least_loaded"

    def pick(self, cands: list[Upstream], scores: dict[str, float] | None) -> Upstream:
        return self.least_loaded(cands)
