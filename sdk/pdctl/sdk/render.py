"""Spec → launch plans: the exact argv and environment of every vLLM instance.

Pure functions: no I/O except ``~`` expansion of the model path (and, on the CPU
platform, the default interpreter is the one running pdctl). Ports are assigned
deterministically per host — explicit bases are honoured first (the linter reports
clashes between them), then every group without one gets the first free range at or
above its role's default base, so automatic ports never collide with anything.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from pdctl.sdk.spec import (
    FleetSpec,
    InstanceGroup,
    Mode,
    RenderGroup,
    Role,
    group_name,
    render_group_name,
)
from pdctl.sdk.urls import http_url

PlanRole = Literal["prefill", "decode", "colocated", "router", "render", "prometheus"]

DEFAULT_HTTP_BASE: dict[str, int] = {"prefill": 8100, "decode": 8200, "render": 8300}
DEFAULT_SIDE_CHANNEL_BASE = 5600
CPU_ENTRYPOINT = "vllm.entrypoints.openai.api_server"
RENDER_ENTRYPOINT = "vllm.entrypoints.launchers.render.entry"
"""vLLM's GPU-less render server (what ``vllm launch render`` runs)."""
CONNECTOR_MODULE = "pdctl.connector.push"
"""Where vLLM finds pdctl's connectors (``kv_connector_module_path``)."""
CONNECTORS = {  # (mode, fleet.connector) -> kv_connector class name
    ("push", "pdctl"): "PdctlPushConnector",
    ("pull", "pdctl"): "PdctlPullConnector",
    ("push", "stock"): "NixlPushConnector",
    ("pull", "stock"): "NixlConnector",
}
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", "ip6-localhost"})


class InstancePlan(BaseModel):
    """Everything needed to start one vLLM server and find it again."""

    model_config = ConfigDict(frozen=True)

    name: str
    role: PlanRole
    group: str
    group_role: Role | Literal["router", "render", "prometheus"]
    group_index: int
    index: int
    host: str
    http_port: int
    side_channel_host: str | None
    side_channel_port: int | None
    """First side-channel port; DP rank r listens on this + r."""
    engine_id: str | None
    """The engine id given to vLLM (with DP, vLLM appends ``_dp<rank>`` per rank)."""
    mode: Mode
    tp: int
    pp: int
    dp: int
    block_size: int
    devices: tuple[int, ...]
    cpu_cores: tuple[int, ...]
    kv_transfer_config: dict[str, Any] | None
    argv: tuple[str, ...]
    env: dict[str, str]
    kv_events_port: int | None = None
    """The KV event publisher's port (ZMQ PUB); its replay socket listens on the next."""

    @property
    def kv_events_ports(self) -> tuple[int, ...]:
        """(publisher, replay) when the instance publishes KV cache events."""
        if self.kv_events_port is None:
            return ()
        return (self.kv_events_port, self.kv_events_port + 1)

    @property
    def url(self) -> str:
        return http_url(self.host, self.http_port)

    @property
    def side_channel_ports(self) -> tuple[int, ...]:
        if self.side_channel_port is None:
            return ()
        return tuple(self.side_channel_port + r for r in range(self.dp))

    @property
    def engine_ids(self) -> tuple[str, ...]:
        """The engine ids the instance will actually announce (one per DP rank)."""
        if self.engine_id is None:
            return ()
        if self.dp == 1:
            return (self.engine_id,)
        return tuple(f"{self.engine_id}_dp{r}" for r in range(self.dp))

    def ports(self) -> tuple[int, ...]:
        return (self.http_port, *self.side_channel_ports, *self.kv_events_ports)

    def shell(self) -> str:
        """One shell line that reproduces the launch."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = shlex.join(self.argv)
        return f"env {env} {cmd}" if env else cmd

    def as_json(self) -> dict[str, Any]:
        d = self.model_dump(mode="json")
        if self.kv_events_port is None:
            d.pop("kv_events_port")
        d["url"] = self.url
        d["engine_ids"] = list(self.engine_ids)
        d["side_channel_ports"] = list(self.side_channel_ports)
        return d


class RouterPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str
    port: int


class FleetPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    instances: tuple[InstancePlan, ...]
    router: RouterPlan | None

    def by_name(self, name: str) -> InstancePlan:
        for inst in self.instances:
            if inst.name == name:
                return inst
        raise KeyError(name)

    def role(self, role: PlanRole) -> list[InstancePlan]:
        return [i for i in self.instances if i.role == role]


def host_key(host: str) -> str:
    """Hosts that share one port space (all loopback/wildcard spellings are one)."""
    h = host.strip().lower()
    return "local" if h in _LOOPBACK_NAMES or h.startswith("127.") else h


def is_loopback(host: str) -> bool:
    h = host.strip().lower()
    return h in ("localhost", "::1", "ip6-localhost") or h.startswith("127.")


def is_wildcard(host: str) -> bool:
    return host.strip() in ("0.0.0.0", "::", "")


def effective_mode(spec: FleetSpec, group: InstanceGroup) -> Mode:
    return group.mode or spec.fleet.mode


def effective_block_size(spec: FleetSpec, group: InstanceGroup) -> int:
    return group.block_size or spec.fleet.effective_block_size


class _PortBook:
    """Per-host sets of taken ports."""

    def __init__(self) -> None:
        self.taken: dict[str, set[int]] = {}

    def take(self, host: str, ports: Iterable[int]) -> None:
        self.taken.setdefault(host_key(host), set()).update(ports)

    def first_free_range(self, host: str, base: int, width: int) -> int:
        used = self.taken.setdefault(host_key(host), set())
        start = base
        while any(p in used for p in range(start, start + width)):
            start += 1
        if start + width - 1 > 65535:
            raise ValueError(f"no free range of {width} ports at or above {base} on {host}")
        return start


def _group_ports(
    spec: FleetSpec, book: _PortBook | None = None
) -> dict[tuple[Role, int], tuple[int, int]]:
    """(role, group index) → (first HTTP port, first side-channel port)."""
    book = book if book is not None else _PortBook()
    if spec.router is not None:
        book.take(spec.router.host, [spec.router.port])
    groups = spec.groups()
    # explicit ports first, so automatic ones keep clear of them wherever they appear
    for _role, _gi, g in groups:
        if g.http_port is not None:
            book.take(g.host, range(g.http_port, g.http_port + g.count))
        if g.side_channel_port is not None:
            book.take(g.host, range(g.side_channel_port, g.side_channel_port + g.count * g.dp))
    out: dict[tuple[Role, int], tuple[int, int]] = {}
    for role, gi, g in groups:
        http = g.http_port
        if http is None:
            http = book.first_free_range(g.host, DEFAULT_HTTP_BASE[role], g.count)
            book.take(g.host, range(http, http + g.count))
        sc = g.side_channel_port
        if sc is None:
            width = g.count * g.dp
            sc = book.first_free_range(g.host, DEFAULT_SIDE_CHANNEL_BASE, width)
            book.take(g.host, range(sc, sc + width))
        out[(role, gi)] = (http, sc)
    return out


def _kv_events_ports(spec: FleetSpec, book: _PortBook) -> dict[tuple[Role, int], int]:
    """(role, group index) → first KV event port (two per instance and DP rank: vLLM
    offsets both sockets by the rank), when the fleet publishes KV events."""
    if not spec.kv_events_on:
        return {}
    out: dict[tuple[Role, int], int] = {}
    for role, gi, g in spec.groups():
        width = 2 * g.count * g.dp
        first = book.first_free_range(g.host, spec.fleet.kv_events_port_base, width)
        book.take(g.host, range(first, first + width))
        out[(role, gi)] = first
    return out


def kv_events_config(port: int) -> dict[str, Any]:
    """vLLM's ``--kv-events-config`` for a publisher on ``port`` (replay on the next)."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port}",
        "replay_endpoint": f"tcp://*:{port + 1}",
    }


def with_kv_events(inst: InstancePlan, port: int) -> InstancePlan:
    """``inst`` publishing its KV cache events on ``port`` (and replaying on the next)."""
    cfg = json.dumps(kv_events_config(port), separators=(",", ":"))
    return inst.model_copy(
        update={"kv_events_port": port, "argv": (*inst.argv, "--kv-events-config", cfg)}
    )


def _render_ports(spec: FleetSpec, book: _PortBook) -> list[int]:
    """First HTTP port of every render group (explicit ones first)."""
    for r in spec.render:
        if r.http_port is not None:
            book.take(r.host, range(r.http_port, r.http_port + r.count))
    out = []
    for r in spec.render:
        http = r.http_port
        if http is None:
            http = book.first_free_range(r.host, DEFAULT_HTTP_BASE["render"], r.count)
            book.take(r.host, range(http, http + r.count))
        out.append(http)
    return out


def render_fleet(spec: FleetSpec) -> FleetPlan:
    """Every instance of the spec as a launch plan: prefill groups, decode groups, then
    render servers."""
    book = _PortBook()
    for r in spec.render:  # explicit render ports are kept clear of automatic ones
        if r.http_port is not None:
            book.take(r.host, range(r.http_port, r.http_port + r.count))
    ports = _group_ports(spec, book)
    events = _kv_events_ports(spec, book)
    next_device: dict[str, int] = {}
    instances: list[InstancePlan] = []
    n_by_role = {"prefill": len(spec.prefill), "decode": len(spec.decode)}
    for role, gi, g in spec.groups():
        gname = group_name(role, gi, g, n_by_role[role])
        http0, sc0 = ports[(role, gi)]
        for i in range(g.count):
            devices: tuple[int, ...] = ()
            if spec.fleet.platform == "gpu":
                if g.devices is not None:
                    devices = tuple(g.devices[i * g.ranks : (i + 1) * g.ranks])
                else:
                    hk = host_key(g.host)
                    start = next_device.get(hk, 0)
                    devices = tuple(range(start, start + g.ranks))
                    next_device[hk] = start + g.ranks
            cores = split_cores(g.cpu_cores, g.count)[i]
            inst = _instance(spec, role, gi, gname, g, i, http0 + i, sc0 + i * g.dp, devices, cores)
            if (role, gi) in events:
                inst = with_kv_events(inst, events[(role, gi)] + 2 * i * g.dp)
            instances.append(inst)
    for ri, (r, http0) in enumerate(zip(spec.render, _render_ports(spec, book), strict=True)):
        rname = render_group_name(ri, r, len(spec.render))
        for i in range(r.count):
            rcores = split_cores(r.cpu_cores, r.count)[i]
            instances.append(_render_instance(spec, ri, rname, r, i, http0 + i, rcores))
    router = RouterPlan(host=spec.router.host, port=spec.router.port) if spec.router else None
    return FleetPlan(instances=tuple(instances), router=router)


def _render_instance(
    spec: FleetSpec,
    gi: int,
    gname: str,
    r: RenderGroup,
    index: int,
    http_port: int,
    cores: tuple[int, ...],
) -> InstancePlan:
    """A GPU-less render server: tokenizes for the engines and turns their token output
    back into OpenAI responses (the router's ``tokens`` path)."""
    fleet = spec.fleet
    model_path = os.path.expanduser(spec.model.path)
    if fleet.platform == "gpu":
        args = ["vllm", "launch", "render", model_path]
    else:
        args = [fleet.python or sys.executable, "-m", RENDER_ENTRYPOINT, "--model", model_path]
    args += ["--served-model-name", spec.model.effective_served_name]
    args += ["--host", r.host, "--port", str(http_port)]
    if spec.model.max_model_len is not None:
        args += ["--max-model-len", str(spec.model.max_model_len)]
    if spec.model.trust_remote_code:
        args.append("--trust-remote-code")
    args += r.vllm_args
    env: dict[str, str] = {}
    if cores:
        env["OMP_NUM_THREADS"] = "1"
    env.update(fleet.env)
    env.update(r.env)
    return InstancePlan(
        name=f"{gname}-{index}",
        role="render",
        group=gname,
        group_role="render",
        group_index=gi,
        index=index,
        host=r.host,
        http_port=http_port,
        side_channel_host=None,
        side_channel_port=None,
        engine_id=None,
        mode=fleet.mode,
        tp=1,
        pp=1,
        dp=1,
        block_size=fleet.effective_block_size,
        devices=(),
        cpu_cores=cores,
        kv_transfer_config=None,
        argv=tuple(args),
        env=env,
    )


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


def kv_transfer_config(
    spec: FleetSpec, role: Role, mode: Mode, engine_id: str
) -> dict[str, Any] | None:
    """The ``--kv-transfer-config`` object for one instance (None when colocated)."""
    if mode == "colocated":
        return None
    fleet = spec.fleet
    extra: dict[str, Any] = {
        "backends": list(fleet.nixl_backends),
        "num_threads": fleet.nixl_num_threads,
        "kv_lease_duration": fleet.kv_lease_duration_s,
    }
    if mode == "push":
        extra["push_registration_timeout"] = _num(fleet.push_registration_timeout_s)
        kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
    else:
        kv_role = "kv_both"
    if fleet.connector == "pdctl" and fleet.platform == "cpu" and fleet.cpu_tuning:
        extra["pdctl_nixl_progress_thread"] = False
        extra["pdctl_reserve_kv_core"] = False
    if fleet.connector == "pdctl":
        extra.update(fleet.connector_options)
    module = {"kv_connector_module_path": CONNECTOR_MODULE} if fleet.connector == "pdctl" else {}
    return {
        "kv_connector": CONNECTORS[(mode, fleet.connector)],
        **module,
        "kv_role": kv_role,
        "engine_id": engine_id,
        "kv_buffer_device": fleet.effective_kv_buffer_device,
        "kv_load_failure_policy": fleet.failure_policy,
        "kv_connector_extra_config": extra,
    }


def _instance(
    spec: FleetSpec,
    role: Role,
    gi: int,
    gname: str,
    g: InstanceGroup,
    index: int,
    http_port: int,
    side_channel_port: int,
    devices: tuple[int, ...],
    cores: tuple[int, ...],
) -> InstancePlan:
    fleet = spec.fleet
    mode = effective_mode(spec, g)
    name = f"{gname}-{index}"
    block_size = effective_block_size(spec, g)
    engine_id: str | None = None
    sc_host: str | None = None
    sc_port: int | None = None
    ktc: dict[str, Any] | None = None
    if mode != "colocated":
        engine_id = g.engine_id.format(name=name, role=role, group=gname, index=index, host=g.host)
        sc_host = g.side_channel_host or g.host
        sc_port = side_channel_port
        ktc = kv_transfer_config(spec, role, mode, engine_id)

    model_path = os.path.expanduser(spec.model.path)
    args: list[str] = []
    if fleet.platform == "gpu":
        args += ["vllm", "serve", model_path]
    else:
        args += [fleet.python or sys.executable, "-m", CPU_ENTRYPOINT, "--model", model_path]
    args += ["--served-model-name", spec.model.effective_served_name]
    args += ["--host", g.host, "--port", str(http_port)]
    args += ["--tensor-parallel-size", str(g.tp)]
    if g.pp > 1:
        args += ["--pipeline-parallel-size", str(g.pp)]
    if g.dp > 1:
        args += ["--data-parallel-size", str(g.dp)]
    args += ["--block-size", str(block_size)]
    if spec.model.dtype != "auto":
        args += ["--dtype", spec.model.dtype]
    if spec.model.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", spec.model.kv_cache_dtype]
    if spec.model.max_model_len is not None:
        args += ["--max-model-len", str(spec.model.max_model_len)]
    if g.max_num_seqs is not None:
        args += ["--max-num-seqs", str(g.max_num_seqs)]
    if spec.model.trust_remote_code:
        args.append("--trust-remote-code")
    if fleet.enable_prefix_caching is not None:
        args.append(
            "--enable-prefix-caching"
            if fleet.enable_prefix_caching
            else "--no-enable-prefix-caching"
        )
    if fleet.prefix_caching_hash_algo != "sha256":
        args += ["--prefix-caching-hash-algo", fleet.prefix_caching_hash_algo]
    if ktc is not None:
        args += ["--kv-transfer-config", json.dumps(ktc, separators=(",", ":"))]
    if spec.router is not None and spec.router.path == "tokens":
        args.append("--enable-scale-out")  # token-in/token-out /inference/v1/generate
    otlp = spec.router.otlp_traces_url if spec.router is not None else None
    if otlp:
        args += ["--otlp-traces-endpoint", otlp]
    args += fleet.vllm_args
    args += g.vllm_args

    env: dict[str, str] = {}
    if otlp:
        env.update(
            {
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "OTEL_SERVICE_NAME": "vllm",
                "OTEL_RESOURCE_ATTRIBUTES": f"pdctl.fleet={fleet.name},pdctl.instance={name},"
                f"pdctl.role={role}",
            }
        )
    if sc_host is not None and sc_port is not None:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = sc_host
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(sc_port)
    if fleet.ucx.tls is not None:
        env["UCX_TLS"] = fleet.ucx.tls
    if fleet.ucx.net_devices is not None:
        env["UCX_NET_DEVICES"] = fleet.ucx.net_devices
    env.update(fleet.ucx.env)
    if fleet.platform == "gpu" and devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in devices)
    if fleet.platform == "cpu":
        if fleet.cpu_kvcache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(fleet.cpu_kvcache_gib)
        if cores:
            bind, per_rank = cpu_binding(cores, g.ranks)
            env["VLLM_CPU_OMP_THREADS_BIND"] = bind
            env["OMP_NUM_THREADS"] = str(per_rank)
    env.update(fleet.env)
    env.update(g.env)

    return InstancePlan(
        name=name,
        role="colocated" if mode == "colocated" else role,
        group=gname,
        group_role=role,
        group_index=gi,
        index=index,
        host=g.host,
        http_port=http_port,
        side_channel_host=sc_host,
        side_channel_port=sc_port,
        engine_id=engine_id,
        mode=mode,
        tp=g.tp,
        pp=g.pp,
        dp=g.dp,
        block_size=block_size,
        devices=devices,
        cpu_cores=cores,
        kv_transfer_config=ktc,
        argv=tuple(args),
        env=env,
    )


def split_cores(cores: list[int] | None, count: int) -> list[tuple[int, ...]]:
    """A group's cores split as evenly as they go over its ``count`` instances: runs of
    consecutive cores whose sizes differ by at most one; with fewer cores than
    instances, neighbouring instances share a core (lint warns, PD012)."""
    if not cores:
        return [()] * count
    n = len(cores)
    out = []
    for i in range(count):
        start = i * n // count
        end = max(start + 1, (i + 1) * n // count)
        out.append(tuple(cores[start:end]))
    return out


def cpu_binding(cores: tuple[int, ...], ranks: int) -> tuple[str, int]:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` workers sharing ``cores`` evenly:
    one core list per rank, ranks separated by ``|``; plus threads per rank."""
    per = max(1, len(cores) // ranks)
    parts = []
    for r in range(ranks):
        chunk = cores[r * per : (r + 1) * per] or cores[-1:]
        parts.append(compress_ranges(chunk))
    return "|".join(parts), per


def compress_ranges(values: Iterable[int]) -> str:
    """(0, 1, 2, 5) → '0-2,5'."""
    vals = sorted(set(values))
    out: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ",".join(out)


def router_plan(spec: FleetSpec, argv: tuple[str, ...]) -> InstancePlan | None:
    """The router as one more supervised process (None when the spec has no router)."""
    if spec.router is None:
        return None
    return _service_plan(spec, "router", spec.router.host, spec.router.port, argv)


def prometheus_plan(spec: FleetSpec, argv: tuple[str, ...]) -> InstancePlan | None:
    """The local Prometheus of ``[observability] prometheus = true`` as one more supervised
    process (None when it is off)."""
    o = spec.observability
    if not o.prometheus:
        return None
    return _service_plan(spec, "prometheus", o.prometheus_host, o.prometheus_port, argv)


def _service_plan(
    spec: FleetSpec,
    name: Literal["router", "prometheus"],
    host: str,
    port: int,
    argv: tuple[str, ...],
) -> InstancePlan:
    return InstancePlan(
        name=name,
        role=name,
        group=name,
        group_role=name,
        group_index=0,
        index=0,
        host=host,
        http_port=port,
        side_channel_host=None,
        side_channel_port=None,
        engine_id=None,
        mode=spec.fleet.mode,
        tp=1,
        pp=1,
        dp=1,
        block_size=spec.fleet.effective_block_size,
        devices=(),
        cpu_cores=(),
        kv_transfer_config=None,
        argv=argv,
        env={},
    )


def with_engine_id(plan: InstancePlan, engine_id: str) -> InstancePlan:
    """The same instance announcing another engine id (argv included).

    Used when an instance restarts: peers cache NIXL agents by engine id, and a restarted
    engine reusing its old id would be reached through the dead agent (transfers fail
    with NIXL_ERR_REMOTE_DISCONNECT and the request hangs until the client times out).
    """
    if plan.kv_transfer_config is None:
        return plan
    ktc = {**plan.kv_transfer_config, "engine_id": engine_id}
    argv = list(plan.argv)
    i = argv.index("--kv-transfer-config")
    argv[i + 1] = json.dumps(ktc, separators=(",", ":"))
    return plan.model_copy(
        update={"engine_id": engine_id, "kv_transfer_config": ktc, "argv": tuple(argv)}
    )
