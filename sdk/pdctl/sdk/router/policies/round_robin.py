"""``round_robin``: the candidates in turn."""

from __future__ import annotations

from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.policies.base import Policy


class RoundRobin(Policy):
    name = "round_robin"

    def pick(self, cands: list[Upstream], scores: dict[str, float] | None) -> Upstream:
        return cands[next(self.turns) % len(cands)]
