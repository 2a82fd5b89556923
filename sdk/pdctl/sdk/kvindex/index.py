"""Which prefix-cache blocks each instance holds, as far as the router knows.

Per instance, two views:

* **exact** — the block keys the instance announced in its KV events (``BlockStored``
  adds, ``BlockRemoved`` drops, ``AllBlocksCleared`` empties), fed by
  :mod:`pdctl.sdk.kvindex.subscriber`;
* **routed** — the blocks of the prompts the router itself sent there, most recent
  last, bounded (LRU). With events on, routed blocks younger than ``speculative_s``
  count too (a prompt just sent is being cached; its events are not in yet), so a burst
  of one prefix stays on one instance. Without events it is the whole view: the
  approximate mode, as Dynamo's router does from its own routing history.

Each instance's view has a state: ``EXACT`` (events flowing, none missed),
``DEGRADED`` (events lagging or lost: exact view plus the whole routed history until
a resync), ``FALLBACK`` (no events at all: routed history only).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pdctl.sdk.kvindex.hashing import event_key

IndexState = Literal["EXACT", "DEGRADED", "FALLBACK"]
STATES: tuple[IndexState, ...] = ("EXACT", "DEGRADED", "FALLBACK")


@dataclass
class InstanceIndex:
    """One instance's known blocks and the state of that knowledge."""

    name: str
    state: IndexState = "FALLBACK"
    reason: str = "no KV events"
    exact: set[int] = field(default_factory=set)
    routed: OrderedDict[int, float] = field(default_factory=OrderedDict)
    routed_capacity: int = 100_000
    speculative_s: float = 2.0
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    hash_mismatches: int = 0
    last_event: float | None = None
    since: float = field(default_factory=time.monotonic)

    def set_state(self, state: IndexState, reason: str) -> bool:
        """Change state; True when it changed."""
        self.reason = reason
        if state == self.state:
            return False
        self.state = state
        self.since = time.monotonic()
        return True

    # ------------------------------------------------------------------ events

    def store(self, keys: Iterable[bytes | int]) -> None:
        for k in keys:
            self.exact.add(event_key(k))
            self.stored += 1

    def remove(self, keys: Iterable[bytes | int]) -> None:
        for k in keys:
            self.exact.discard(event_key(k))
            self.removed += 1

    def clear(self) -> None:
        self.exact.clear()
        self.cleared += 1

    # ------------------------------------------------------------------ routing

    def routed_to(self, keys: Sequence[int], now: float) -> None:
        """The router sent a prompt with these blocks here."""
        r = self.routed
        for k in keys:
            r[k] = now
            r.move_to_end(k)
        while len(r) > self.routed_capacity:
            r.popitem(last=False)

    def overlap(self, keys: Sequence[int], now: float) -> int:
        """How many leading blocks of ``keys`` this instance is believed to hold."""
        exact = self.exact if self.state != "FALLBACK" else None
        young = now - self.speculative_s if self.state == "EXACT" else None
        n = 0
        for k in keys:
            if exact is not None and k in exact:
                n += 1
                continue
            t = self.routed.get(k)
            if t is None or (young is not None and t < young):
                break
            n += 1
        return n


class CacheIndex:
    """The per-instance indexes of a fleet, and a prefix hit-rate tally per instance."""

    def __init__(
        self,
        names: Iterable[str],
        *,
        routed_capacity: int = 100_000,
        speculative_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.instances: dict[str, InstanceIndex] = {
            n: InstanceIndex(n, routed_capacity=routed_capacity, speculative_s=speculative_s)
            for n in names
        }
        self.looked_up: dict[str, int] = dict.fromkeys(self.instances, 0)
        """Prompt blocks routed to each instance."""
        self.matched: dict[str, int] = dict.fromkeys(self.instances, 0)
        """Of those, blocks the index believed the instance held."""

    def __getitem__(self, name: str) -> InstanceIndex:
        return self.instances[name]

    def overlaps(self, names: Iterable[str], keys: Sequence[int]) -> dict[str, int]:
        now = self.clock()
        return {n: self.instances[n].overlap(keys, now) for n in names}

    def routed(self, name: str, keys: Sequence[int], matched: int) -> None:
        """Record that a prompt of ``keys`` went to ``name``, which held ``matched``."""
        idx = self.instances.get(name)
        if idx is None:
            return
        idx.routed_to(keys, self.clock())
        self.looked_up[name] += len(keys)
        self.matched[name] += matched

    def hit_rate(self, name: str) -> float | None:
        n = self.looked_up.get(name, 0)
        return self.matched[name] / n if n else None

    def states(self) -> dict[str, IndexState]:
        return {n: i.state for n, i in self.instances.items()}

    def summary(self) -> dict[str, dict[str, object]]:
        """Per instance: state, reason, blocks known, events seen, predicted hit rate."""
        return {
            n: {
                "state": i.state,
                "reason": i.reason,
                "blocks": len(i.exact),
                "routed_blocks": len(i.routed),
                "stored": i.stored,
                "removed": i.removed,
                "cleared": i.cleared,
                "hash_mismatches": i.hash_mismatches,
                "predicted_hit_rate": self.hit_rate(n),
            }
            for n, i in self.instances.items()
        }
