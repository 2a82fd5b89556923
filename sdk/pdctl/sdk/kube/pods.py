"""A pod, as the API server describes it, turned into an instance to scrape (sans-IO).

A pod is an instance when it is Ready (its ``Ready`` condition ``True``), has a pod IP
and is not being deleted; the headless workers of a multi-node LeaderWorkerSet group
(``leaderworkerset.sigs.k8s.io/worker-index`` other than ``0``) are not: only the leader
serves HTTP. Its port, in order: a container port named by the preset or ``--k8s-port``
(or that number); the ``--port`` in the serving container's command line; that
container's first port; vLLM's default 8000. The scheme is ``https`` when the probe on that
port says so (KServe's TLS mode), else ``http``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pdctl.sdk.k8slabels import LWS_WORKER_INDEX

Obj = dict[str, Any]
VLLM_DEFAULT_PORT = 8000
_PORT_ARG = re.compile(r"--port(?:=|\s+)['\"]?(\d{1,5})\b")


@dataclass(frozen=True)
class PortHint:
    """Where a preset's engines serve: the container's name and a port's name or number
    (either may be unknown)."""

    container: str | None = None
    port: str | int | None = None


def labels(pod: Obj) -> dict[str, str]:
    lab = (pod.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in lab.items()} if isinstance(lab, dict) else {}


def name(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("name") or "?")


def uid(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name") or "?")


def not_ready(pod: Obj) -> str | None:
    """Why the pod is not an instance (None: it is one)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "terminating"
    idx = labels(pod).get(LWS_WORKER_INDEX)
    if idx not in (None, "0"):
        return "a multi-node group's worker (the leader serves)"
    if not status.get("podIP"):
        return f"no pod IP yet (phase {status.get('phase', '?')})"
    for c in status.get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            if c.get("status") == "True":
                return None
            return f"not Ready ({c.get('reason') or 'readiness probe failing'})"
    return f"not Ready (phase {status.get('phase', '?')})"


def _container(pod: Obj, wanted: str | None) -> Obj | None:
    cs = [c for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, dict)]
    for c in cs:
        if wanted is not None and c.get("name") == wanted:
            return c
    return cs[0] if cs else None


def _ports(c: Obj | None) -> list[Obj]:
    return [p for p in (c or {}).get("ports") or [] if isinstance(p, dict)]


def port_of(pod: Obj, hint: PortHint) -> tuple[int, Obj | None]:
    """(the port, the container serving it)."""
    main = _container(pod, hint.container)
    if isinstance(hint.port, int):
        return hint.port, main
    if isinstance(hint.port, str):
        if hint.port.isdigit():
            return int(hint.port), main
        cs = [main, *((pod.get("spec") or {}).get("containers") or [])]
        for c in cs:
            for p in _ports(c):
                if p.get("name") == hint.port and isinstance(p.get("containerPort"), int):
                    return p["containerPort"], c
    if main is not None:
        argv = " ".join(str(a) for a in [*(main.get("command") or []), *(main.get("args") or [])])
        if m := _PORT_ARG.search(argv):
            return int(m[1]), main
        for p in _ports(main):
            if isinstance(p.get("containerPort"), int):
                return p["containerPort"], main
    return VLLM_DEFAULT_PORT, main


def _scheme(c: Obj | None, port: int) -> str:
    names = {p.get("name") for p in _ports(c) if p.get("containerPort") == port} - {None}
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        get = ((c or {}).get(probe) or {}).get("httpGet") or {}
        if get.get("port") == port or get.get("port") in names:
            return "https" if str(get.get("scheme", "HTTP")).upper() == "HTTPS" else "http"
    return "http"


def url_of(pod: Obj, hint: PortHint) -> str:
    ip = str((pod.get("status") or {}).get("podIP"))
    port, c = port_of(pod, hint)
    host = f"[{ip}]" if ":" in ip else ip
    return f"{_scheme(c, port)}://{host}:{port}"
