"""A subscriber to one vLLM instance's KV cache events (vLLM's ``ZmqEventPublisher``).

The publisher sends ``(topic, seq, payload)`` on a PUB socket: ``seq`` an 8-byte
big-endian batch number, ``payload`` a msgpack ``KVEventBatch`` — ``[ts, [event…],
dp_rank]`` with each event a map tagged ``type``: ``BlockStored`` (``block_hashes``,
``parent_block_hash``, ``token_ids``, ``block_size``…), ``BlockRemoved``
(``block_hashes``) or ``AllBlocksCleared``. Its ROUTER replay socket answers a request
``(b"", start_seq)`` with every buffered batch from ``start_seq`` on, then an end marker
(``seq`` = -1).

State (in the instance's :class:`~pdctl.sdk.kvindex.index.InstanceIndex`):

* starting, the subscriber replays from 0 (what the instance cached before the router
  came up) and turns ``EXACT``;
* a batch number skipped → replay from the first missing one; if the replay cannot
  fill the gap → ``DEGRADED`` until it does;
* no batch for ``replay_after_s`` → ask the replay socket for anything newer; no
  answer within ``replay_timeout_s`` → ``DEGRADED`` (the stream is dead or the publisher
  gone); the first answer after that → ``EXACT`` again;
* a batch number going backwards means the publisher restarted: its cache is empty,
  so the instance's known blocks are cleared and the stream followed from there.

pyzmq and msgspec come with vLLM; they are imported here only, when events are on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from pdctl.sdk.kvindex.hashing import event_key
from pdctl.sdk.kvindex.index import IndexState, InstanceIndex

log = logging.getLogger(__name__)
END_SEQ = -1


def apply_batch(
    idx: InstanceIndex,
    events: Sequence[Any],
    check: Callable[[Sequence[int]], int] | None = None,
) -> None:
    """Apply one decoded batch's events to ``idx``. ``check`` (a block's token ids → its
    key) verifies first blocks (no parent): a mismatch means the router hashes
    differently from the instance (hash algorithm, ``PYTHONHASHSEED``, block size)."""
    for ev in events:
        if not isinstance(ev, dict):
            continue
        kind = ev.get("type")
        if kind == "BlockStored":
            if ev.get("medium") not in (None, "GPU"):
                continue  # offloaded tiers are not where the prefill computes from
            hashes = ev.get("block_hashes") or []
            if check is not None and ev.get("parent_block_hash") is None and hashes:
                bs = int(ev.get("block_size") or 0)
                toks = ev.get("token_ids") or []
                if bs and len(toks) >= bs and check(toks[:bs]) != event_key(hashes[0]):
                    idx.hash_mismatches += 1
            idx.store(hashes)
        elif kind == "BlockRemoved":
            if ev.get("medium") not in (None, "GPU"):
                continue
            idx.remove(ev.get("block_hashes") or [])
        elif kind == "AllBlocksCleared":
            idx.clear()


class EventSubscriber:
    """Follows one instance's KV event stream into its index (see the module doc)."""

    def __init__(
        self,
        idx: InstanceIndex,
        host: str,
        port: int,
        *,
        replay_port: int | None = None,
        check: Callable[[Sequence[int]], int] | None = None,
        on_state: Callable[[InstanceIndex, IndexState], None] | None = None,
        replay_after_s: float = 1.0,
        replay_timeout_s: float = 2.0,
    ) -> None:
        self.idx = idx
        self.endpoint = f"tcp://{host}:{port}"
        self.replay_endpoint = f"tcp://{host}:{replay_port if replay_port else port + 1}"
        self.check = check
        self.on_state = on_state
        self.replay_after_s = replay_after_s
        self.replay_timeout_s = replay_timeout_s
        self.next_seq: int | None = None
        self.gaps = 0
        self.restarts = 0
        self.batches = 0
        self._task: asyncio.Task[None] | None = None

    def _state(self, state: IndexState, reason: str) -> None:
        if self.idx.set_state(state, reason):
            log.info("KV index of %s: %s (%s)", self.idx.name, state, reason)
            if self.on_state is not None:
                self.on_state(self.idx, state)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def _apply(self, seq: int, payload: bytes, decode: Callable[[bytes], Any]) -> None:
        if self.next_seq is not None and seq < self.next_seq:
            return  # already applied
        try:
            batch = decode(payload)
        except Exception as e:  # a batch we cannot read is a batch lost
            self._state("DEGRADED", f"unreadable event batch {seq}: {e}")
            return
        events = batch[1] if isinstance(batch, list | tuple) and len(batch) > 1 else []
        apply_batch(self.idx, events, self.check)
        self.idx.last_event = asyncio.get_running_loop().time()
        self.next_seq = seq + 1
        self.batches += 1

    async def run(self) -> None:
        import msgspec
        import zmq
        import zmq.asyncio

        decode = msgspec.msgpack.decode
        ctx = zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(self.endpoint)
        self._state("DEGRADED", "syncing: replaying the instance's recent events")
        try:
            await self._replay(ctx, 0, decode, "syncing")
            while True:
                if await sub.poll(int(self.replay_after_s * 1000)):
                    topic_seq_payload = await sub.recv_multipart()
                    if len(topic_seq_payload) != 3:
                        continue
                    _, seq_b, payload = topic_seq_payload
                    seq = int.from_bytes(seq_b, "big", signed=True)
                    if self.next_seq is not None and seq < self.next_seq - 1:
                        # numbering went back: the publisher restarted with an empty cache
                        self.restarts += 1
                        self.idx.clear()
                        self.next_seq = None
                    elif self.next_seq is not None and seq > self.next_seq:
                        self.gaps += 1
                        await self._replay(ctx, self.next_seq, decode, "gap")
                    self._apply(seq, payload, decode)
                else:
                    await self._replay(ctx, self.next_seq or 0, decode, "stream quiet")
        finally:
            sub.close(linger=0)
            ctx.term()

    async def _replay(self, ctx: Any, start: int, decode: Callable[[bytes], Any], why: str) -> None:
        """Ask the replay socket for every batch from ``start``; EXACT when it answers
        (and covers the gap), DEGRADED when it does not."""
        import zmq

        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.replay_endpoint)
        try:
            await sock.send_multipart((b"", start.to_bytes(8, "big", signed=True)))
            first: int | None = None
            while True:
                if not await sock.poll(int(self.replay_timeout_s * 1000)):
                    self._state(
                        "DEGRADED",
                        f"{why}: the event publisher at {self.replay_endpoint} did not "
                        f"answer a replay within {self.replay_timeout_s:g} s",
                    )
                    return
                frames = await sock.recv_multipart()
                if len(frames) != 4:
                    continue
                _, _, seq_b, payload = frames
                seq = int.from_bytes(seq_b, "big", signed=True)
                if seq == END_SEQ:
                    break
                if first is None:
                    first = seq
                self._apply(seq, payload, decode)
            if first is not None and start > 0 and first > start:
                self.gaps += 1
                self._state("DEGRADED", f"gap: batches {start}-{first - 1} are gone for good")
                return
            self._state("EXACT", "events flowing")
        finally:
            sock.close(linger=0)
