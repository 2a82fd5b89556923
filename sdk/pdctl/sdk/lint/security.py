"""Rules PD045-PD047: who can reach the router's control endpoints, keys written into
the spec itself, and Kubernetes fleets without NetworkPolicies."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.sdk.fleetplan import is_loopback
from pdctl.sdk.keys import control_exposure, key_sources, router_bind_host
from pdctl.sdk.lint.core import Finding, LintContext, _f, rule


@rule("PD045", "router control endpoints open beyond loopback")
def _open_control(ctx: LintContext) -> Iterator[Finding]:
    rs = ctx.spec.router
    if rs is None:
        return
    host = router_bind_host(ctx.spec)
    problem = control_exposure(ctx.spec)
    if problem is not None:
        yield _f(
            "PD045",
            "error",
            "router.keys",
            f"the router binds {host} (beyond loopback) and has no admin key",
            "anyone on the network can drain every instance, switch the dispatch mode, "
            "mark instances down and read every request's timeline; the router refuses "
            "to start",
            'add [[router.keys]] with name = "ops", role = "admin", env = "PDCTL_ADMIN_KEY" '
            "(on Kubernetes from a Secret listed in backend.k8s.router_secret_env), or set "
            "router.insecure_control = true to run open on purpose",
        )
    elif (
        rs.insecure_control
        and not is_loopback(host)
        and not any(s.role == "admin" for s in key_sources(rs))
    ):
        yield _f(
            "PD045",
            "warning",
            "router.insecure_control",
            f"router.insecure_control = true: the control endpoints on {host} take "
            "requests from anyone who can reach them",
            "anyone on the network can drain instances, switch modes and read timelines",
            'add an admin key ([[router.keys]] with role = "admin") and remove insecure_control',
        )


@rule("PD046", "a router key written into the spec")
def _inline_key(ctx: LintContext) -> Iterator[Finding]:
    for src in key_sources(ctx.spec.router):
        if src.value:
            yield _f(
                "PD046",
                "warning",
                f"{src.field}.value",
                f"key {src.name!r} is written in the spec",
                "whoever reads the spec (a repository, a ConfigMap, a bug report) has the key",
                f'move it to an environment variable (env = "PDCTL_KEY_{src.name.upper()}") '
                "or a file/Secret (file = ...), and rotate it",
            )


@rule("PD047", "Kubernetes NetworkPolicies turned off")
def _no_network_policies(ctx: LintContext) -> Iterator[Finding]:
    k8s = ctx.spec.backend.k8s
    if ctx.spec.backend.kind != "k8s" or k8s is None or k8s.network_policies:
        return
    yield _f(
        "PD047",
        "warning",
        "backend.k8s.network_policies",
        "backend.k8s.network_policies = false: every pod of the cluster reaches every port "
        "of the fleet",
        "vLLM's HTTP port answers /invocations, /tokenize and /metrics without a key (its "
        "--api-key guards only /v1, /v2, /inference), and the NIXL side channels and "
        "KV-event ports are plaintext: anything in the cluster can bypass the router",
        "remove network_policies = false (pdctl then emits policies letting only the router, "
        "the fleet's own pods and prometheus_pod_labels in)",
    )
