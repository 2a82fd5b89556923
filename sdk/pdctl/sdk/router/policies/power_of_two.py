"""``power_of_two``: two candidates at random, the less loaded of them."""

from __future__ import annotations

import random

from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.policies.base import Policy


class PowerOfTwo(Policy):
    name = "power_of_two"

    def pick(self, cands: list[Upstream], scores: dict[str, float] | None) -> Upstream:
        a, b = random.sample(cands, 2)
        return a if a.outstanding <= b.outstanding else b
