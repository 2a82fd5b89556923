"""Rules PD036-PD037: the local Prometheus of ``[observability]``."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.sdk.lint.core import Finding, LintContext, _f, rule


@rule("PD036", "local Prometheus asked for but not installed")
def _prometheus_missing(ctx: LintContext) -> Iterator[Finding]:
    from pdctl.sdk.observability.local import INSTALL_HINT, prometheus_binary

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
            "point the cluster's Prometheus at the fleet: `pdctl render --prometheus` "
            "(a PodMonitor on Kubernetes) and `pdctl render --prometheus-rules`",
        )
