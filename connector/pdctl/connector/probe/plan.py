"""Block geometry → NIXL descriptor tables (pure; numpy only).

A rank's KV pool is ``regions`` tensors (vLLM keeps one per layer, or one for K and one
for V of each layer), each ``pool_blocks`` blocks of ``block_len`` bytes, laid out back to
back in one buffer. A request names the same block ids in every region, so descriptors
are ``regions x blocks`` unless consecutive block pairs are contiguous on *both* sides:
then a run of blocks becomes one descriptor per region (:func:`block_runs`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]


class GeometryError(ValueError):
    """A KV geometry that cannot be laid out; the message names the option to change."""


@dataclass(frozen=True)
class Geometry:
    regions: int
    """Separate KV tensors per rank (e.g. 2 x layers: K and V of every layer)."""
    block_len: int
    """Bytes of one block in one region."""
    blocks_per_request: int
    pool_blocks: int
    """Blocks per region in each pool (several requests' worth, reused round-robin)."""

    @property
    def region_len(self) -> int:
        return self.block_len * self.pool_blocks

    @property
    def pool_bytes(self) -> int:
        return self.region_len * self.regions

    @property
    def request_bytes(self) -> int:
        """Bytes one rank sends for one request."""
        return self.block_len * self.blocks_per_request * self.regions

    def as_dict(self) -> dict[str, int]:
        return {
            "regions": self.regions,
            "block_len": self.block_len,
            "blocks_per_request": self.blocks_per_request,
            "pool_blocks": self.pool_blocks,
        }


def geometry_for(
    *,
    bytes_per_token: int,
    prompt_len: int,
    block_size: int,
    regions: int = 1,
    pool_requests: int = 2,
) -> Geometry:
    """The geometry of one rank's share: ``bytes_per_token`` is per rank, all regions."""
    for name, value in (
        ("--bytes-per-token", bytes_per_token),
        ("--prompt-len", prompt_len),
        ("--block-size", block_size),
        ("--regions", regions),
    ):
        if value < 1:
            raise GeometryError(f"{name} must be a positive integer (got {value})")
    if bytes_per_token % regions:
        raise GeometryError(
            f"--bytes-per-token {bytes_per_token} (per rank) does not split into {regions} "
            "equal regions; choose --regions that divides it"
        )
    blocks = math.ceil(prompt_len / block_size)
    return Geometry(
        regions=regions,
        block_len=block_size * bytes_per_token // regions,
        blocks_per_request=blocks,
        pool_blocks=blocks * max(1, pool_requests),
    )


@dataclass(frozen=True)
class Run:
    """``count`` consecutive blocks from ``src`` written to ``count`` consecutive blocks
    from ``dst``."""

    src: int
    dst: int
    count: int


def block_runs(src_blocks: Sequence[int], dst_blocks: Sequence[int], merge: bool) -> list[Run]:
    """Pair source and destination blocks in order; with ``merge``, fold each stretch
    that advances by one block on both sides into one run."""
    if len(src_blocks) != len(dst_blocks):
        raise GeometryError(
            f"block-count mismatch: {len(src_blocks)} source vs {len(dst_blocks)} "
            "destination blocks"
        )
    runs: list[Run] = []
    for s, d in zip(src_blocks, dst_blocks, strict=True):
        last = runs[-1] if runs else None
        if merge and last and s == last.src + last.count and d == last.dst + last.count:
            runs[-1] = Run(last.src, last.dst, last.count + 1)
        else:
            runs.append(Run(s, d, 1))
    return runs


def desc_tables(geo: Geometry, runs: Sequence[Run]) -> tuple[U64, U64, U64]:
    """Source offsets, destination offsets and lengths (bytes from each pool's base),
    region-major: every run in region 0, then region 1, ..."""
    if not runs:
        empty = np.zeros(0, dtype=np.uint64)
        return empty, empty.copy(), empty.copy()
    src = np.array([r.src for r in runs], dtype=np.uint64) * np.uint64(geo.block_len)
    dst = np.array([r.dst for r in runs], dtype=np.uint64) * np.uint64(geo.block_len)
    lens = np.array([r.count for r in runs], dtype=np.uint64) * np.uint64(geo.block_len)
    region = (np.arange(geo.regions, dtype=np.uint64) * np.uint64(geo.region_len))[:, None]
    return (
        (region + src[None, :]).ravel(),
        (region + dst[None, :]).ravel(),
        np.broadcast_to(lens, (geo.regions, len(runs))).ravel().copy(),
    )


def checksum_ranges(geo: Geometry, blocks: Sequence[int]) -> list[tuple[int, int]]:
    """``(offset, length)`` ranges of one side's blocks in request order, region-major,
    adjacent ranges folded: hashing them in order on both sides must give equal digests."""
    out: list[tuple[int, int]] = []
    for region in range(geo.regions):
        base = region * geo.region_len
        for b in blocks:
            off = base + b * geo.block_len
            if out and out[-1][0] + out[-1][1] == off:
                out[-1] = (out[-1][0], out[-1][1] + geo.block_len)
            else:
                out.append((off, geo.block_len))
    return out


class RingAllocator:
    """Hands out ``n`` block ids at a time, consecutively, wrapping at the pool's end
    (a wrapped request is split in two runs, like a fragmented free list)."""

    def __init__(self, pool_blocks: int) -> None:
        if pool_blocks < 1:
            raise GeometryError("the pool needs at least one block")
        self.pool_blocks = pool_blocks
        self._next = 0

    def allocate(self, n: int) -> list[int]:
        if not 0 < n <= self.pool_blocks:
            raise GeometryError(f"cannot allocate {n} blocks from a pool of {self.pool_blocks}")
        ids = [(self._next + i) % self.pool_blocks for i in range(n)]
        self._next = (self._next + n) % self.pool_blocks
        return ids
