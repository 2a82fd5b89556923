"""Run the router as an HTTP server (uvicorn with uvloop + httptools)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Collection

from pdctl.sdk.apikey import ApiKeyError
from pdctl.sdk.errors import PdctlError
from pdctl.sdk.lint import lint, require_clean
from pdctl.sdk.lint.waiver import refused_layout, waive
from pdctl.sdk.router.app import DEFAULT_MAX_BODY, RouterApp, load_api_key
from pdctl.sdk.router.core import Router, RouterMode
from pdctl.sdk.spec import FleetSpec


class RouterStartError(PdctlError):
    """The router cannot start (bad key source, port in use, …)."""


def build_app(
    spec: FleetSpec,
    *,
    mode: RouterMode | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    ignore_lint: Collection[str] = (),
) -> RouterApp:
    """The router's ASGI app for ``spec``. ``ignore_lint``: the lint errors the fleet was
    launched past (``pdctl up --ignore-lint``); a waived handshake error is named in the
    error answers of the requests it fails."""
    report = waive(lint(spec, check_bound_ports=False), {c.upper() for c in ignore_lint})
    plan = require_clean(report)
    try:
        router = Router(spec, plan, mode=mode)
    except ValueError as e:
        raise RouterStartError(str(e)) from None
    router.dispatcher.relay.layout_note = refused_layout(report)
    try:
        key = load_api_key(router)
    except ApiKeyError as e:
        raise RouterStartError(str(e)) from None
    return RouterApp(router, max_body=max_body, api_key=key)


def serve(app: RouterApp, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="none",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=30,
    )
    server = uvicorn.Server(config)

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
    import sys
    from pathlib import Path

    ap = argparse.ArgumentParser(prog="python -m pdctl.sdk.router.server")
    ap.add_argument("--spec-json", required=True)
    ap.add_argument("--mode", default=None)
    ap.add_argument("--ignore-lint", action="append", default=[], metavar="CODE")
    args = ap.parse_args(argv)
    spec = FleetSpec.model_validate_json(Path(args.spec_json).read_text())
    try:
        app = build_app(spec, mode=args.mode, ignore_lint=args.ignore_lint)
    except PdctlError as e:
        print(f"pdctl router: {e}", file=sys.stderr)
        return 2
    assert spec.router is not None
    r = app.router
    print(
        f"pdctl router: {r.mode} mode on http://{spec.router.host}:{spec.router.port} → "
        f"{len(r.prefills)} prefill, {len(r.decodes)} decode instance(s)",
        flush=True,
    )
    serve(app, spec.router.host, spec.router.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
