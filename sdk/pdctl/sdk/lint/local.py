"""Rules PD001-PD023: ports and hosts of this machine, the P/D contract (TP, PP, block
sizes, engine ids, leases, modes), devices and cores, managed flags, UCX, the router.
"""

from __future__ import annotations

import errno
import os
import socket
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from pdctl.sdk.fleetplan import (
    InstancePlan,
    compress_ranges,
    effective_block_size,
    effective_mode,
    host_key,
    is_loopback,
    is_wildcard,
)
from pdctl.sdk.lint.core import (
    Finding,
    LintContext,
    _f,
    rule,
)
from pdctl.sdk.modelinfo import (
    config_path_for,
    looks_like_local_path,
)


def _port_owners(ctx: LintContext) -> dict[tuple[str, int], list[str]]:
    owners: dict[tuple[str, int], list[str]] = defaultdict(list)
    if ctx.spec.router is not None:
        owners[(host_key(ctx.spec.router.host), ctx.spec.router.port)].append("router.port")
    o = ctx.spec.observability
    if o.prometheus:
        owners[(host_key(o.prometheus_host), o.prometheus_port)].append(
            "observability.prometheus_port"
        )
    for inst in ctx.plan.instances:
        where = f"{inst.group_role}[{inst.group_index}]"
        hk = host_key(inst.host)
        owners[(hk, inst.http_port)].append(f"{where}.http_port ({inst.name} HTTP)")
        for r, p in enumerate(inst.side_channel_ports):
            label = f"{inst.name} side channel" + (f" dp{r}" if inst.dp > 1 else "")
            owners[(hk, p)].append(f"{where}.side_channel_port ({label})")
        for p, what in zip(inst.kv_events_ports, ("KV events", "KV events replay"), strict=False):
            owners[(hk, p)].append(f"fleet.kv_events_port_base ({inst.name} {what})")
    return owners


@rule("PD001", "two listeners on one host share a port")
def _port_collision(ctx: LintContext) -> Iterator[Finding]:
    for (hk, port), who in sorted(_port_owners(ctx).items()):
        if len(who) > 1:
            yield _f(
                "PD001",
                "error",
                who[0].split(" ")[0],
                f"port {port} on {hk} is used by {len(who)} listeners: {'; '.join(who)}",
                "the second server fails to bind (a NIXL side-channel clash kills its "
                "listener thread while HTTP keeps answering, so transfers hang)",
                "remove the explicit port so pdctl assigns one, or move the base so the "
                "ranges (count x dp for side channels) do not overlap",
            )


def _bind_problem(host: str, port: int) -> int | None:
    """errno when (host, port) cannot be bound here, None when free or not our host."""
    bind_host = "0.0.0.0" if is_wildcard(host) else host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind_host, port))
        except OSError as e:
            if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                return None  # not an address of this machine
            return e.errno
        except socket.gaierror:
            return None
    return None


@rule("PD002", "a port is already bound on this host")
def _port_in_use(ctx: LintContext) -> Iterator[Finding]:
    if not ctx.check_bound_ports:
        return
    checked: set[tuple[str, int]] = set()
    listeners: list[tuple[str, str, int, str]] = []
    if ctx.spec.router is not None:
        listeners.append(("router.port", ctx.spec.router.host, ctx.spec.router.port, "router"))
    o = ctx.spec.observability
    if o.prometheus:
        listeners.append(
            ("observability.prometheus_port", o.prometheus_host, o.prometheus_port, "Prometheus")
        )
    for inst in ctx.plan.instances:
        where = f"{inst.group_role}[{inst.group_index}]"
        listeners.append((f"{where}.http_port", inst.host, inst.http_port, f"{inst.name} HTTP"))
        sc_host = inst.side_channel_host or inst.host
        for p in inst.side_channel_ports:
            listeners.append(
                (f"{where}.side_channel_port", sc_host, p, f"{inst.name} side channel")
            )
        for p in inst.kv_events_ports:
            listeners.append(("fleet.kv_events_port_base", inst.host, p, f"{inst.name} KV events"))
    for field_, host, port, label in listeners:
        if (host, port) in checked:
            continue
        checked.add((host, port))
        err = _bind_problem(host, port)
        if err is not None:
            yield _f(
                "PD002",
                "error",
                field_,
                f"{label} port {port} on {host} is already in use on this machine "
                f"({os.strerror(err)})",
                "the instance cannot start; vLLM may hang in start-up instead of exiting",
                f"stop whatever listens on {port} (`ss -ltnp 'sport = :{port}'`) or choose "
                "another port",
            )


# --------------------------------------------------------------------------- side channel


def _hosts(ctx: LintContext) -> set[str]:
    return {host_key(i.host) for i in ctx.plan.instances}


@rule("PD003", "side-channel host is loopback in a multi-host fleet")
def _sc_loopback(ctx: LintContext) -> Iterator[Finding]:
    hosts = _hosts(ctx)
    if len(hosts) < 2:
        return
    for role, gi, _g, where in ctx.groups():
        insts = ctx.instances_of(role, gi)
        if insts and insts[0].side_channel_host and is_loopback(insts[0].side_channel_host):
            yield _f(
                "PD003",
                "error",
                f"{where}.side_channel_host",
                f"side channel of {insts[0].group} is {insts[0].side_channel_host!r} but the "
                f"fleet spans {len(hosts)} hosts",
                "peers on other hosts cannot reach it: NIXL handshakes fail (push mode "
                "handshakes in both directions) and every request errors or recomputes",
                "set side_channel_host (or host) to an address the other hosts can route to",
            )


@rule("PD004", "side-channel host is a wildcard address")
def _sc_wildcard(ctx: LintContext) -> Iterator[Finding]:
    for role, gi, _g, where in ctx.groups():
        insts = ctx.instances_of(role, gi)
        if (
            insts
            and insts[0].side_channel_host is not None
            and is_wildcard(insts[0].side_channel_host)
        ):
            yield _f(
                "PD004",
                "error",
                f"{where}.side_channel_host",
                f"side channel host of {insts[0].group} is {insts[0].side_channel_host!r} "
                "(a bind-all address, not something a peer can connect to)",
                "the address is advertised to peers, which then fail to handshake",
                "set side_channel_host to this host's routable IP (host may stay 0.0.0.0)",
            )


# --------------------------------------------------------------------------- parallelism


@rule("PD005", "decode TP smaller than prefill TP (non-MLA model)")
def _tp_mismatch(ctx: LintContext) -> Iterator[Finding]:
    if ctx.model is not None and ctx.model.is_mla:
        return
    kv_groups = [
        (r, gi, g, w) for r, gi, g, w in ctx.groups() if effective_mode(ctx.spec, g) != "colocated"
    ]
    max_p = max((g.tp for r, _gi, g, _w in kv_groups if r == "prefill"), default=0)
    if not max_p:
        return
    assumption = (
        ""
        if ctx.model is not None
        else (" (config.json not readable, so the model is assumed non-MLA)")
    )
    for role, _gi, g, where in kv_groups:
        if role == "decode" and g.tp < max_p:
            yield _f(
                "PD005",
                "error",
                f"{where}.tp",
                f"decode TP {g.tp} < prefill TP {max_p}{assumption}",
                "vLLM's NIXL connector rejects it: decode crashes when the first transfer arrives",
                f"give decode tp >= {max_p}, or lower prefill tp to {g.tp}",
            )


@rule("PD006", "pipeline parallelism on decode")
def _decode_pp(ctx: LintContext) -> Iterator[Finding]:
    for role, _gi, g, where in ctx.groups():
        mode = effective_mode(ctx.spec, g)
        if role == "decode" and g.pp > 1 and mode != "colocated":
            yield _f(
                "PD006",
                "error" if mode == "push" else "warning",
                f"{where}.pp",
                f"decode pp={g.pp} in {mode} mode",
                "the push connector refuses PP>1 on the consumer; the engine exits at start"
                if mode == "push"
                else "untested upstream for the consumer side",
                "set pp = 1 on decode and use tp (or more decode instances) instead",
            )


# --------------------------------------------------------------------------- block size


@rule("PD007", "block sizes differ between prefill and decode")
def _block_mismatch(ctx: LintContext) -> Iterator[Finding]:
    sizes = {
        where: effective_block_size(ctx.spec, g)
        for _r, _gi, g, where in ctx.groups()
        if effective_mode(ctx.spec, g) != "colocated"
    }
    if len(set(sizes.values())) > 1:
        first = next(iter(sizes))
        for where, bs in sizes.items():
            if bs != sizes[first]:
                yield _f(
                    "PD007",
                    "error",
                    f"{where}.block_size",
                    f"block size {bs} differs from {first}'s {sizes[first]}",
                    "the handshake passes but every transfer fails or writes the wrong blocks",
                    "use one fleet.block_size and drop per-group block_size overrides",
                )


@rule("PD008", "CPU block size not a multiple of 32")
def _cpu_block(ctx: LintContext) -> Iterator[Finding]:
    if ctx.spec.fleet.platform != "cpu":
        return
    for _r, _gi, g, where in ctx.groups():
        bs = effective_block_size(ctx.spec, g)
        if bs % 32:
            field_ = f"{where}.block_size" if g.block_size else "fleet.block_size"
            yield _f(
                "PD008",
                "error",
                field_,
                f"block size {bs} on the CPU platform",
                "CPU attention only supports multiples of 32: the server exits at start "
                "('No common block size')",
                f"use {max(32, (bs + 31) // 32 * 32)}",
            )


@rule("PD009", "small block size on GPU fragments KV descriptors")
def _gpu_small_block(ctx: LintContext) -> Iterator[Finding]:
    if ctx.spec.fleet.platform != "gpu":
        return
    seen: set[str] = set()
    for _r, _gi, g, where in ctx.groups():
        bs = effective_block_size(ctx.spec, g)
        if bs < 64 and effective_mode(ctx.spec, g) != "colocated":
            field_ = f"{where}.block_size" if g.block_size else "fleet.block_size"
            if field_ in seen:
                continue
            seen.add(field_)
            yield _f(
                "PD009",
                "warning",
                field_,
                f"block size {bs} on GPU",
                f"{128 // bs}x more NIXL descriptors per transfer than block size 128 "
                "(published: 118 → 18,880 descriptors, post time 0.46 → 46 ms at 16)",
                "set fleet.block_size = 128",
            )


# --------------------------------------------------------------------------- engine ids


@rule("PD010", "engine id missing")
def _engine_id_missing(ctx: LintContext) -> Iterator[Finding]:
    for inst in ctx.plan.instances:
        if inst.role not in ("colocated", "render") and not (inst.engine_id or "").strip():
            yield _f(
                "PD010",
                "error",
                f"{inst.group_role}[{inst.group_index}].engine_id",
                f"{inst.name} gets an empty engine id",
                "vLLM then invents a random one, so a concurrent router cannot name the "
                "prefill before it answers and push mode degrades to sequential",
                "use a pattern such as '{name}'",
            )


@rule("PD011", "duplicate engine ids")
def _engine_id_dup(ctx: LintContext) -> Iterator[Finding]:
    owners: dict[str, list[InstancePlan]] = defaultdict(list)
    for inst in ctx.plan.instances:
        for eid in inst.engine_ids:
            if eid.strip():
                owners[eid].append(inst)
    for eid, insts in sorted(owners.items()):
        if len(insts) > 1:
            first = insts[0]
            yield _f(
                "PD011",
                "error",
                f"{first.group_role}[{first.group_index}].engine_id",
                f"engine id {eid!r} is shared by {', '.join(i.name for i in insts)}",
                "decode registers with the wrong prefill and KV can be paired with the wrong "
                "request",
                "include {index} (and {group} or {host}) in engine_id, e.g. '{name}'",
            )


# --------------------------------------------------------------------------- devices


@rule("PD012", "more devices or cores requested than listed")
def _devices_short(ctx: LintContext) -> Iterator[Finding]:
    gpu = ctx.spec.fleet.platform == "gpu"
    for role, gi, g, where in ctx.groups():
        need = g.count * g.ranks
        if gpu and g.devices is not None and len(g.devices) < need:
            yield _f(
                "PD012",
                "error",
                f"{where}.devices",
                f"{g.count} instance(s) x tp{g.tp} x pp{g.pp} x dp{g.dp} need {need} GPUs; "
                f"{len(g.devices)} listed",
                "instances start with too few GPUs and fail at start",
                f"list {need} devices, or lower count/tp/pp/dp",
            )
        if not gpu and g.cpu_cores is not None and len(g.cpu_cores) < g.count:
            yield _f(
                "PD012",
                "warning",
                f"{where}.cpu_cores",
                f"{g.count} instance(s) share {len(g.cpu_cores)} core(s): "
                + "; ".join(
                    f"{i.name} on core {compress_ranges(i.cpu_cores)}"
                    for i in ctx.instances_of(role, gi)
                ),
                "instances on one core take turns and each runs slower",
                f"list {g.count} cores for one each, or lower count",
            )
        elif not gpu and g.cpu_cores is not None and (len(g.cpu_cores) // g.count < g.ranks):
            yield _f(
                "PD012",
                "warning",
                f"{where}.cpu_cores",
                f"each instance gets {len(g.cpu_cores) // g.count} core(s) for {g.ranks} ranks",
                "ranks share a core and run several times slower",
                f"list {g.count * g.ranks} cores or lower tp/pp/dp",
            )


@rule("PD013", "one device or core given to two instances")
def _devices_shared(ctx: LintContext) -> Iterator[Finding]:
    kind = "GPU" if ctx.spec.fleet.platform == "gpu" else "core"
    owners: dict[tuple[str, int], list[InstancePlan]] = defaultdict(list)
    for inst in ctx.plan.instances:
        for d in inst.devices if kind == "GPU" else inst.cpu_cores:
            owners[(host_key(inst.host), d)].append(inst)
    for (hk, d), insts in sorted(owners.items()):
        # cores shared inside one group were asked for (PD012 says so)
        if len({(i.group_role, i.group_index) for i in insts}) > 1 or (
            kind == "GPU" and len(insts) > 1
        ):
            first = insts[-1]
            yield _f(
                "PD013",
                "error" if kind == "GPU" else "warning",
                f"{first.group_role}[{first.group_index}]."
                + ("devices" if kind == "GPU" else "cpu_cores"),
                f"{kind} {d} on {hk} is assigned to {', '.join(i.name for i in insts)}",
                "two engines on one GPU each reserve most of its memory; the second OOMs"
                if kind == "GPU"
                else "the engines compete for one core and both slow down",
                "give each instance its own devices",
            )


# --------------------------------------------------------------------------- transfer settings


@rule("PD014", "KV lease shorter than the registration wait it must cover")
def _lease(ctx: LintContext) -> Iterator[Finding]:
    fleet = ctx.spec.fleet
    if not any(effective_mode(ctx.spec, g) == "push" for _r, _gi, g, _w in ctx.groups()):
        return
    if fleet.kv_lease_duration_s < fleet.push_registration_timeout_s:
        yield _f(
            "PD014",
            "warning",
            "fleet.kv_lease_duration_s",
            f"lease {fleet.kv_lease_duration_s} s < push_registration_timeout "
            f"{fleet.push_registration_timeout_s:g} s",
            "decode may still legitimately wait for a push after prefill has dropped the "
            "blocks; with concurrent dispatch the lease is never renewed (vLLM #53095), so "
            "such requests wait out the client timeout",
            f"raise kv_lease_duration_s to >= {fleet.push_registration_timeout_s:g} (or "
            "lower push_registration_timeout_s to your worst decode queueing delay)",
        )


@rule("PD015", "push and pull mixed in one fleet")
def _mixed_modes(ctx: LintContext) -> Iterator[Finding]:
    modes = {where: effective_mode(ctx.spec, g) for _r, _gi, g, where in ctx.groups()}
    if len(set(modes.values())) > 1:
        for where, m in modes.items():
            if m != ctx.spec.fleet.mode:
                yield _f(
                    "PD015",
                    "error",
                    f"{where}.mode",
                    f"{where} runs {m} but fleet.mode is {ctx.spec.fleet.mode}",
                    "push and pull connectors have different compatibility hashes: every "
                    "handshake between them fails",
                    "remove the per-group mode override",
                )


_MANAGED_ARGS = {
    "--kv-transfer-config": "the fleet's mode/transfer settings",
    "--port": "http_port",
    "--host": "host",
    "--block-size": "fleet.block_size",
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--pipeline-parallel-size": "pp",
    "-pp": "pp",
    "--data-parallel-size": "dp",
    "-dp": "dp",
    "--served-model-name": "model.served_name",
    "--model": "model.path",
    "--kv-events-config": "fleet.kv_events",
    "--prefix-caching-hash-algo": "fleet.prefix_caching_hash_algo",
}
_MANAGED_ENV = {
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "side_channel_host",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "side_channel_port",
    "CUDA_VISIBLE_DEVICES": "devices",
    "VLLM_CPU_OMP_THREADS_BIND": "cpu_cores",
}


@rule("PD016", "extra args or env override what pdctl manages")
def _managed(ctx: LintContext) -> Iterator[Finding]:
    places: list[tuple[str, list[str], dict[str, str]]] = [
        ("fleet", ctx.spec.fleet.vllm_args, ctx.spec.fleet.env)
    ]
    places += [(w, g.vllm_args, g.env) for _r, _gi, g, w in ctx.groups()]
    for where, args, env in places:
        for a in args:
            flag = a.split("=", 1)[0]
            if flag in _MANAGED_ARGS:
                yield _f(
                    "PD016",
                    "error",
                    f"{where}.vllm_args",
                    f"{flag} is set by pdctl from {_MANAGED_ARGS[flag]}",
                    "two values for one flag: the later one silently wins and the router, "
                    "linter and monitor disagree with the running server",
                    f"remove {flag} from vllm_args and set {_MANAGED_ARGS[flag]} instead",
                )
        for k in env:
            if k in _MANAGED_ENV:
                yield _f(
                    "PD016",
                    "error",
                    f"{where}.env",
                    f"{k} is set by pdctl from {_MANAGED_ENV[k]}",
                    "the port/device plan pdctl checked is not the one that runs",
                    f"remove {k} from env and set {_MANAGED_ENV[k]} instead",
                )


@rule("PD017", "KV buffer device does not fit the platform")
def _buffer_device(ctx: LintContext) -> Iterator[Finding]:
    fleet = ctx.spec.fleet
    if fleet.platform == "cpu" and fleet.effective_kv_buffer_device != "cpu":
        yield _f(
            "PD017",
            "error",
            "fleet.kv_buffer_device",
            "kv_buffer_device is 'cuda' on the CPU platform",
            "the connector cannot register CUDA memory without a GPU: the engine exits",
            "set kv_buffer_device = 'cpu' (or leave it unset)",
        )


@rule("PD018", "a disaggregated fleet without prefill or decode")
def _missing_role(ctx: LintContext) -> Iterator[Finding]:
    if ctx.spec.fleet.mode == "colocated":
        return
    for role, groups in (("prefill", ctx.spec.prefill), ("decode", ctx.spec.decode)):
        if not groups:
            yield _f(
                "PD018",
                "error",
                role,
                f"{ctx.spec.fleet.mode} mode with no [[{role}]] group",
                "no request can complete: every one needs a prefill and a decode",
                f"add a [[{role}]] table, or set fleet.mode = 'colocated'",
            )


@rule("PD019", "local model path missing")
def _model_path(ctx: LintContext) -> Iterator[Finding]:
    path = ctx.spec.model.path
    if ctx.model_error:
        yield _f(
            "PD019",
            "error",
            "model.path",
            ctx.model_error,
            "vLLM cannot load the model either",
            "fix or replace config.json",
        )
        return
    if config_path_for(path) is not None:
        return
    local = looks_like_local_path(path)
    if local and not Path(os.path.expanduser(path)).exists():
        yield _f(
            "PD019",
            "error",
            "model.path",
            f"{path} does not exist",
            "every instance exits at start",
            "build or copy the model there (pdctl demo builds the tiny CPU model), or fix the path",
        )
    elif local:
        yield _f(
            "PD019",
            "warning",
            "model.path",
            f"{path} has no config.json",
            "vLLM will not recognise it as a model; pdctl cannot check MLA/TP rules",
            "point model.path at the directory that holds config.json",
        )


_NETWORK_TLS = ("tcp", "rc", "ud", "dc", "ib", "all", "^")


@rule("PD020", "UCX_TLS without a transport NIXL can use for errors")
def _ucx_tls(ctx: LintContext) -> Iterator[Finding]:
    tls = ctx.spec.fleet.ucx.tls
    if tls is None or "UCX" not in ctx.spec.fleet.nixl_backends:
        return
    tokens = [t.strip() for t in tls.split(",") if t.strip()]
    if tls.startswith("^") or any(t.startswith(_NETWORK_TLS) for t in tokens):
        return
    yield _f(
        "PD020",
        "error" if ctx.spec.fleet.platform == "cpu" else "warning",
        "fleet.ucx.tls",
        f"UCX_TLS={tls} has no network transport (tcp, rc, ud, dc)",
        "NIXL's UCX backend asks for peer-failure handling, which these transports lack: "
        "agent creation fails with NIXL_ERR_BACKEND and the engine exits",
        f"add tcp (e.g. '{tls},tcp') or leave fleet.ucx.tls unset",
    )


@rule("PD021", "router API key source not available")
def _api_key(ctx: LintContext) -> Iterator[Finding]:
    r = ctx.spec.router
    if r is None or r.api_key is None:
        return
    if r.api_key.env and not ctx.environ.get(r.api_key.env):
        yield _f(
            "PD021",
            "warning",
            "router.api_key.env",
            f"environment variable {r.api_key.env} is not set here",
            "the router would start without the key and refuse every request",
            f"export {r.api_key.env}=... before starting the router",
        )
    if r.api_key.file and not Path(os.path.expanduser(r.api_key.file)).is_file():
        yield _f(
            "PD021",
            "warning",
            "router.api_key.file",
            f"{r.api_key.file} does not exist",
            "the router cannot read its key and will not start",
            "create the file (mode 600) or fix the path",
        )


@rule("PD022", "push mode behind a sequential router")
def _sequential_push(ctx: LintContext) -> Iterator[Finding]:
    r = ctx.spec.router
    if r is not None and not r.concurrent and ctx.spec.fleet.mode == "push":
        yield _f(
            "PD022",
            "warning",
            "router.concurrent",
            "push mode with router.concurrent = false",
            "every request takes the 'prefill finished first' path: push is then slower "
            "than pull (an extra D→P message and two engine-step boundaries)",
            "set router.concurrent = true, or use fleet.mode = 'pull'",
        )


@rule("PD023", "CPU tuning asked for with vLLM's stock connector")
def _stock_cpu_tuning(ctx: LintContext) -> Iterator[Finding]:
    fleet = ctx.spec.fleet
    if (
        fleet.connector == "stock"
        and fleet.platform == "cpu"
        and fleet.cpu_tuning
        and fleet.mode != "colocated"
    ):
        yield _f(
            "PD023",
            "warning",
            "fleet.connector",
            "fleet.cpu_tuning = true has no effect with fleet.connector = 'stock'",
            "each idle instance busy-polls NIXL's progress thread (about one core) and vLLM "
            "re-pins the worker to one core per NUMA node: two instances on a small machine "
            "share a core and requests slow down",
            "set fleet.connector = 'pdctl' (the default), or fleet.cpu_tuning = false to "
            "silence this",
        )
