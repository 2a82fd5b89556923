"""The decode's one pass over vLLM's notification queue, with the writer thread held off.

vLLM's push worker (``vllm/distributed/kv_transfer/kv_connector/v1/nixl/push_worker.py``,
0.32 and 0.33 alike) creates ``_pending_completion_notifs`` (a ``queue.Queue``) in its
``__init__``; its ``nixl-push-writer`` thread, started later by ``register_kv_caches``,
puts there every NIXL notification that is not a registration, and ``_get_new_notifs``
on the engine thread takes from it until it is empty. pdctl must see some of those
notifications before vLLM does: the KV digests in front of a WRITE's notification
(:mod:`pdctl.connector.kvverify`) and its own failed and release messages
(:mod:`pdctl.connector.lifecycle`).

Taking the queue's items, keeping pdctl's part and putting the rest back for vLLM left a
window: what the writer put between pdctl's drain and vLLM's reached vLLM untouched (a
digest-tagged notification read as an unknown request id and dropped, so the receive
waited for the registration timeout; a failed or release message lost). Here the queue
can be *held* (:class:`HeldQueue`): while held, the writer's puts wait in a side list
under the queue's own mutex. :meth:`NotifWorker._get_new_notifs` holds it, takes what it
has, lets each pdctl class take its part (:meth:`NotifWorker._pdctl_notifs`, one chain
through the MRO), queues exactly the rest past the hold, lets vLLM's ``_get_new_notifs``
drain exactly those, and releases: the side list joins the queue, in arrival order, for
the next engine step.

The queue is converted in place (its class, under its mutex), so the writer thread keeps
the very object it puts into; :meth:`PdctlPushWorker.attach
<pdctl.connector.push.PdctlPushWorker.attach>` does it in the connector's constructor,
before ``register_kv_caches`` starts the writer, and the engine thread's pass converts a
queue it finds unconverted (a put in progress finishes first: both take the mutex).
"""

from __future__ import annotations

import collections
import queue
import time
from collections.abc import Iterable
from typing import Any, cast

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)


class HeldQueue(queue.Queue[bytes]):
    """vLLM's writer → engine notification queue that the engine thread can hold.

    Every item carries the time it was put (``time.monotonic()``); with :attr:`taken` a
    list (the flight recorder's), :meth:`hold` adds what it takes there, heartbeats
    left out. Only :meth:`hold`, :meth:`refill` and :meth:`release` are new; ``put`` and
    ``get_nowait`` are ``queue.Queue``'s (what vLLM calls).
    """

    _times: collections.deque[float]
    """When each queued item was put (in step with ``self.queue``)."""
    _held: list[tuple[bytes, float]] | None
    """While held: the writer's puts since, with their times; None when not held."""
    taken: list[tuple[bytes, float]] | None
    """What the engine took, with when each arrived (None: not recorded)."""

    def _put(self, item: bytes) -> None:  # under self.mutex (queue.Queue.put)
        now = time.monotonic()
        if self._held is not None:
            self._held.append((item, now))
            return
        super()._put(item)
        self._times.append(now)

    def _get(self) -> bytes:  # under self.mutex
        item = super()._get()
        if self._times:
            self._times.popleft()
        return item

    def hold(self) -> list[bytes]:
        """Engine thread: hold the writer's puts from now on; return (and remove) what
        is queued, in order."""
        with self.mutex:
            if self._held is not None:
                raise RuntimeError("pdctl: the notification queue is already held")
            self._held = []
            items = list(self.queue)
            times = list(self._times)
            self.queue.clear()
            self._times.clear()
        if self.taken is not None:
            now = time.monotonic()
            stamps = times if len(times) == len(items) else [now] * len(items)
            self.taken.extend(
                (i, t) for i, t in zip(items, stamps, strict=True) if not i.startswith(b"HB:")
            )
        return items

    def refill(self, items: Iterable[bytes]) -> None:
        """Engine thread, while held: queue ``items`` past the hold (for vLLM's drain)."""
        with self.mutex:
            now = time.monotonic()
            n = 0
            for item in items:
                self.queue.append(item)
                self._times.append(now)
                n += 1
            if n:
                self.not_empty.notify(n)

    def release(self) -> None:
        """Engine thread: queue what the writer put while held (after anything still
        queued) and let its puts through again."""
        with self.mutex:
            held, self._held = self._held or [], None
            for item, t in held:
                self.queue.append(item)
                self._times.append(t)
            if held:
                self.not_empty.notify(len(held))


def holdable(q: queue.Queue[bytes]) -> HeldQueue:
    """``q`` itself, made a :class:`HeldQueue` (its class changed under its own mutex,
    so a put in progress on another thread completes first and the writer thread keeps
    the object it has)."""
    if isinstance(q, HeldQueue):
        return q
    if type(q) is not queue.Queue:
        raise TypeError(
            f"pdctl: vLLM's push worker's _pending_completion_notifs is a "
            f"{type(q).__name__}, not the queue.Queue pdctl holds (nixl/push_worker.py)"
        )
    raw = cast(Any, q)
    with q.mutex:
        raw._times = collections.deque([time.monotonic()] * len(q.queue))
        raw._held = None
        raw.taken = None
        raw.__class__ = HeldQueue
    return cast(HeldQueue, q)


class NotifWorker(NixlPushConnectorWorker):
    """vLLM's push worker whose notifications pass pdctl's classes first (see the
    module): the only override of ``_get_new_notifs`` that touches the queue."""

    def _get_new_notifs(self) -> set[str]:
        q = holdable(self._pending_completion_notifs)
        taken = q.hold()
        try:
            q.refill(self._pdctl_notifs(taken) if taken else taken)
            done: set[str] = super()._get_new_notifs()
        finally:
            q.release()
        return done

    def _pdctl_notifs(self, notifs: list[bytes]) -> list[bytes]:
        """Hook, engine thread, the writer held off: what vLLM should read of
        ``notifs`` (in order). Each pdctl class takes its part out and calls on."""
        return notifs
