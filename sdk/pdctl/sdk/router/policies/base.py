"""What a selection policy is: an object that picks one instance among the eligible ones.

The instance set (:mod:`pdctl.sdk.router.instanceset`) holds one policy, swaps it when an
operator asks, and calls :meth:`Policy.place` for a request's pair (:meth:`Policy.choose`
for one role); each policy lives in its own file of this
package and :mod:`pdctl.sdk.router.policies.registry` maps the spec's ``router.policy``
names to them.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator, Sequence
from typing import ClassVar

from pdctl.sdk.router.instances import Upstream
from pdctl.sdk.router.replies import RouteError


def candidates(pool: Sequence[Upstream], exclude: tuple[Upstream, ...] = ()) -> list[Upstream]:
    """The eligible, undrained instances of ``pool`` not in ``exclude``; 503 when none."""
    cands = [u for u in pool if u.eligible() and not u.drained and u not in exclude]
    if not cands:
        role = pool[0].role if pool else "instance"
        drained = [u.name for u in pool if u.drained]
        why = f" (drained: {', '.join(drained)})" if drained else ""
        raise RouteError(503, f"no healthy {role} instance available{why}", "service_unavailable")
    return cands


class Policy:
    """Picks one instance of a pool. ``turns`` breaks ties in turn (round robin's own
    order, and the tie-break of the load-based policies)."""

    name: ClassVar[str] = ""
    uses_scores: ClassVar[bool] = False
    """True when the policy reads per-instance scores (the router then computes them)."""

    def __init__(self, turns: Iterator[int] | None = None) -> None:
        self.turns: Iterator[int] = turns if turns is not None else itertools.count()

    def choose(
        self,
        pool: Sequence[Upstream],
        exclude: tuple[Upstream, ...] = (),
        scores: dict[str, float] | None = None,
    ) -> Upstream:
        """One eligible, undrained instance of ``pool`` (not in ``exclude``); 503 when none."""
        cands = candidates(pool, exclude)
        if len(cands) == 1:
            return cands[0]
        return self.pick(cands, scores)

    def place(
        self,
        decodes: Sequence[Upstream],
        prefills: Sequence[Upstream] | None,
        d_scores: dict[str, float] | None = None,
        p_scores: dict[str, float] | None = None,
        alone_on: Collection[str] = (),
    ) -> tuple[Upstream, Upstream | None]:
        """A request's decode and its prefill, one choice per role, decode first; no
        prefill when ``prefills`` is None or the chosen decode is in ``alone_on`` (the
        decodes on which the prompt goes to decode alone); 503 when a role has none."""
        d = self.choose(decodes, (), d_scores)
        if prefills is None or d.name in alone_on:
            return d, None
        return d, self.choose(prefills, (), p_scores)

    def pick(self, cands: list[Upstream], scores: dict[str, float] | None) -> Upstream:
        """The choice among two or more candidates."""
        raise NotImplementedError

    def least_loaded(self, cands: list[Upstream]) -> Upstream:
        """The candidate with the fewest legs in flight (ties in turn)."""
        low = min(u.outstanding for u in cands)
        best = [u for u in cands if u.outstanding == low]
        return best[next(self.turns) % len(best)]
