"""A stand-in for vLLM's ZMQ KV event publisher (PUB socket + ROUTER replay socket)
speaking the same wire format, for the subscriber's unit tests."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
import zmq
import zmq.asyncio

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def stored(hashes: list[int], tokens: list[int], block_size: int, parent: int | None = None):
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def removed(hashes: list[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


CLEARED = {"type": "AllBlocksCleared"}


class FakePublisher:
    def __init__(self, port: int) -> None:
        self.port = port
        self.ctx = zmq.asyncio.Context()
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.replay_answers = True
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(f"tcp://127.0.0.1:{self.port + 1}")
        self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            client, _, start_b = await self.router.recv_multipart()
            if not self.replay_answers:
                continue
            start = int.from_bytes(start_b, "big")
            for seq, payload in self.buffer:
                if seq >= start:
                    await self.router.send_multipart(
                        (client, b"", b"", seq.to_bytes(8, "big"), payload)
                    )
            await self.router.send_multipart((client, b"", b"", END_SEQ, b""))

    async def publish(self, events: list[dict[str, Any]], *, drop: bool = False) -> int:
        """One batch; ``drop``: buffered for replay but never sent live (a lost batch)."""
        seq, self.seq = self.seq, self.seq + 1
        payload = msgspec.msgpack.encode([1.0, events, None])
        self.buffer.append((seq, payload))
        if not drop:
            await self.pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))
        return seq

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.pub.close(linger=0)
        self.router.close(linger=0)
        self.ctx.term()
