"""NIXL I/O for the probe: agents, KV pools, the initiator's writer thread, the target.

Kept thin: geometry comes from :mod:`.plan`, notification formats from :mod:`.protocol`,
matching and counting from :mod:`.match`. Agents run without NIXL's progress thread (it
busy-polls a core); the writer thread and the target drive progress by polling
``check_xfer_state`` / ``get_new_notifs`` with short sleeps.
"""

from __future__ import annotations

import queue
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pdctl.connector.probe import match as m
from pdctl.connector.probe.plan import (
    Geometry,
    RingAllocator,
    block_runs,
    checksum_ranges,
    desc_tables,
)
from pdctl.connector.probe.protocol import (
    ProtocolError,
    Registration,
    completion_notif,
    decode_registration,
    encode_registration,
    is_registration,
)

Device = Literal["cpu", "cuda"]
NIXL_HINT = (
    "NIXL is not installed in this Python environment; install pdctl's cpu extra "
    "(pip install 'pdctl[cpu]') or the gpu extra, or just 'nixl>=1.5,<1.6'"
)
_STAMP = 16
"""Bytes at the start of each block stamped with (request, rank, region, block) before a
checked WRITE, so stale or misplaced blocks change the digest."""


class EngineError(RuntimeError):
    """NIXL is missing or refused a step; the message says which and what to do."""


def load_nixl() -> Any:
    try:
        from nixl import _api
    except ImportError as e:
        raise EngineError(f"{NIXL_HINT} ({e})") from None
    return _api


SYNC_PARAM = "pdctl_sync_mode"
"""A key of the probe's agent parameters that is the agent's thread-sync mode (``none``,
``strict``, ``rw``), not a UCX backend parameter."""


def make_agent(name: str, ucx_params: dict[str, str] | None = None) -> Any:
    api = load_nixl()
    params = dict(ucx_params or {})
    sync = params.pop(SYNC_PARAM, "none")
    mode = None if sync == "none" else api.nixl_thread_sync_t[f"NIXL_THREAD_SYNC_{sync.upper()}"]
    cfg = api.nixl_agent_config(
        enable_prog_thread=False, backends=[], capture_telemetry=True, sync_mode=mode
    )
    agent = api.nixl_agent(name, cfg)
    try:
        agent.create_backend("UCX", params)
    except Exception as e:
        raise EngineError(
            f"NIXL could not create its UCX backend ({e}); with UCX_TLS set, include tcp "
            "(e.g. --ucx-tls shm,tcp) or pass --ucx-error-mode none"
        ) from None
    return agent


class Pool:
    """One rank's KV pool: ``geo.regions`` regions in one registered buffer, pages
    touched up front so no first-touch fault lands inside a measured WRITE."""

    def __init__(self, geo: Geometry, device: Device, *, seed: int | None, index: int = 0):
        self.geo = geo
        self.device = device
        n = geo.pool_bytes
        if device == "cuda":
            import torch

            dev = index % max(1, torch.cuda.device_count())
            self._tensor = torch.empty(n, dtype=torch.uint8, device=f"cuda:{dev}")
            if seed is None:
                self._tensor.zero_()
            else:
                gen = torch.Generator(device=f"cuda:{dev}").manual_seed(seed)
                self._tensor.random_(0, 256, generator=gen)
            self.addr, self.dev_id, self.mem = int(self._tensor.data_ptr()), dev, "VRAM"
        else:
            self.array = np.empty(n, dtype=np.uint8)
            if seed is None:
                self.array.fill(0)
            else:
                # a random tile whose period is no multiple of a block: no two blocks equal
                tile = np.random.default_rng(seed).integers(0, 256, (1 << 20) + 7, np.uint8)
                reps = -(-n // tile.size)
                np.copyto(self.array, np.tile(tile, reps)[:n])
            self.addr, self.dev_id, self.mem = int(self.array.ctypes.data), 0, "DRAM"
        self._reg: Any = None

    def register(self, agent: Any) -> None:
        descs = [(self.addr, self.geo.pool_bytes, self.dev_id, "")]
        self._reg = agent.register_memory(descs, self.mem)
        self._agent = agent

    def deregister(self) -> None:
        if self._reg is not None:
            self._agent.deregister_memory(self._reg)
            self._reg = None

    def host_view(self) -> np.ndarray[Any, np.dtype[np.uint8]]:
        if self.device == "cuda":
            out: np.ndarray[Any, np.dtype[np.uint8]] = self._tensor.cpu().numpy()
            return out
        return self.array

    def stamp(self, blocks: Sequence[int], request: int, rank: int) -> None:
        if self.geo.block_len < _STAMP:
            return
        g = self.geo
        ids = np.asarray(blocks, dtype=np.uint64)
        stamps = np.zeros((g.regions, len(ids), 2), dtype=np.uint64)
        stamps[:, :, 0] = (np.uint64(request) << np.uint64(16)) | np.uint64(rank)
        stamps[:, :, 1] = (np.arange(g.regions, dtype=np.uint64)[:, None] << np.uint64(32)) | ids
        offsets = np.arange(g.regions)[:, None] * g.region_len + ids.astype(np.int64) * g.block_len
        raw = stamps.view(np.uint8).reshape(-1, _STAMP)
        if self.device == "cuda":
            import torch

            for off, row in zip(offsets.ravel(), raw, strict=True):
                self._tensor[int(off) : int(off) + _STAMP] = torch.from_numpy(row.copy())
            return
        idx = offsets.reshape(-1, 1) + np.arange(_STAMP)
        self.array[idx] = raw

    def checksum(self, blocks: Sequence[int]) -> int:
        view = self.host_view()
        crc = 0
        for off, length in checksum_ranges(self.geo, blocks):
            crc = zlib.crc32(view[off : off + length].data, crc)
        return crc


# ---------------------------------------------------------------------------- initiator


@dataclass(frozen=True)
class WriteDone:
    rank: int
    request_id: str
    """The target's id (what the completion notification names)."""
    first: m.Kind
    waited_s: float
    post_s: float
    xfer_s: float
    """From preparing the descriptors to DONE (``post_s`` included)."""
    nbytes: int
    descs: int
    """Descriptors handed to NIXL."""
    nixl_descs: int | None
    """Descriptors NIXL reports it processed (telemetry), when available."""
    checksum: int | None


@dataclass(frozen=True)
class WriteFailed:
    rank: int
    request_id: str
    error: str


@dataclass(frozen=True)
class Note:
    """Something the writer saw and could not act on (malformed notification, ...)."""

    rank: int
    detail: str


@dataclass
class _InFlight:
    handle: Any
    reg: Registration
    write: m.Write
    started: float
    post_s: float
    descs: int
    checksum: int | None


class RankWriter:
    """One initiator rank: its agent, source pool and background writer thread."""

    def __init__(
        self,
        rank: int,
        tp: int,
        geo: Geometry,
        *,
        merge: bool,
        device: Device = "cpu",
        ucx_params: dict[str, str] | None = None,
        name: str = "probe-initiator",
        expire_after_s: float = 30.0,
        xfer_timeout_s: float = 30.0,
        poll_s: float = 200e-6,
        seed: int = 1234,
    ) -> None:
        self.rank, self.tp, self.geo, self.merge = rank, tp, geo, merge
        self.name = f"{name}-r{rank}"
        self.agent = make_agent(self.name, ucx_params)
        self.pool = Pool(geo, device, seed=seed + rank, index=rank)
        self.pool.register(self.agent)
        self.matcher = m.Matcher(expire_after_s=expire_after_s)
        self.xfer_timeout_s = xfer_timeout_s
        self.poll_s = poll_s
        self.events: queue.Queue[object] = queue.Queue()
        self._inbox: queue.Queue[tuple[m.Finished, int]] = queue.Queue()
        self._stamps: dict[str, int] = {}
        self._inflight: list[_InFlight] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"probe-writer-{rank}", daemon=True)
        self.target: str | None = None
        self._target_base = 0
        self._target_dev = 0

    def metadata(self) -> bytes:
        return bytes(self.agent.get_agent_metadata())

    def connect(self, target_metadata: bytes, base: int, dev_id: int) -> None:
        self.target = _name(self.agent.add_remote_agent(target_metadata))
        self._target_base, self._target_dev = base, dev_id

    def start(self) -> None:
        self._thread.start()

    def finish(self, fin: m.Finished, seq: int) -> None:
        """The source blocks of ``fin`` are ready (any thread); ``seq`` numbers the stamp."""
        self._inbox.put((fin, seq))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for f in self._inflight:
            f.handle.release()
        self._inflight.clear()
        self.pool.deregister()

    # ------------------------------------------------------------------ writer thread

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._step(time.monotonic())
            except Exception as e:  # the thread must report, never die silently
                self.events.put(Note(self.rank, f"writer error: {e!r}"))
            if self._inflight:
                self._poll_inflight()
            else:
                time.sleep(self.poll_s)

    def _step(self, now: float) -> None:
        actions: list[m.Action] = []
        while True:
            try:
                fin, seq = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._stamps[fin.request_id] = seq
            actions += self.matcher.on_finished(fin, now)
        for sender, msgs in self.agent.get_new_notifs().items():
            for msg in msgs:
                if not is_registration(msg):
                    self.events.put(
                        Note(self.rank, f"unexpected notification from {_name(sender)}")
                    )
                    continue
                try:
                    reg = decode_registration(msg)
                except ProtocolError as e:
                    self.events.put(Note(self.rank, str(e)))
                    continue
                actions += self.matcher.on_registration(reg, now)
        actions += self.matcher.expire(now)
        for a in actions:
            if isinstance(a, m.Write):
                self._post(a)
            else:
                self.events.put(a)

    def _post(self, w: m.Write) -> None:
        reg, fin = w.registration, w.finished
        seq = self._stamps.pop(fin.request_id, 0)
        crc = None
        if reg.verify:
            self.pool.stamp(fin.block_ids, seq, self.rank)
            crc = self.pool.checksum(fin.block_ids)
        t0 = time.perf_counter()
        handle = None
        try:
            runs = block_runs(fin.block_ids, reg.block_ids, self.merge)
            src, dst, lens = desc_tables(self.geo, runs)
            n = len(lens)
            dev = np.uint64(self.pool.dev_id)
            local = np.stack([src + np.uint64(self.pool.addr), lens, np.full(n, dev)], axis=1)
            rdev = np.uint64(self._target_dev)
            remote = np.stack([dst + np.uint64(self._target_base), lens, np.full(n, rdev)], 1)
            a = self.agent
            handle = a.initialize_xfer(
                "WRITE",
                a.get_xfer_descs(local, self.pool.mem),
                a.get_xfer_descs(remote, self.pool.mem),
                self.target,
                completion_notif(reg.request_id, self.tp),
            )
            if a.transfer(handle) == "ERR":
                raise EngineError("NIXL refused to post the WRITE")
        except Exception as e:
            if handle is not None:
                handle.release()
            self.events.put(WriteFailed(self.rank, reg.request_id, f"post failed: {e}"))
            return
        self._inflight.append(_InFlight(handle, reg, w, t0, time.perf_counter() - t0, n, crc))

    def _poll_inflight(self) -> None:
        progressed = False
        for f in list(self._inflight):
            state = self.agent.check_xfer_state(f.handle)
            now = time.perf_counter()
            if state == "PROC" and now - f.started <= self.xfer_timeout_s:
                continue
            progressed = True
            self._inflight.remove(f)
            rid = f.reg.request_id
            if state == "DONE":
                self.events.put(
                    WriteDone(
                        self.rank,
                        rid,
                        f.write.first,
                        f.write.waited_s,
                        f.post_s,
                        now - f.started,
                        self.geo.request_bytes,
                        f.descs,
                        _telemetry_descs(self.agent, f.handle),
                        f.checksum,
                    )
                )
            elif state == "PROC":
                self.events.put(
                    WriteFailed(self.rank, rid, f"WRITE not done after {self.xfer_timeout_s:g} s")
                )
            else:
                self.events.put(WriteFailed(self.rank, rid, "NIXL reported the WRITE failed"))
            f.handle.release()
        if not progressed:
            time.sleep(self.poll_s / 4)


def _name(agent_name: object) -> str:
    """NIXL returns agent names as bytes or str depending on the call."""
    return agent_name.decode() if isinstance(agent_name, bytes) else str(agent_name)


def _telemetry_descs(agent: Any, handle: Any) -> int | None:
    try:
        return int(agent.get_xfer_telemetry(handle).descCount)
    except Exception:
        return None


# ------------------------------------------------------------------------------ target


class TargetEngine:
    """The receiving end: one destination pool per initiator rank, registrations out,
    completion notifications counted in."""

    def __init__(
        self,
        geo: Geometry,
        tp: int,
        *,
        device: Device = "cpu",
        ucx_params: dict[str, str] | None = None,
        name: str = "probe-target",
        engine_id: str = "probe-target",
        timeout_s: float = 30.0,
    ) -> None:
        self.geo, self.tp, self.engine_id = geo, tp, engine_id
        self.agent = make_agent(name, ucx_params)
        # device index tp + r: on a multi-GPU host the two ends sit on different GPUs
        self.pools = [Pool(geo, device, seed=None, index=tp + r) for r in range(tp)]
        for p in self.pools:
            p.register(self.agent)
        self.allocator = RingAllocator(geo.pool_blocks)
        self.counter = m.NotifCounter(timeout_s=timeout_s)
        self.peers: list[str] = []
        self.blocks: dict[str, tuple[int, ...]] = {}
        self.verify: set[str] = set()

    def metadata(self) -> bytes:
        return bytes(self.agent.get_agent_metadata())

    def pool_info(self) -> list[tuple[int, int]]:
        """``(base address, device id)`` of the pool each rank writes into."""
        return [(p.addr, p.dev_id) for p in self.pools]

    def add_peer(self, metadata: bytes) -> str:
        name = _name(self.agent.add_remote_agent(metadata))
        self.peers.append(name)
        return name

    def register(self, request_id: str, *, verify: bool = False, now: float) -> Registration:
        blocks = tuple(self.allocator.allocate(self.geo.blocks_per_request))
        reg = Registration(request_id, self.engine_id, 1, blocks, verify)
        self.blocks[request_id] = blocks
        if verify:
            self.verify.add(request_id)
        self.counter.expect(request_id, len(self.peers), now)
        msg = encode_registration(reg)
        for peer in self.peers:
            self.agent.send_notif(peer, msg)
        return reg

    def poll(self, now: float) -> list[m.Received | m.Problem | m.Missing]:
        out: list[m.Received | m.Problem | m.Missing] = []
        for sender, msgs in self.agent.get_new_notifs().items():
            for msg in msgs:
                r = self.counter.on_notif(_name(sender), msg, now)
                if r is not None:
                    out.append(r)
        out += self.counter.expire(now)
        return out

    def checksums(self, request_id: str) -> list[int] | None:
        """Digest of each rank's destination bytes, for requests registered with
        ``verify`` (checksums cost CPU time: the others are not hashed)."""
        if request_id not in self.verify:
            return None
        blocks = self.blocks[request_id]
        return [p.checksum(blocks) for p in self.pools]

    def forget(self, request_id: str) -> None:
        self.blocks.pop(request_id, None)
        self.verify.discard(request_id)

    def close(self) -> None:
        for p in self.pools:
            p.deregister()
