"""``pdctl router``: the push-aware disaggregation router as an HTTP server."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pdctl.cli.args import Grammar
from pdctl.cli.common import load

MODES = ("push", "push-sequential", "pull", "colocated")
GRAMMAR = Grammar(outputs=("table",))
"""A server: its only output is the log line it starts with."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mode",
        choices=MODES,
        default=None,
        help="dispatch mode (default: from fleet.mode and router.concurrent)",
    )
    p.add_argument("--host", default=None, help="bind address (default: router.host)")
    p.add_argument("--port", type=int, default=None, help="port (default: router.port)")
    p.add_argument(
        "--max-body",
        type=int,
        default=8 * 1024 * 1024,
        help="largest accepted request body in bytes (413 above; default 8 MiB)",
    )
    p.add_argument("--spec-json", default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.router.server import build_app, serve, workers_of
    from pdctl.sdk.spec import FleetSpec

    if args.spec_json:
        spec = FleetSpec.model_validate_json(Path(args.spec_json).read_text())
    else:
        spec = load(args).spec
    if workers_of(spec) > 1:
        return _run_workers(spec, args)
    host = args.host or (spec.router.host if spec.router else "127.0.0.1")
    app = build_app(spec, mode=args.mode, max_body=args.max_body, host=host)
    r = app.router
    port = args.port or (spec.router.port if spec.router else 8000)
    print(
        f"pdctl router: {r.mode} mode on http://{host}:{port} → "
        f"{len(r.prefills)} prefill, {len(r.decodes)} decode instance(s)"
        + (" (API keys required)" if app.guard.keys.has_keys else ""),
        file=sys.stderr,
        flush=True,
    )
    serve(app, host, port)
    return 0


def _run_workers(spec: Any, args: argparse.Namespace) -> int:
    """``router.workers`` above 1: the router server's parent, with ``--host``/``--port``
    written into the spec its workers read (a private folder, removed at exit)."""
    import tempfile

    from pdctl.sdk.router import server
    from pdctl.sdk.spec import RouterSpec

    rs = spec.router or RouterSpec()
    given = {"host": args.host, "port": args.port}
    rs = rs.model_copy(update={k: v for k, v in given.items() if v is not None})
    with tempfile.TemporaryDirectory(prefix="pdctl-router-spec-") as folder:
        f = Path(folder) / "spec.json"
        f.write_text(spec.model_copy(update={"router": rs}).model_dump_json())
        argv = ["--spec-json", str(f), "--max-body", str(args.max_body)]
        return server.main([*argv, *(["--mode", args.mode] if args.mode else [])])
