"""``python -m pdctl.sdk.backends.k8s.router --spec-json FILE``: the router in its pod.

The same router as on one machine, given the cluster's view of the plan: each instance at
its stable DNS name (a headless Service, or a LeaderWorkerSet leader), with the engine
ids, ports, TP and PP the spec renders. So in push mode decode is told the prefill's
identity before prefill answers, from the first request on. The side-channel host it
first names is that DNS name (it resolves to the prefill pod's IP); each prefill then
reports its pod IP in its response, the router adopts it (counted in
``pdctl_router_identity_changes_total``) and re-sends that one decode leg. A prefill pod
that is recreated gets a new IP and is learned the same way. The lint step is skipped:
the router pod has no model files, and the spec was linted before it was applied.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pdctl.sdk.backends.k8s.manifests import cluster_plan
from pdctl.sdk.errors import PdctlError
from pdctl.sdk.router.app import RouterApp
from pdctl.sdk.router.core import ROUTER_MODES, Router
from pdctl.sdk.router.server import add_worker_args, build_guard, default_audit_path, run
from pdctl.sdk.spec import FleetSpec

BIND = "0.0.0.0"


def build(
    spec: FleetSpec, mode: str | None = None, audit_path: str | None = None, workers: int = 1
) -> RouterApp:
    """The router app over the cluster plan (one of ``workers`` processes); ValueError /
    PdctlError when it cannot run (no admin key on its wildcard bind without
    ``router.insecure_control``, say)."""
    chosen = next((m for m in ROUTER_MODES if m == mode), None)
    if mode is not None and chosen is None:
        raise ValueError(f"unknown mode {mode!r}; use one of {', '.join(ROUTER_MODES)}")
    router = Router(spec, cluster_plan(spec), mode=chosen)
    return RouterApp(router, guard=build_guard(spec, router, audit_path, share=1.0 / workers))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdctl.sdk.backends.k8s.router")
    ap.add_argument("--spec-json", required=True)
    ap.add_argument("--mode", default=None)
    add_worker_args(ap)
    given = list(argv if argv is not None else sys.argv[1:])
    args = ap.parse_args(given)
    spec = FleetSpec.model_validate_json(Path(args.spec_json).read_text())
    audit_path = default_audit_path(args.spec_json)

    def make(n: int) -> RouterApp:
        try:
            return build(spec, args.mode, audit_path, workers=n)
        except ValueError as e:
            raise PdctlError(str(e)) from None

    module = "pdctl.sdk.backends.k8s.router"
    return run(make, spec, BIND, module=module, argv=given, args=args, audit_path=audit_path)


if __name__ == "__main__":
    raise SystemExit(main())
