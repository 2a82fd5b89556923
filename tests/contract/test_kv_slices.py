"""The digest check's head-slice arithmetic (``pdctl.connector.kvslice``) is where vLLM's
push worker writes, on both vLLM versions: for every prefill TP ≥ decode TP layout of
models with 1 to 8 KV heads and every prefill rank, vLLM's ``compute_tp_mapping``
(``nixl/tp_mapping.py``) names the decode rank and offset factor, and ``_build_fa_remote``
(``nixl/base_worker.py``) the destination descriptor of each layer's block; the covered
layouts put each rank's whole block at run ``r % k`` of ``k`` of the decode's block, and
the layouts left out are the ones where several prefill ranks write the same bytes."""

from __future__ import annotations

from collections import Counter

from pdctl.connector.kvslice import head_slice, run


def _pairs(vllm):
    layouts = vllm["requests"]["head_slices"]
    answers = vllm["answers"]["head_slices"]
    assert len(answers) == len(layouts) > 50
    return list(zip(layouts, answers, strict=True))


def test_each_covered_rank_writes_its_slice_where_vllm_places_it(vllm):
    covered = hetero = 0
    for lay, ranks in _pairs(vllm):
        p_tp, d_tp, heads = lay["p_tp"], lay["d_tp"], lay["kv_heads"]
        assert len(ranks) == p_tp
        for r, got in enumerate(ranks):
            ours = head_slice(r, p_tp, d_tp, heads)
            if ours is None:
                continue
            where = f"vLLM {vllm['version']}, P TP{p_tp} → D TP{d_tp}, {heads} KV heads, rank {r}"
            assert got["dst_ranks"] == [ours.dst_rank], (where, got)
            assert got["rank_offset_factor"] == ours.index, (where, got)
            start, stop = run(got["d_block_len"], ours.index, ours.parts)
            # the rank writes its whole block: its block length is the run's
            assert got["p_block_len"] == stop - start, (where, got)
            for desc in got["descs"]:
                assert (desc["offset"], desc["length"]) == (start, stop - start), (where, got)
            covered += 1
            hetero += ours.parts > 1
    assert covered > hetero >= 40, (covered, hetero)  # the grid exercises both kinds


def test_the_layouts_left_out_are_where_prefill_ranks_share_bytes(vllm):
    left_out = 0
    for lay, ranks in _pairs(vllm):
        p_tp, d_tp, heads = lay["p_tp"], lay["d_tp"], lay["kv_heads"]
        if head_slice(0, p_tp, d_tp, heads) is not None:
            continue
        # the only ones of the grid left out: a prefill TP above the KV heads
        assert p_tp > heads, lay
        assert p_tp > d_tp, lay
        places = Counter(
            (g["dst_ranks"][0], g["descs"][0]["offset"]) for g in ranks if len(g["dst_ranks"]) == 1
        )
        assert max(places.values()) > 1, (lay, ranks)  # two ranks, one destination
        left_out += 1
    assert left_out > 5, left_out
