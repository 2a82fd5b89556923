"""Rules PD036-PD038: the local Prometheus of ``[observability]``, the router's traces."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pdctl.sdk.lint.core import Finding, LintContext, _f, rule


@rule("PD036", "local Prometheus asked for but not installed")
def _prometheus_missing(ctx: LintContext) -> Iterator[Finding]:
    from pdctl.sdk.fleetplan.prometheus import INSTALL_HINT, prometheus_binary

    o = ctx.spec.observability
    if ctx.spec.backend.kind == "local" and o.prometheus and prometheus_binary(ctx.spec) is None:
        yield _f(
            "PD036",
            "error",
            "observability.prometheus_bin",
            f"observability.prometheus is on but {o.prometheus_bin!r} is not an executable on PATH",
            "`pdctl up` would fail to start the fleet's Prometheus",
            INSTALL_HINT,
        )


@rule("PD037", "local Prometheus on a cluster backend")
def _prometheus_off_local(ctx: LintContext) -> Iterator[Finding]:
    kind = ctx.spec.backend.kind
    if kind != "local" and ctx.spec.observability.prometheus:
        yield _f(
            "PD037",
            "warning",
            "observability.prometheus",
            f"observability.prometheus only starts a Prometheus on the local backend, not on "
            f"{kind}",
            "no Prometheus scrapes the fleet unless the cluster's own does",
            "point the cluster's Prometheus at the fleet: `pdctl config --prometheus` "
            "(a PodMonitor on Kubernetes) and `pdctl config --prometheus-rules`",
        )


@rule("PD038", "router traces asked for but OpenTelemetry not installed")
def _otel_missing(ctx: LintContext) -> Iterator[Finding]:
    import importlib.util

    r = ctx.spec.router
    if ctx.spec.backend.kind != "local" or r is None or not r.otlp_endpoint:
        return
    missing = [
        m
        for m in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
        if _find(importlib.util.find_spec, m) is None
    ]
    if missing:
        yield _f(
            "PD038",
            "error",
            "router.otlp_endpoint",
            f"router.otlp_endpoint is set but {', '.join(missing)} cannot be imported",
            "the router refuses to start (and vLLM exports no spans)",
            "pip install 'pdctl[otel]', or remove router.otlp_endpoint",
        )


def _find(find_spec: Any, module: str) -> Any:
    try:
        return find_spec(module)
    except ModuleNotFoundError:  # a parent package is missing
        return None
