"""Run the router as an HTTP server (uvicorn with uvloop + httptools)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
from collections.abc import Collection
from typing import Any

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.keys import KeySourceError, control_exposure
from pdctl.sdk.lint import lint, require_clean
from pdctl.sdk.lint.waiver import refused_layout, waive
from pdctl.sdk.router.app import DEFAULT_MAX_BODY, RouterApp
from pdctl.sdk.router.core import Router, RouterMode
from pdctl.sdk.router.guard import Guard
from pdctl.sdk.router.hardening import Limits, open_files_for
from pdctl.sdk.router.suspects import SupervisorLink
from pdctl.sdk.spec import FleetSpec, RouterSpec


class RouterStartError(PdctlError):
    """The router cannot start (bad key source, port in use, …)."""


def build_app(
    spec: FleetSpec,
    *,
    mode: RouterMode | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    ignore_lint: Collection[str] = (),
    audit_path: str | None = None,
    host: str | None = None,
    supervisor_socket: str | None = None,
) -> RouterApp:
    """The router of ``spec`` (bound to ``host``, default ``router.host``). ``ignore_lint``:
    the lint errors the fleet was launched past (``pdctl up --ignore-lint``); a waived
    handshake error is named in the error answers of the requests it fails.
    ``supervisor_socket``: the fleet supervisor's control socket, told at once of an
    instance the router saw fail (:mod:`pdctl.sdk.router.suspects`)."""
    report = waive(lint(spec, check_bound_ports=False), {c.upper() for c in ignore_lint})
    plan = require_clean(report)
    try:
        router = Router(spec, plan, mode=mode)
    except ValueError as e:
        raise RouterStartError(str(e)) from None
    router.dispatcher.relay.layout_note = refused_layout(report)
    router.dispatcher.recovery.link = SupervisorLink(supervisor_socket)
    guard = build_guard(spec, router, audit_path, host)
    return RouterApp(router, max_body=max_body, guard=guard)


def build_guard(
    spec: FleetSpec, router: Router, audit_path: str | None = None, host: str | None = None
) -> Guard:
    """The keys, limits and audit log of ``spec``'s router; refuses (naming the fix) a
    router that would expose its control endpoints beyond loopback without a key."""
    problem = control_exposure(spec, host)
    if problem is not None:
        raise RouterStartError(problem)
    try:
        return Guard.from_spec(spec.router or RouterSpec(), router.registry, audit_path=audit_path)
    except KeySourceError as e:
        raise RouterStartError(str(e)) from None


def server_config(app: RouterApp, host: str, port: int) -> Any:
    """uvicorn's configuration for ``app``: the hardened HTTP protocol with the spec's
    ``router.http`` limits and, with ``router.tls``, HTTPS (and mTLS)."""
    import ssl

    import uvicorn

    from pdctl.sdk.router.httpproto import hardened_protocol

    rs = app.router.settings
    h = rs.http
    limits = Limits(
        max_header_bytes=h.max_header_bytes,
        max_headers=h.max_headers,
        header_timeout_s=h.header_timeout_s,
        body_timeout_s=h.body_timeout_s,
        idle_timeout_s=h.idle_timeout_s,
        max_connections=h.max_connections,
        max_json_depth=h.max_json_depth,
    )
    tls: dict[str, Any] = {}
    if rs.tls is not None:
        tls = {"ssl_certfile": rs.tls.cert_file, "ssl_keyfile": rs.tls.key_file}
        if rs.tls.client_ca_file:
            tls["ssl_ca_certs"] = rs.tls.client_ca_file
            tls["ssl_cert_reqs"] = (
                ssl.CERT_REQUIRED if rs.tls.client_cert == "all" else ssl.CERT_OPTIONAL
            )
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="none",
        http=hardened_protocol(limits),
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=limits.idle_timeout_s,
        backlog=4096,
        **tls,
    )


GC_THRESHOLD = (20_000, 50, 100)
"""The cyclic collector's thresholds while the router serves (CPython's default is 700,
10, 10). A request's objects live as long as the request, so with many in flight most of
them survive each young collection, are promoted and traversed again: collector time per
request grew with concurrency (docs/router.md has the figures) although a routed request
leaves no reference cycles behind. Cycles (an error path's) are still collected, just
less often."""


def settle_heap() -> None:
    """Before serving: collect once, move everything built so far (modules, the app, the
    spec) out of the collector's sight (:func:`gc.freeze`), and raise its thresholds to
    :data:`GC_THRESHOLD`, so that what it traverses is only the requests in flight."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def serve(app: RouterApp, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM."""
    import uvicorn

    config = server_config(app, host, port)
    try:
        config.load()  # TLS files are read here: a bad one is a clear start error
    except (OSError, ValueError) as e:
        raise RouterStartError(f"router.tls: cannot load the certificate or key: {e}") from None
    server = uvicorn.Server(config)
    warning = open_files_for(app.router.settings.http.max_connections)
    if warning is not None:
        print(f"pdctl router: warning: {warning}", file=sys.stderr, flush=True)
    settle_heap()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        await server.serve()

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(main())
        return
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(main())


def main(argv: list[str] | None = None) -> int:
    """``python -m pdctl.sdk.router.server --spec-json FILE``: how the launcher runs it."""
    import argparse
    from pathlib import Path

    ap = argparse.ArgumentParser(prog="python -m pdctl.sdk.router.server")
    ap.add_argument("--spec-json", required=True)
    ap.add_argument("--mode", default=None)
    ap.add_argument("--ignore-lint", action="append", default=[], metavar="CODE")
    ap.add_argument("--supervisor-socket", default=None, metavar="PATH")
    args = ap.parse_args(argv)
    spec_file = Path(args.spec_json)
    spec = FleetSpec.model_validate_json(spec_file.read_text())
    try:
        app = build_app(
            spec,
            mode=args.mode,
            audit_path=default_audit_path(spec_file),
            ignore_lint=args.ignore_lint,
            supervisor_socket=args.supervisor_socket,
        )
    except PdctlError as e:
        print(f"pdctl router: {e}", file=sys.stderr)
        return 2
    assert spec.router is not None
    r = app.router
    scheme = "https" if spec.router.tls is not None else "http"
    print(
        f"pdctl router: {r.mode} mode on {scheme}://{spec.router.host}:{spec.router.port} → "
        f"{len(r.prefills)} prefill, {len(r.decodes)} decode instance(s)",
        flush=True,
    )
    try:
        serve(app, spec.router.host, spec.router.port)
    except RouterStartError as e:
        print(f"pdctl router: {e}", file=sys.stderr)
        return 2
    return 0


def default_audit_path(spec_file: object) -> str:
    """router-audit.jsonl beside the router's spec file when that folder is writable (a
    fleet's run directory), else standard error ("-": a read-only ConfigMap mount)."""
    import os
    from pathlib import Path

    folder = Path(str(spec_file)).resolve().parent
    return str(folder / "router-audit.jsonl") if os.access(folder, os.W_OK) else "-"


if __name__ == "__main__":
    raise SystemExit(main())
