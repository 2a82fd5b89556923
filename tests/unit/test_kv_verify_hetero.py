"""The KV digest check with prefill TP > decode TP, on real torch tensors: every prefill
rank holds its share of a model's KV heads in the CPU backend's head-major pages
(``[blocks, heads, block size, 2 x head size]``), its WRITE is emulated as vLLM places it
(the rank's whole page at ``(rank % k) x its page length`` bytes into the decode's page),
and the decode checks each head slice after the ``k`` notifications. Clean transfers are
never flagged (prefix-cache trims included); a slice written into the wrong place, a
corrupted slice, swapped blocks, a slice no notification vouched for are caught with
their block ids. No vLLM engine, no NIXL."""

from __future__ import annotations

from collections.abc import Callable
from itertools import product
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'pdctl[cpu]')")

import torch

from pdctl.connector import kvdigest
from pdctl.connector.kvslice import HeadSlice, head_slice
from pdctl.connector.kvverify import ASK_KEY, KvVerifier

HEADS = 4
BLOCK = 32  # the CPU backend's block sizes are multiples of 32
HEAD_SIZE = 16
BLOCKS = 10
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
RID = "cmpl-h1-0-bbbb"
ENGINE = "decode-engine"


class Cfg:
    def __init__(self, **extra: Any) -> None:
        self.extra = extra

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return self.extra.get(key, default)


def full_kv(seed: int) -> dict[str, torch.Tensor]:
    """The model's whole KV (every head) of ``BLOCKS`` blocks, per layer, bf16."""
    g = torch.Generator().manual_seed(seed)
    shape = (BLOCKS, HEADS, BLOCK, 2 * HEAD_SIZE)
    return {n: torch.randn(*shape, generator=g).to(torch.bfloat16) for n in LAYERS}


def shard(kv: dict[str, torch.Tensor], rank: int, tp: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s heads of ``kv`` (TP shards KV heads in order), its own tensors."""
    per = HEADS // tp
    return {n: t[:, rank * per : (rank + 1) * per].clone() for n, t in kv.items()}


def worker(kv: dict[str, torch.Tensor], rank: int, tp: int, remote_tp: int, **attrs: Any) -> Any:
    info = SimpleNamespace(
        remote_tp_size=remote_tp, remote_block_size=BLOCK, remote_physical_blocks_per_logical=1
    )
    topo = SimpleNamespace(
        tp_rank=rank,
        total_num_kv_heads=HEADS,
        is_mla=False,
        get_engine_info=lambda _e: info,
        block_size_ratio=lambda _b: 1,
    )
    base: dict[str, Any] = {
        "world_size": tp,
        "pp_size": 1,
        "use_host_buffer": False,
        "_has_mamba": False,
        "use_mla": False,
        "_physical_blocks_per_logical_kv_block": 1,
        "device_kv_caches": kv,
        "transfer_topo": topo,
    }
    return SimpleNamespace(**{**base, **attrs})


class Fleet:
    """Prefill TP ``p_tp`` → decode TP ``d_tp``: the prefill's KV computed, the decode's
    caches filled with other bytes (what the blocks held before), a verifier per rank."""

    def __init__(self, p_tp: int, d_tp: int, seed: int = 0, **extra: Any) -> None:
        self.p_tp, self.d_tp, self.k = p_tp, d_tp, p_tp // d_tp
        self.full = full_kv(seed)
        self.results: list[tuple[int, str]] = []
        self.p = [
            KvVerifier(worker(shard(self.full, r, p_tp), r, p_tp, d_tp), Cfg(**extra), print)
            for r in range(p_tp)
        ]
        stale = full_kv(seed + 1000)
        self.d = [
            KvVerifier(
                worker(shard(stale, d, d_tp), d, d_tp, p_tp),
                Cfg(pdctl_kv_verify_rate=1.0, **extra),
                self.reporter(d),
            )
            for d in range(d_tp)
        ]

    def reporter(self, d: int) -> Callable[[str, str], None]:
        def report(result: str, _rid: str) -> None:
            self.results.append((d, result))

        return report

    def write(
        self, r: int, src: list[int], dst: list[int], asked: bool = True
    ) -> tuple[bytes, list[int]]:
        """Prefill rank ``r`` builds and posts its WRITE: (notification, destinations)."""
        v = self.p[r]
        posted: dict[str, bytes] = {}

        def make_prepped_xfer(*_a: Any, notif_msg: bytes) -> str:
            posted["notif"] = notif_msg
            return "handle"

        v.asked = asked
        with v.writing(RID, ENGINE):
            remote, _local = v.written([list(dst)], [list(src)])
            v.tag(make_prepped_xfer)("WRITE", 1, [], 2, [], notif_msg=f"{RID}:{self.p_tp}".encode())
        v.asked = False
        return posted["notif"], list(remote[0])

    def land(self, r: int, src: list[int], dst: list[int], slot: int | None = None) -> None:
        """What NIXL does with rank ``r``'s WRITE, in bytes, as vLLM's descriptors say:
        decode rank ``r // k``, each destination page at offset ``(r % k) x`` the
        prefill's page length, that many bytes (``slot`` forces another offset)."""
        slot = r % self.k if slot is None else slot
        d = r // self.k
        for name, src_cache in self.p[r].worker.device_kv_caches.items():
            dst_cache = self.d[d].worker.device_kv_caches[name]
            for s, t in zip(src, dst, strict=True):
                page = src_cache[s].reshape(-1).view(torch.uint8)
                n = page.numel()
                dst_cache[t].reshape(-1).view(torch.uint8)[slot * n : (slot + 1) * n] = page

    def ask(self) -> None:
        for v in self.d:
            reg: dict[str, Any] = {"remote_tp_size": self.p_tp, "remote_pp_size": 1}
            v.ask(RID, reg)
            assert reg[ASK_KEY] == 1

    def check(self, d: int, notifs: list[bytes], awaited: list[int]) -> list[str]:
        """Decode rank ``d`` takes the notifications; vLLM has counted all ``k`` of them."""
        plain = self.d[d].strip(notifs)
        assert plain == [f"{RID}:{self.p_tp}".encode()] * len(notifs)
        meta = SimpleNamespace(local_physical_block_ids=[awaited])
        return self.d[d].check({RID: []}, {RID: meta})

    def transfer(self, src: list[int], dst: list[int]) -> dict[int, list[bytes]]:
        """Every prefill rank writes; the notifications per decode rank."""
        self.ask()
        notifs: dict[int, list[bytes]] = {d: [] for d in range(self.d_tp)}
        for r in range(self.p_tp):
            notif, placed = self.write(r, src, dst)
            self.land(r, src, placed)
            notifs[r // self.k].append(notif)
        return notifs


LAYOUTS = [(2, 1), (4, 1), (4, 2)]


@pytest.mark.parametrize(("p_tp", "d_tp"), LAYOUTS)
def test_the_emulated_writes_put_each_ranks_heads_in_its_slice(p_tp: int, d_tp: int):
    # the premise of the slice check, on the CPU backend's head-major pages: the byte
    # offset vLLM writes at is exactly where the decode keeps those KV heads
    f = Fleet(p_tp, d_tp)
    f.transfer(src=[1, 2, 3], dst=[7, 4, 9])
    for d, v in enumerate(f.d):
        want = shard(f.full, d, d_tp)
        for name, cache in v.worker.device_kv_caches.items():
            assert torch.equal(cache[[7, 4, 9]], want[name][[1, 2, 3]]), (d, name)


@pytest.mark.parametrize(("p_tp", "d_tp"), LAYOUTS)
def test_clean_transfers_verify_ok_on_every_decode_rank(p_tp: int, d_tp: int):
    f = Fleet(p_tp, d_tp)
    notifs = f.transfer(src=[1, 2, 3], dst=[7, 4, 9])
    for d in range(d_tp):
        assert len(notifs[d]) == p_tp // d_tp
        assert f.check(d, notifs[d], [7, 4, 9]) == []
    assert f.results == [(d, "ok") for d in range(d_tp)]


def test_clean_transfers_are_never_flagged():
    # many layouts, seeds, block choices and prefix-cache trims (the decode awaits only
    # the tail: vLLM trims the prefill's blocks to the same count before the WRITE)
    n = 0
    for (p_tp, d_tp), seed, trim in product(LAYOUTS, range(6), (0, 1, 2)):
        f = Fleet(p_tp, d_tp, seed=seed)
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(BLOCKS, generator=g).tolist()
        src, dst = perm[:4][trim:], perm[4:8][trim:]
        notifs = f.transfer(src=src, dst=dst)
        for d in range(d_tp):
            assert f.check(d, notifs[d], dst) == [], (p_tp, d_tp, seed, trim, d)
        assert f.results == [(d, "ok") for d in range(d_tp)], (p_tp, d_tp, seed, trim)
        n += d_tp
    assert n == 6 * 3 * (1 + 1 + 2)  # layouts' decode ranks x seeds x trims, all checked


def test_the_decode_waits_for_every_slice_before_checking():
    f = Fleet(2, 1)
    notifs = f.transfer(src=[1, 2], dst=[4, 5])
    meta = {RID: SimpleNamespace(local_physical_block_ids=[[4, 5]])}
    d = f.d[0]
    d.strip(notifs[0][:1])
    assert d.check({}, meta) == []  # vLLM has not counted the 2nd notification yet
    assert f.results == []  # nothing judged
    d.strip(notifs[0][1:])
    assert d.check({RID: []}, meta) == []
    assert f.results == [(0, "ok")]


def test_a_slice_written_into_the_wrong_head_slot_is_caught(caplog: pytest.LogCaptureFixture):
    f = Fleet(2, 1)
    f.ask()
    n0, _ = f.write(0, [1, 2], [4, 5])
    n1, _ = f.write(1, [1, 2], [4, 5])
    f.land(0, [1, 2], [4, 5])
    f.land(1, [1, 2], [4, 5], slot=0)  # rank 1's heads over rank 0's; slot 1 left stale
    assert f.check(0, [n0, n1], [4, 5]) == [RID]
    assert f.results == [(0, "mismatch")]
    assert "blocks [4, 5] differ" in caplog.text
    assert "differing {4: [0, 1], 5: [0, 1]}" in caplog.text


def test_a_corrupted_slice_names_its_block_and_slice(caplog: pytest.LogCaptureFixture):
    f = Fleet(4, 2)
    notifs = f.transfer(src=[1, 2, 3], dst=[6, 7, 8])
    # one byte of decode rank 1's block 7, in the 2nd of its 2 head slices
    raw = f.d[1].worker.device_kv_caches[LAYERS[1]][7].reshape(-1).view(torch.uint8)
    raw[raw.numel() * 3 // 4] ^= 0x10
    assert f.check(0, notifs[0], [6, 7, 8]) == []  # rank 0 holds other heads: clean
    assert f.check(1, notifs[1], [6, 7, 8]) == [RID]
    assert f.results == [(0, "ok"), (1, "mismatch")]
    assert "blocks [7] differ" in caplog.text
    assert "differing {7: [1]}" in caplog.text


def test_the_swap_failpoint_on_one_prefill_rank_is_caught(caplog: pytest.LogCaptureFixture):
    f = Fleet(2, 1, pdctl_failpoint_kv_corrupt="swap:match:h1")
    f.ask()
    n0, placed0 = f.write(0, [1, 2, 3], [4, 5, 6])
    assert placed0 == [5, 4, 6]  # the failpoint swapped rank 0's first two destinations
    f.land(0, [1, 2, 3], placed0)
    n1, placed1 = f.write(1, [1, 2, 3], [4, 5, 6])
    f.land(1, [1, 2, 3], placed1)
    assert f.check(0, [n0, n1], [4, 5, 6]) == [RID]
    assert "blocks [4, 5] differ" in caplog.text


def test_the_flip_failpoint_on_the_decode_is_caught():
    f = Fleet(2, 1, pdctl_failpoint_kv_corrupt="flip")
    notifs = f.transfer(src=[1, 2], dst=[4, 5])
    assert f.check(0, notifs[0], [4, 5]) == [RID]
    assert f.results == [(0, "mismatch")]


def test_a_slice_without_a_digest_fails_the_receive(caplog: pytest.LogCaptureFixture):
    f = Fleet(2, 1)
    f.ask()
    n0, _ = f.write(0, [1, 2], [4, 5])
    n1, _ = f.write(1, [1, 2], [4, 5], asked=False)  # rank 1 sent vLLM's notification only
    assert n1 == f"{RID}:2".encode()
    f.land(0, [1, 2], [4, 5])
    f.land(1, [1, 2], [4, 5])
    assert f.check(0, [n0, n1], [4, 5]) == [RID]
    assert f.results == [(0, "mismatch")]
    assert "no digest for [1]" in caplog.text


def test_no_digest_from_any_rank_is_missing():
    f = Fleet(2, 1)
    f.ask()
    plain = [f.write(r, [1], [4], asked=False)[0] for r in range(2)]
    assert f.check(0, plain, [4]) == []
    assert f.results == [(0, "missing")]


def test_slices_that_miss_an_awaited_block_are_caught(caplog: pytest.LogCaptureFixture):
    f = Fleet(2, 1)
    notifs = f.transfer(src=[1, 2], dst=[4, 5])
    assert f.check(0, notifs[0], [4, 5, 6]) == [RID]
    assert "[6] not written" in caplog.text


def test_each_prefill_rank_tags_its_own_slice():
    f = Fleet(4, 2)
    f.ask()
    tagged = [kvdigest.parse(f.write(r, [1, 2], [3, 8])[0]) for r in range(4)]
    assert [t.part if t else None for t in tagged] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    # each digest is of the rank's own whole page (equal to the decode's slice once landed)
    for r, t in enumerate(tagged):
        assert t is not None
        own = kvdigest.block_digests(f.p[r].worker.device_kv_caches, [1, 2])
        assert t.digests == {3: own[0], 8: own[1]}


def test_a_prefill_declines_where_vllm_maps_it_elsewhere(caplog: pytest.LogCaptureFixture):
    f = Fleet(2, 1)
    # vLLM's own mapping for that decode (what _build_fa_remote places the WRITE with)
    f.p[0].worker.tp_mappings = {
        ENGINE: SimpleNamespace(rank_offset_factor=0, all_source_ranks=(0,))
    }
    f.p[1].worker.tp_mappings = {
        ENGINE: SimpleNamespace(rank_offset_factor=0, all_source_ranks=(0,))
    }
    assert kvdigest.parse(f.write(0, [1], [4])[0]) is not None  # agrees: tagged
    assert f.write(1, [1], [4])[0] == b"%s:2" % RID.encode()  # disagrees: untagged
    assert "its WRITEs are not digested" in caplog.text


def test_a_prefill_page_need_not_split_only_the_decode_page_does():
    # P TP 3 → D TP 1 with 3 KV heads: a prefill page (1 head: 32 x 32 = 1024 elements)
    # does not divide by 3, the decode's (3 heads: 3072) does; the prefill still tags
    page = torch.zeros(4, 1, BLOCK, 2 * HEAD_SIZE, dtype=torch.bfloat16)
    p = KvVerifier(worker({LAYERS[0]: page}, 2, 3, 1), Cfg(), print)
    p.worker.transfer_topo.total_num_kv_heads = 3
    p.asked = True
    seen: dict[str, bytes] = {}

    def make_prepped_xfer(*_a: Any, notif_msg: bytes) -> str:
        seen["notif"] = notif_msg
        return "handle"

    with p.writing(RID, ENGINE):
        p.written([[5]], [[1]])
        p.tag(make_prepped_xfer)("WRITE", notif_msg=b"%s:3" % RID.encode())
    tagged = kvdigest.parse(seen["notif"])
    assert tagged is not None
    assert tagged.part == (2, 3)
    d_page = torch.zeros(4, 3, BLOCK, 2 * HEAD_SIZE, dtype=torch.bfloat16)
    d = KvVerifier(worker({LAYERS[0]: d_page}, 0, 1, 3), Cfg(pdctl_kv_verify_rate=1.0), print)
    d.worker.transfer_topo.total_num_kv_heads = 3
    reg: dict[str, Any] = {"remote_tp_size": 3, "remote_pp_size": 1}
    d.ask(RID, reg)
    assert reg[ASK_KEY] == 1


def test_layouts_outside_the_slices_are_unsupported():
    results: list[str] = []
    kv = shard(full_kv(0), 0, 1)
    # a prefill TP above the KV heads (8 > 4: two ranks write one slice), MLA,
    # a TP that does not divide, a decode TP above the prefill's
    for p_tp, d_tp, attrs in [
        (8, 1, {}),
        (2, 1, {"use_mla": True}),
        (3, 1, {}),
        (1, 2, {}),
    ]:
        d = KvVerifier(
            worker(kv, 0, d_tp, p_tp, **attrs),
            Cfg(pdctl_kv_verify_rate=1.0),
            lambda r, _i: results.append(r),
        )
        reg: dict[str, Any] = {"remote_tp_size": p_tp, "remote_pp_size": 1}
        d.ask(RID, reg)
        assert ASK_KEY not in reg, (p_tp, d_tp, attrs)
    assert results == ["unsupported"] * 4


def test_head_slice_arithmetic_by_hand():
    # P TP 4 → D TP 2 (k = 2), 4 heads: P0, P1 → D0 heads 0 | 1; P2, P3 → D1 heads 2 | 3
    got = [head_slice(r, 4, 2, 4) for r in range(4)]
    assert got == [HeadSlice(0, 0, 2), HeadSlice(0, 1, 2), HeadSlice(1, 0, 2), HeadSlice(1, 1, 2)]
    assert head_slice(3, 4, 4, 4) == HeadSlice(3, 0, 1)  # equal TP: the whole block
    assert head_slice(0, 8, 1, 4) is None  # P TP 8 > 4 heads: replicated, not covered
    assert head_slice(0, 1, 2, 4) is None  # D TP > P TP
    assert head_slice(0, 3, 2, 6) is None  # does not divide


def test_the_wire_form_carries_the_slice():
    notif = kvdigest.encode([(7, 2**64 - 1), (3, 5)], b"cmpl-a-0:2", part=(1, 2))
    assert notif == b"pdkv1|@1/2,7=ffffffffffffffff,3=5|cmpl-a-0:2"
    t = kvdigest.parse(notif)
    assert t == kvdigest.Tagged({7: 2**64 - 1, 3: 5}, b"cmpl-a-0:2", (1, 2))
    # the equal-TP form is unchanged and carries no slice
    assert kvdigest.parse(kvdigest.encode([(7, 1)], b"x:1")) == kvdigest.Tagged({7: 1}, b"x:1")
    # a slice that cannot exist is a malformed tag: no digests
    assert kvdigest.parse(b"pdkv1|@2/2,7=1|x:2") == kvdigest.Tagged({}, b"x:2")
    assert kvdigest.parse(b"pdkv1|@a/2,7=1|x:2") == kvdigest.Tagged({}, b"x:2")
