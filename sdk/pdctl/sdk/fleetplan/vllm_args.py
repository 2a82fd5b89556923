"""The argv and environment vLLM is started with: engines (``vllm serve`` or the CPU
entry point) and render servers, the ``--kv-transfer-config`` and
``--kv-events-config`` objects, and the rewrites a restart or a KV event port needs.

Pure functions: no I/O except ``~`` expansion of the model path (and, on the CPU
platform, the default interpreter is the one running pdctl).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from pdctl.sdk.fleetplan.cores import cpu_binding
from pdctl.sdk.fleetplan.model import FleetPlan, InstancePlan
from pdctl.sdk.fleetplan.ports import is_loopback
from pdctl.sdk.spec import FleetSpec, InstanceGroup, Mode, RenderGroup, Role

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


def effective_mode(spec: FleetSpec, group: InstanceGroup) -> Mode:
    return group.mode or spec.fleet.mode


def effective_block_size(spec: FleetSpec, group: InstanceGroup) -> int:
    return group.block_size or spec.fleet.effective_block_size


def _json(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


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
    cfg = _json(kv_events_config(port))
    return inst.model_copy(
        update={"kv_events_port": port, "argv": (*inst.argv, "--kv-events-config", cfg)}
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
    argv[i + 1] = _json(ktc)
    return plan.model_copy(
        update={"engine_id": engine_id, "kv_transfer_config": ktc, "argv": tuple(argv)}
    )


def engine_argv(
    spec: FleetSpec,
    g: InstanceGroup,
    http_port: int,
    block_size: int,
    ktc: dict[str, Any] | None,
) -> list[str]:
    """``vllm serve`` (GPU) or the CPU entry point, with everything the group asks for."""
    fleet = spec.fleet
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
        args += ["--kv-transfer-config", _json(ktc)]
    if spec.router is not None and spec.router.path == "tokens":
        args.append("--enable-scale-out")  # token-in/token-out /inference/v1/generate
    otlp = spec.router.otlp_traces_url if spec.router is not None else None
    if otlp:
        args += ["--otlp-traces-endpoint", otlp]
    args += fleet.vllm_args
    args += g.vllm_args
    return args


def loopback_only(spec: FleetSpec) -> bool:
    """A CPU fleet on this machine whose engines all bind loopback: UCX's network
    listeners have no reason to leave it (``fleet.ucx.net_devices`` overrides; the
    router's own address does not matter: it never speaks UCX)."""
    if spec.backend.kind != "local" or spec.fleet.platform != "cpu":
        return False
    return all(is_loopback(g.host) for _, _, g in spec.groups())


def engine_env(
    spec: FleetSpec,
    g: InstanceGroup,
    name: str,
    role: Role,
    side_channel: tuple[str, int] | None,
    devices: tuple[int, ...],
    cores: tuple[int, ...],
) -> dict[str, str]:
    """The engine's environment: tracing, NIXL side channel, UCX, devices, CPU binding,
    then the fleet's and the group's own variables (last, so they win)."""
    fleet = spec.fleet
    otlp = spec.router.otlp_traces_url if spec.router is not None else None
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
    if side_channel is not None:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = side_channel[0]
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_channel[1])
    if fleet.ucx.tls is not None:
        env["UCX_TLS"] = fleet.ucx.tls
    if fleet.ucx.net_devices is not None:
        env["UCX_NET_DEVICES"] = fleet.ucx.net_devices
    elif loopback_only(spec):
        # UCX otherwise opens TCP listeners on every network interface of the machine
        # (found by `pdctl audit` on the demo fleet): a fleet confined to loopback keeps
        # them there too; shared memory, what KV moves over on one machine, is unaffected
        env["UCX_NET_DEVICES"] = "lo"
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
    return env


def render_server_argv(spec: FleetSpec, r: RenderGroup, http_port: int) -> list[str]:
    """``vllm launch render`` (GPU) or its entry point (CPU) for one render server."""
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
    return args


def render_server_env(spec: FleetSpec, r: RenderGroup, cores: tuple[int, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    if cores:
        env["OMP_NUM_THREADS"] = "1"
    env.update(spec.fleet.env)
    env.update(r.env)
    return env


def flag_value(argv: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The value of ``flag`` in a command line (``--flag V`` or ``--flag=V``; the last
    one wins, as in argparse), or None when it is not given."""
    value: str | None = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def scheduling_policy(argv: tuple[str, ...] | list[str]) -> str:
    """vLLM's ``--scheduling-policy`` in a command line (its default ``fcfs``:
    ``SchedulerConfig.policy``, ``vllm/config/scheduler.py``)."""
    return flag_value(argv, "--scheduling-policy") or "fcfs"


def priority_scheduling(plan: FleetPlan) -> bool:
    """Whether every engine the router sends legs to runs vLLM's priority scheduler
    (``--scheduling-policy priority`` or ``=priority`` in its command line): only then
    does the router pass a request's class on as vLLM's ``priority`` field."""
    engines = [i for i in plan.instances if i.role in ("prefill", "decode", "colocated")]
    return bool(engines) and all(scheduling_policy(i.argv) == "priority" for i in engines)
