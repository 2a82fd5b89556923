"""Run the router as an HTTP server (uvicorn with uvloop + httptools)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdctl.sdk.errors import PdctlError
from pdctl.sdk.keys import KeySourceError, control_exposure
from pdctl.sdk.lint import lint, require_clean
from pdctl.sdk.lint.waiver import refused_layout, waive
from pdctl.sdk.router.app import DEFAULT_MAX_BODY, RouterApp
from pdctl.sdk.router.core import Router, RouterMode
from pdctl.sdk.router.guard import Guard
from pdctl.sdk.router.hardening import Limits, open_files_for
from pdctl.sdk.router.running import run as run_on_loop
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
    workers: int = 1,
) -> RouterApp:
    """The router of ``spec`` (bound to ``host``, default ``router.host``). ``ignore_lint``:
    the lint errors the fleet was launched past (``pdctl up --ignore-lint``); a waived
    handshake error is named in the error answers of the requests it fails.
    ``supervisor_socket``: the fleet supervisor's control socket, told at once of an
    instance the router saw fail (:mod:`pdctl.sdk.router.suspects`). ``workers``: how many
    processes share the router (each enforces 1/``workers`` of every rate limit)."""
    report = waive(lint(spec, check_bound_ports=False), {c.upper() for c in ignore_lint})
    plan = require_clean(report)
    try:
        router = Router(spec, plan, mode=mode)
    except ValueError as e:
        raise RouterStartError(str(e)) from None
    router.dispatcher.relay.layout_note = refused_layout(report)
    router.dispatcher.recovery.link = SupervisorLink(supervisor_socket)
    guard = build_guard(spec, router, audit_path, host, share=1.0 / workers)
    return RouterApp(router, max_body=max_body, guard=guard, share=1.0 / workers)


def build_guard(
    spec: FleetSpec,
    router: Router,
    audit_path: str | None = None,
    host: str | None = None,
    share: float = 1.0,
) -> Guard:
    """The keys, limits and audit log of ``spec``'s router; refuses (naming the fix) a
    router that would expose its control endpoints beyond loopback without a key."""
    problem = control_exposure(spec, host)
    if problem is not None:
        raise RouterStartError(problem)
    try:
        rs = spec.router or RouterSpec()
        return Guard.from_spec(rs, router.registry, audit_path=audit_path, share=share)
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
        # the client is the TCP peer (what the audit records), never a header's word;
        # and no middleware per request to find that out
        proxy_headers=False,
        backlog=4096,
        **tls,
    )


GC_CLOCK_S = 1.0
"""While the router serves, its cyclic collector runs on this clock (a young collection each
tick, the middle generation every 10th, the whole heap every 100th) instead of on
CPython's allocation count. A proxy's objects live as long as their request: with
a thousand requests in flight, their objects alone outnumber any young-generation
threshold, so collections triggered by allocations came faster the more requests were
in flight and each traversed the live requests again (at c=1024 about 13% of the router's
CPU, none at c=64: docs/router.md has the figures). On a clock the collector's work per
request shrinks as the rate grows, and the cycles an error path leaves are still freed
within a second."""

GC_MIDDLE_EVERY, GC_FULL_EVERY = 10, 100
"""Ticks of :data:`GC_CLOCK_S` between collections of the middle generation and of the
whole heap (CPython's own ratio between its generations' thresholds)."""

GC_SHARE, GC_LONGEST_S = 0.02, 10.0
"""The collector's share of the router's CPU: a tick waits at least as long as its
collection took, divided by ``GC_SHARE`` (and at most ``GC_LONGEST_S``). A young
collection traverses every request in flight: at c=1024 some 100,000 objects, tens of
milliseconds each second (about 7% of the router's CPU); paced, that is 2% whatever the
number in flight, and the clock stays at :data:`GC_CLOCK_S` while collections are cheap."""


def settle_heap() -> None:
    """Before serving: collect once, move everything built so far (modules, the app, the
    spec) out of the collector's sight (:func:`gc.freeze`), and stop the collector's
    allocation-driven runs: :func:`collect_on_clock` runs it instead."""
    gc.collect()
    gc.freeze()
    gc.disable()


def gc_wait(spent_s: float, period_s: float = GC_CLOCK_S) -> float:
    """Seconds until the next tick after a collection that took ``spent_s`` of CPU."""
    return min(max(period_s, GC_LONGEST_S), max(period_s, spent_s / GC_SHARE))


async def collect_on_clock(period_s: float = GC_CLOCK_S) -> None:
    """Run the cyclic collector every ``period_s``, or longer after a collection that
    took more than its share (:func:`gc_wait`; module constants say which generation);
    until cancelled. Started by :func:`serve` beside the server."""
    tick = 0
    wait = period_s
    while True:
        await asyncio.sleep(wait)
        tick += 1
        gen = 2 if tick % GC_FULL_EVERY == 0 else 1 if tick % GC_MIDDLE_EVERY == 0 else 0
        t = time.thread_time()
        gc.collect(gen)
        wait = gc_wait(time.thread_time() - t, period_s)


def loaded_config(app: RouterApp, host: str, port: int) -> Any:
    """:func:`server_config`, loaded: a bad TLS file is a clear start error here."""
    config = server_config(app, host, port)
    try:
        config.load()  # TLS files are read here
    except (OSError, ValueError) as e:
        raise RouterStartError(f"router.tls: cannot load the certificate or key: {e}") from None
    return config


def serve(app: RouterApp, host: str, port: int, worker: WorkerPlace | None = None) -> None:
    """Serve until SIGINT/SIGTERM; as ``worker``, one of several processes on the port."""
    import uvicorn

    config = loaded_config(app, host, port)
    server = uvicorn.Server(config)
    warning = open_files_for(app.router.settings.http.max_connections)
    if warning is not None:
        print(f"pdctl router: warning: {warning}", file=sys.stderr, flush=True)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        settle_heap()
        collector = asyncio.create_task(collect_on_clock())
        try:
            await _serve(server, worker)
        finally:
            collector.cancel()

    async def _serve(server: Any, worker: WorkerPlace | None) -> None:
        if worker is None:
            await server.serve()
            return
        from pdctl.sdk.router.workerlink import WorkerLink

        link = WorkerLink(app, worker.folder, worker.index)
        await link.start()  # the control changes so far, before serving
        sock = reuseport_socket(host, port)
        watch = asyncio.create_task(_watch_parent(worker.parent_pid, server))
        try:
            await server.serve(sockets=[sock])
        finally:
            watch.cancel()
            await link.stop()
            if os.getppid() != worker.parent_pid:  # the parent died: nobody else clears it
                shutil.rmtree(worker.folder, ignore_errors=True)

    with contextlib.suppress(KeyboardInterrupt):
        run_on_loop(main())


@dataclass(frozen=True)
class WorkerPlace:
    """Where a worker stands: its parent's channel folder, its index, its parent's pid."""

    folder: Path
    index: int
    parent_pid: int


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port) with ``SO_REUSEPORT`` (the workers' share)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
        sock.listen(4096)
    except OSError as e:
        sock.close()
        raise RouterStartError(f"cannot listen on {host}:{port}: {e}") from None
    sock.set_inheritable(False)
    return sock


def port_free(host: str, port: int) -> None:
    """Refuse (naming the port) when something already listens there: with
    ``SO_REUSEPORT`` the workers would otherwise share the port with it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise RouterStartError(
                f"cannot listen on {host}:{port}: {e} (another router or server is there?)"
            ) from None


def _die_with_parent() -> None:
    """Linux: have the kernel send this process SIGTERM when its parent dies."""
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


ORPHAN_GRACE_S = 10.0
"""A worker whose parent died finishes its requests for at most this long, then exits."""


async def _watch_parent(parent_pid: int, server: Any) -> None:
    """Stop serving once the parent is gone (a worker is never left behind): at once for
    new connections, after :data:`ORPHAN_GRACE_S` for the requests still running."""
    while os.getppid() == parent_pid:  # noqa: ASYNC110 (no event tells of a parent's death)
        await asyncio.sleep(1.0)
    server.should_exit = True
    await asyncio.sleep(ORPHAN_GRACE_S)
    server.force_exit = True


DEFAULT_MAX_WORKERS = 16
"""The default ``router.workers`` is the usable CPUs, at most this many (a pod without a CPU
limit sees every core of its node); set ``router.workers`` for more."""


def workers_of(spec: FleetSpec) -> int:
    """``router.workers``, or the CPUs the router may use (at most
    :data:`DEFAULT_MAX_WORKERS`) when it is not set."""
    from pdctl.sdk.router.workers import usable_cpus

    rs = spec.router or RouterSpec()
    return rs.workers if rs.workers is not None else min(usable_cpus(), DEFAULT_MAX_WORKERS)


def add_worker_args(ap: Any) -> None:
    """The arguments a parent gives its workers (hidden: not for people to pass)."""
    import argparse

    ap.add_argument("--worker-of", default=None, metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)


def run(
    build: Callable[[int], RouterApp],
    spec: FleetSpec,
    host: str,
    *,
    module: str,
    argv: Sequence[str],
    args: Any,
    audit_path: str,
) -> int:
    """Run the router ``build(workers)`` makes, on ``host``: one process, or (with
    ``router.workers`` above 1) the parent of that many workers, each started as
    ``python -m module argv --worker-of ... --worker-index I`` (:mod:`.workers`), or, with
    ``args.worker_of``, one such worker. The exit code (2: it cannot start, said why)."""
    rs = spec.router or RouterSpec()
    worker: WorkerPlace | None = None
    if args.worker_of is not None:
        _die_with_parent()
        worker = WorkerPlace(Path(args.worker_of), args.worker_index, os.getppid())
    n = workers_of(spec)
    try:
        app = build(n)
        if worker is None and n > 1:  # the parent: check what the workers need first
            loaded_config(app, host, rs.port)
            port_free(host, rs.port)
    except PdctlError as e:
        print(f"pdctl router: {e}", file=sys.stderr)
        return 2
    if worker is None:
        r = app.router
        scheme = "https" if rs.tls is not None else "http"
        print(
            f"pdctl router: {r.mode} mode on {scheme}://{host}:{rs.port} → "
            f"{len(r.prefills)} prefill, {len(r.decodes)} decode instance(s)"
            + (f", {n} workers" if n > 1 else ""),
            flush=True,
        )
    if worker is None and n > 1:
        from pdctl.sdk.router.audit import AuditLog
        from pdctl.sdk.router.workers import run_workers

        a = rs.audit
        audit = AuditLog(a.path or audit_path, max_bytes=a.max_bytes, backups=a.backups)
        del app  # the parent serves nothing: it built one only to check the spec
        return run_workers([sys.executable, "-m", module, *argv], n, audit)
    try:
        serve(app, host, rs.port, worker)
    except RouterStartError as e:
        print(f"pdctl router: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m pdctl.sdk.router.server --spec-json FILE``: how the launcher runs it."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m pdctl.sdk.router.server")
    ap.add_argument("--spec-json", required=True)
    ap.add_argument("--mode", default=None)
    ap.add_argument("--ignore-lint", action="append", default=[], metavar="CODE")
    ap.add_argument("--supervisor-socket", default=None, metavar="PATH")
    ap.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY, metavar="BYTES")
    add_worker_args(ap)
    given = list(argv if argv is not None else sys.argv[1:])
    args = ap.parse_args(given)
    spec_file = Path(args.spec_json)
    spec = FleetSpec.model_validate_json(spec_file.read_text())
    audit_path = default_audit_path(spec_file)

    def build(n: int) -> RouterApp:
        return build_app(
            spec,
            mode=args.mode,
            max_body=args.max_body,
            audit_path=audit_path,
            ignore_lint=args.ignore_lint,
            supervisor_socket=args.supervisor_socket,
            workers=n,
        )

    host = (spec.router or RouterSpec()).host
    module = "pdctl.sdk.router.server"
    return run(build, spec, host, module=module, argv=given, args=args, audit_path=audit_path)


def default_audit_path(spec_file: object) -> str:
    """router-audit.jsonl beside the router's spec file when that folder is writable (a
    fleet's run directory), else standard error ("-": a read-only ConfigMap mount)."""
    folder = Path(str(spec_file)).resolve().parent
    return str(folder / "router-audit.jsonl") if os.access(folder, os.W_OK) else "-"


if __name__ == "__main__":
    raise SystemExit(main())
