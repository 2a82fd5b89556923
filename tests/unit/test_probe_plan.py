"""Probe planning: geometry, contiguous-run merging, descriptor tables, checksum ranges."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdctl.connector.probe.plan import (
    Geometry,
    GeometryError,
    RingAllocator,
    Run,
    block_runs,
    checksum_ranges,
    desc_tables,
    geometry_for,
)


def test_geometry_for_splits_tokens_into_blocks_and_regions():
    g = geometry_for(bytes_per_token=4096, prompt_len=100, block_size=16, regions=4)
    assert g.blocks_per_request == 7  # ceil(100 / 16)
    assert g.block_len == 16 * 4096 // 4
    assert g.pool_blocks == 14
    assert g.request_bytes == 7 * 16 * 4096
    assert g.pool_bytes == g.region_len * 4


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"bytes_per_token": 0}, "--bytes-per-token"),
        ({"prompt_len": 0}, "--prompt-len"),
        ({"block_size": -1}, "--block-size"),
        ({"regions": 3}, "--regions"),
    ],
)
def test_geometry_errors_name_the_option(kwargs, option):
    base = {"bytes_per_token": 1024, "prompt_len": 64, "block_size": 16, "regions": 1}
    with pytest.raises(GeometryError, match=option):
        geometry_for(**{**base, **kwargs})


def test_runs_merge_only_when_both_sides_advance_together():
    assert block_runs([0, 1, 2, 7, 8], [4, 5, 6, 9, 3], merge=True) == [
        Run(0, 4, 3),
        Run(7, 9, 1),
        Run(8, 3, 1),
    ]
    assert block_runs([0, 1, 2], [4, 5, 6], merge=False) == [
        Run(0, 4, 1),
        Run(1, 5, 1),
        Run(2, 6, 1),
    ]


def test_runs_reject_mismatched_block_counts():
    with pytest.raises(GeometryError, match="mismatch"):
        block_runs([0, 1], [0], merge=True)


def test_desc_tables_are_region_major_with_pool_offsets():
    g = Geometry(regions=2, block_len=10, blocks_per_request=3, pool_blocks=8)
    src, dst, lens = desc_tables(g, [Run(0, 5, 2), Run(6, 1, 1)])
    assert src.tolist() == [0, 60, 80, 140]
    assert dst.tolist() == [50, 10, 130, 90]
    assert lens.tolist() == [20, 10, 20, 10]


def test_checksum_ranges_fold_adjacent_blocks_per_region():
    g = Geometry(regions=2, block_len=10, blocks_per_request=3, pool_blocks=4)
    assert checksum_ranges(g, [1, 2, 0]) == [(10, 20), (0, 10), (50, 20), (40, 10)]


def test_ring_allocator_wraps_and_refuses_oversized_requests():
    a = RingAllocator(5)
    assert a.allocate(3) == [0, 1, 2]
    assert a.allocate(3) == [3, 4, 0]
    with pytest.raises(GeometryError):
        a.allocate(6)


def _byte_map(g: Geometry, src, dst, lens) -> list[tuple[int, int]]:
    """Every (source byte, destination byte) pair the descriptors move, block-granular."""
    pairs = []
    for s, d, n in zip(src.tolist(), dst.tolist(), lens.tolist(), strict=True):
        assert n % g.block_len == 0
        pairs += [(s + k, d + k) for k in range(0, n, g.block_len)]
    return sorted(pairs)


@st.composite
def _requests(draw):
    pool = draw(st.integers(1, 24))
    n = draw(st.integers(1, pool))
    src = draw(st.permutations(range(pool)))[:n]
    # destination: mostly runs (a ring allocation at a random start), sometimes shuffled
    start = draw(st.integers(0, pool - 1))
    dst = [(start + i) % pool for i in range(n)]
    if draw(st.booleans()):
        dst = draw(st.permutations(dst))
    if draw(st.booleans()):
        src = [(start + 3 + i) % pool for i in range(n)]
    regions = draw(st.integers(1, 3))
    block_len = draw(st.sampled_from([1, 8, 16, 4096]))
    return Geometry(regions, block_len, n, pool), src, dst


@given(_requests())
def test_merged_regions_cover_exactly_the_requested_bytes(case):
    g, src, dst = case
    merged = desc_tables(g, block_runs(src, dst, merge=True))
    single = desc_tables(g, block_runs(src, dst, merge=False))
    assert int(merged[2].sum()) == int(single[2].sum()) == g.request_bytes
    assert _byte_map(g, *merged) == _byte_map(g, *single)
    assert len(merged[2]) <= len(single[2]) == g.regions * len(src)
    # no destination byte is written twice and everything stays inside the pool
    dst_spans = sorted(zip(merged[1].tolist(), merged[2].tolist(), strict=True))
    for (a, n), (b, _) in itertools.pairwise(dst_spans):
        assert a + n <= b
    assert all(a + n <= g.pool_bytes for a, n in dst_spans)


@given(_requests())
def test_checksum_ranges_cover_each_block_once_in_order(case):
    g, src, _ = case
    ranges = checksum_ranges(g, src)
    assert sum(n for _, n in ranges) == g.request_bytes
    expanded = [o + k for o, n in ranges for k in range(0, n, g.block_len)]
    assert expanded == [r * g.region_len + b * g.block_len for r in range(g.regions) for b in src]
