"""Kubernetes as a source of instances: pods found by label selectors and followed with
list + watch over the API server's HTTPS API (httpx; no Kubernetes client library).

:func:`discovery` builds a :class:`PodDiscovery` from a preset (``llm-d``, ``kserve``,
``dynamo``, ``pdctl``) and/or a selector per role; :class:`~pdctl.sdk.metrics.monitor.FleetMonitor`
scrapes what it finds (``FleetMonitor.from_kubernetes``).
"""

from __future__ import annotations

import httpx

from pdctl.sdk.kube.api import KubeAPI, KubeAuthError, KubeForbidden, KubeGone, KubeUnreachable
from pdctl.sdk.kube.config import KubeConfig, KubeConfigError, KubeError, load_config
from pdctl.sdk.kube.discovery import Endpoint, PodDiscovery, Rule
from pdctl.sdk.kube.pods import PortHint
from pdctl.sdk.kube.presets import PRESETS, Preset, rules_for
from pdctl.sdk.kube.selector import Selector, SelectorError

__all__ = [
    "PRESETS",
    "Endpoint",
    "KubeAPI",
    "KubeAuthError",
    "KubeConfig",
    "KubeConfigError",
    "KubeError",
    "KubeForbidden",
    "KubeGone",
    "KubeUnreachable",
    "PodDiscovery",
    "PortHint",
    "Preset",
    "Rule",
    "Selector",
    "SelectorError",
    "discovery",
    "load_config",
]


def discovery(
    namespace: str | None = None,
    prefill_selector: str | None = None,
    decode_selector: str | None = None,
    router_selector: str | None = None,
    preset: str | None = None,
    *,
    port: str | int | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    config: KubeConfig | None = None,
    timeout_s: float = 10.0,
    transport: httpx.AsyncBaseTransport | None = None,
    watch_timeout_s: int = 300,
    backoff_s: float = 0.5,
    max_backoff_s: float = 30.0,
) -> PodDiscovery:
    """Everything is checked here (selectors, preset, credentials) before any request;
    ``namespace`` defaults to the kubeconfig context's (or the pod's own)."""
    triples, hint = rules_for(
        preset, prefill=prefill_selector, decode=decode_selector, router=router_selector
    )
    rules = [Rule(role, Selector.parse(text, what)) for role, text, what in triples]
    if port is not None:
        hint = PortHint(hint.container, port)
    cfg = config or load_config(kubeconfig, context)
    api = KubeAPI(cfg, timeout_s=timeout_s, transport=transport)
    return PodDiscovery(
        api,
        namespace or cfg.namespace,
        rules,
        hint,
        watch_timeout_s=watch_timeout_s,
        backoff_s=backoff_s,
        max_backoff_s=max_backoff_s,
    )
