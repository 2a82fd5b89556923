"""Rules on what the spec sets around the engines: flags pdctl manages (PD016), the local
model path (PD019), UCX_TLS (PD020), the router's API key (PD021), push behind a
sequential router (PD022), CPU tuning with the stock connector (PD023).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from pdctl.sdk.keys import key_sources
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
    for src in key_sources(ctx.spec.router):
        if src.env and not ctx.environ.get(src.env):
            yield _f(
                "PD021",
                "warning",
                f"{src.field}.env",
                f"environment variable {src.env} (key {src.name!r}) is not set here",
                "the router cannot read the key and will not start",
                f"export {src.env}=... before starting the router",
            )
        if src.file and not Path(os.path.expanduser(src.file)).is_file():
            yield _f(
                "PD021",
                "warning",
                f"{src.field}.file",
                f"{src.file} (key {src.name!r}) does not exist",
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
