"""``python -m pdctl.connector.probe``: push KV-shaped bytes through NIXL and measure.

Default: both ends on this host as two processes (this one is the initiator; the target
is a child that exits with the control connection). Across hosts: ``--listen
[HOST:]PORT`` on the receiving host, ``--connect HOST:PORT`` with the workload options on
the sending host. The result is one JSON object on stdout; ``--progress`` adds JSON
lines on stderr. Exit codes: 0 ok, 1 the run finished with errors or bad checksums,
2 bad options or a setup failure (message on stderr), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pdctl.connector.probe.control import Control, ProbeError, parse_hostport
from pdctl.connector.probe.engine import SYNC_PARAM
from pdctl.connector.probe.options import add_arguments
from pdctl.connector.probe.plan import GeometryError, geometry_for
from pdctl.connector.probe.records import ProbeConfig
from pdctl.connector.probe.report import ucx_environment
from pdctl.connector.probe.session import run_initiator, serve_target
from pdctl.connector.probe.ucxlog import transports_in


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pdctl.connector.probe", description=__doc__)
    add_arguments(p)
    p.add_argument("--progress", action="store_true", help="JSON progress lines on stderr")
    return p


def _bytes_per_token(args: argparse.Namespace) -> tuple[int, int, list[str]]:
    """(per-rank bytes per token, regions, notes)."""
    if args.model:
        from pdctl.sdk.modelinfo import ModelInfoError, read_model_info, text_config
        from pdctl.sdk.preflight.kvsize import ModelConfigError, kv_layout, resolve_dtype

        try:
            info = read_model_info(args.model)
        except ModelInfoError as e:
            raise ProbeError(str(e)) from None
        if info is None:
            raise ProbeError(f"--model {args.model}: no config.json there; pass a local path")
        cfg = text_config(info.raw)
        try:
            dtype, _ = resolve_dtype(args.kv_dtype, "auto", cfg)
            layout = kv_layout(cfg, dtype)
        except ModelConfigError as e:
            raise ProbeError(str(e)) from None
        notes = list(layout.notes)
        if layout.sliding_layers:
            notes.append("sliding-window layers are moved at full length")
        regions = args.regions or layout.num_layers * (2 if layout.kind == "standard" else 1)
        return layout.per_rank(1, args.tp), regions, notes
    if not args.bytes_per_token:
        raise ProbeError("give --model PATH or --bytes-per-token N")
    if args.bytes_per_token % args.tp:
        raise ProbeError(f"--bytes-per-token {args.bytes_per_token} does not split over --tp")
    return args.bytes_per_token // args.tp, args.regions or 1, []


def config_from(args: argparse.Namespace) -> tuple[ProbeConfig, list[str]]:
    for name in ("tp", "count", "inflight"):
        if getattr(args, name) < 1:
            raise ProbeError(f"--{name} must be at least 1")
    if args.warmup < 0 or (args.rate is not None and args.rate <= 0):
        raise ProbeError("--warmup must be >= 0 and --rate > 0")
    bpt, regions, notes = _bytes_per_token(args)
    try:
        geo = geometry_for(
            bytes_per_token=bpt,
            prompt_len=args.prompt_len,
            block_size=args.block_size,
            regions=regions,
            pool_requests=args.inflight + 1,
        )
    except GeometryError as e:
        raise ProbeError(str(e)) from None
    need = geo.pool_bytes * args.tp
    if need > args.max_memory_gib * (1 << 30):
        raise ProbeError(
            f"each end needs {need / (1 << 30):.1f} GiB of pool for {args.prompt_len}-token "
            f"requests x {args.inflight + 1} slots x {args.tp} rank(s); lower --prompt-len or "
            "--inflight, or raise --max-memory-gib"
        )
    device = args.device
    if device == "auto":
        device = "cuda" if _cuda_available() else "cpu"
    ucx = agent_params(args)
    cfg = ProbeConfig(
        geometry=geo,
        tp=args.tp,
        count=args.count,
        warmup=args.warmup,
        rate=args.rate,
        inflight=args.inflight,
        merge=not args.no_merge,
        order=args.order,
        verify=args.verify,
        device=device,
        timeout_s=args.timeout,
        poll_us=args.poll_us,
        ucx_params=ucx,
    )
    return cfg, notes


def agent_params(args: argparse.Namespace) -> dict[str, str]:
    """The UCX backend's parameters, plus the agent's sync mode (taken out by
    :func:`~pdctl.connector.probe.engine.make_agent`)."""
    out = {"ucx_error_handling_mode": args.ucx_error_mode} if args.ucx_error_mode else {}
    if args.sync_mode != "none":
        out[SYNC_PARAM] = args.sync_mode
    return out


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def _ucx_env(args: argparse.Namespace) -> dict[str, str]:
    env: dict[str, str] = {}
    if args.ucx_tls:
        env["UCX_TLS"] = args.ucx_tls
    if args.ucx_net_devices:
        env["UCX_NET_DEVICES"] = args.ucx_net_devices
    return env


def _emit(obj: dict[str, Any], stream: Any = None) -> None:
    print(json.dumps(obj), file=stream or sys.stdout, flush=True)


# ---------------------------------------------------------------------------- modes


def _listen(args: argparse.Namespace) -> dict[str, Any]:
    host, port = parse_hostport(args.listen, default_host="0.0.0.0")
    ucx = agent_params(args)
    return serve_target(
        host,
        port,
        ucx_params=ucx,
        accept_timeout_s=max(args.timeout, 5.0) * 4,
        on_listening=lambda p: _emit({"event": "listening", "port": p}),
    )


def _initiate(args: argparse.Namespace, host: str, port: int, logdir: Path) -> dict[str, Any]:
    import socket

    cfg, notes = config_from(args)
    try:
        sock = socket.create_connection((host, port), timeout=args.timeout)
    except OSError as e:
        raise ProbeError(
            f"cannot reach the target at {host}:{port} ({e}); start it with --listen"
        ) from None
    ctl = Control(sock, f"target {host}:{port}")
    progress = (lambda e: _emit(e, sys.stderr)) if args.progress else None
    try:
        result = run_initiator(ctl, cfg, progress=progress)
    finally:
        ctl.close()
    found = transports_in(logdir)
    result["ucx"]["transports"] = found or "unknown"
    result["notes"] = notes + result["notes"]
    return result


def _spawn_target(args: argparse.Namespace, errlog: Any) -> tuple[subprocess.Popen[bytes], int]:
    argv = [sys.executable, "-m", "pdctl.connector.probe", "--listen", "127.0.0.1:0"]
    argv += ["--timeout", str(args.timeout)]
    if args.ucx_error_mode:
        argv += ["--ucx-error-mode", args.ucx_error_mode]
    argv += ["--sync-mode", args.sync_mode]
    env = {**os.environ, **_ucx_env(args)}
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=errlog, env=env, preexec_fn=_die_with_parent
    )
    assert child.stdout is not None
    import select

    ready, _, _ = select.select([child.stdout], [], [], max(args.timeout, 30.0))
    line = child.stdout.readline() if ready else b""
    try:
        port = int(json.loads(line)["port"])
    except (ValueError, KeyError, TypeError):
        _stop(child)
        errlog.seek(0)
        tail = errlog.read().decode(errors="replace").strip().splitlines()[-5:]
        raise ProbeError("the target process did not start: " + " | ".join(tail)) from None
    return child, port


def _die_with_parent() -> None:
    """In the child: receive SIGTERM when the parent dies (Linux), so none is orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass


def _stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=5)


def _local(args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    config_from(args)  # fail on bad options before starting anything
    with tempfile.TemporaryFile() as errlog:
        child, port = _spawn_target(args, errlog)
        try:
            result = _initiate(args, "127.0.0.1", port, logdir)
            child.wait(timeout=10)
        finally:
            _stop(child)
        return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.update(_ucx_env(args))
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    user_ucx = ucx_environment()
    with tempfile.TemporaryDirectory(prefix="pdctl-probe-") as tmp:
        logdir = Path(tmp)
        if not args.listen and "UCX_LOG_FILE" not in os.environ:
            # UCX reads these when NIXL loads it: the WRITE lanes land in a file we parse
            os.environ.setdefault("UCX_PROTO_INFO", "y")
            os.environ["UCX_LOG_FILE"] = str(logdir / "ucx.%p.log")
        started = time.perf_counter()
        try:
            if args.listen:
                result = _listen(args)
            elif args.connect:
                host, port = parse_hostport(args.connect)
                result = _initiate(args, host, port, logdir)
            else:
                result = _local(args, logdir)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except Exception as e:
            kind = "" if isinstance(e, ProbeError) else f"{type(e).__name__}: "
            _emit({"ok": False, "error": f"{kind}{e}"})
            print(f"probe: {kind}{e}", file=sys.stderr)
            return 2
        result["wall_s"] = round(time.perf_counter() - started, 3)
        if "ucx" in result:
            result["ucx"]["env"] = user_ucx
        _emit(result)
    return 0 if result.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
