"""``pdctl probe``: push KV-shaped bytes through NIXL between two local processes (or
across hosts) and report GB/s, transfer time, descriptor counts, the UCX transport and
checksums.

The transfer engine runs as ``python -m pdctl.connector.probe`` in a subprocess with this
interpreter, so the CLI never imports NIXL. Exit codes: 0 ok, 1 the run had failed
requests or bad checksums, 2 bad options or setup failure, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import threading
from typing import IO, Any

from pdctl.cli.common import console, print_json
from pdctl.sdk.errors import PdctlError

INSTALL_HINT = (
    "NIXL is not installed in this Python environment: install pdctl's cpu extra "
    "(pip install 'pdctl[cpu]') or the gpu extra"
)


class ProbeFailed(PdctlError):
    """The probe could not run; the message says why and what to do."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from pdctl.connector.probe.options import add_arguments as add_probe_arguments

    add_probe_arguments(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def probe_argv(args: argparse.Namespace) -> list[str]:
    from pdctl.connector.probe.options import to_argv

    return [sys.executable, "-m", "pdctl.connector.probe", *to_argv(args), "--progress"]


def run_probe(argv: list[str], on_event: Any = None, timeout_s: float = 3600.0) -> dict[str, Any]:
    """Run the probe subprocess; return its JSON result (``ok`` false with ``error`` when it
    failed). Progress events go to ``on_event``; the child is always reaped."""
    if importlib.util.find_spec("nixl") is None:
        raise ProbeFailed(INSTALL_HINT)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stderr is not None
    errors: list[str] = []
    reader = threading.Thread(target=_read_stderr, args=(proc.stderr, on_event, errors))
    reader.start()
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except BaseException:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    finally:
        reader.join(timeout=5)
    try:
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = " | ".join(errors[-5:]) or f"exit {proc.returncode}"
        raise ProbeFailed(f"the probe produced no result ({tail})") from None
    result["exit_code"] = proc.returncode
    return result


def _read_stderr(stream: IO[str], on_event: Any, errors: list[str]) -> None:
    for line in stream:
        line = line.strip()
        if line.startswith("{") and on_event is not None:
            try:
                on_event(json.loads(line))
                continue
            except ValueError:
                pass
        if line:
            errors.append(line)


def run(args: argparse.Namespace) -> int:
    argv = probe_argv(args)
    if args.json:
        result = run_probe(argv)
        print_json(result)
        return int(result["exit_code"])
    out = console()
    from rich.progress import Progress

    with Progress(console=console(stderr=True), transient=True) as bar:
        task = bar.add_task("warming up", total=args.count)

        def on_event(ev: dict[str, Any]) -> None:
            if ev.get("event") == "request":
                bar.update(task, completed=ev["done"], description="transferring")
            elif ev.get("event") == "listening":
                bar.update(task, description=f"listening on port {ev['port']}")

        result = run_probe(argv, on_event)
    if result.get("error"):
        raise ProbeFailed(_explain(str(result["error"])))
    render(result, out)
    return int(result["exit_code"])


def _explain(error: str) -> str:
    if "Address already in use" in error:
        return f"{error}: the --listen port is taken; choose another"
    return error


def render(r: dict[str, Any], out: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    geo, cfg = r["config"]["geometry"], r["config"]
    mib = r["bytes_per_request"] / (1 << 20)
    out.print(
        f"[bold]probe[/]: {r['requests']['completed']}/{r['requests']['measured']} requests of "
        f"{mib:,.1f} MiB ({cfg['tp']} rank(s) x {geo['regions']} region(s) x "
        f"{geo['blocks_per_request']} blocks of {geo['block_len']:,} B), "
        f"{'merged' if cfg['merge'] else 'one descriptor per block'}, {cfg['device']}"
    )
    t = Table(show_header=True, header_style="bold")
    for col in ("GB/s", "GB/s per request", "transfer p50", "p99", "receive p50", "descs"):
        t.add_column(col, justify="right")
    d = r["descriptors"]
    t.add_row(
        _f(r["gbps"]),
        _f(r["gbps_per_request_p50"]),
        _ms(r["transfer_ms"]["p50"]),
        _ms(r["transfer_ms"]["p99"]),
        _ms(r["receive_ms"]["p50"]),
        f"{d['posted']} (merged {d['merged']}, per block {d['unmerged']})",
    )
    out.print(t)
    tr = r["ucx"]["transports"]
    out.print(f"UCX transport: {escape(', '.join(tr) if isinstance(tr, list) else str(tr))}")
    integ = r["integrity"]
    style = "green" if not integ["mismatched"] else "bold red"
    out.print(f"[{style}]checksums: {integ['matched']}/{integ['checked']} requests match[/]")
    for e in r["errors"][:10]:
        out.print(f"[bold red]error[/] {escape(e)}")
    for n in r["notes"][:10]:
        out.print(f"[dim]note: {escape(n)}[/]")


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} ms"


# ------------------------------------------------------------------- preflight --probe

DEGRADED_FRACTION = 0.3


def probe_for_preflight(
    model: str | None, prompt_len: int, tp: int, kv_dtype: str | None
) -> dict[str, Any]:
    """One short probe run at the intended prompt's KV size between two local processes
    (GPU memory when CUDA is available); raises :class:`ProbeFailed` when it cannot run."""
    if not model:
        raise ProbeFailed("--probe needs the model's config.json for the KV size: pass --model")
    argv = [sys.executable, "-m", "pdctl.connector.probe", "--model", model]
    argv += ["--prompt-len", str(prompt_len), "--tp", str(tp), "--device", "auto"]
    argv += ["--count", "5", "--warmup", "2", "--progress"]
    if kv_dtype:
        argv += ["--kv-dtype", kv_dtype]
    result = run_probe(argv, timeout_s=900.0)
    if result.get("error"):
        raise ProbeFailed(f"--probe: {_explain(str(result['error']))}")
    return result


def measured_vs_expected(result: dict[str, Any], expected_bps: float | None) -> tuple[str, bool]:
    """A one-line comparison, and whether the software path looks degraded
    (measured < 0.3 x expected)."""
    gbps = result.get("gbps_per_request_p50")
    lanes = result["ucx"]["transports"]
    lanes = ", ".join(lanes) if isinstance(lanes, list) else str(lanes)
    if gbps is None:
        return f"probe: no completed transfer ({'; '.join(result['errors'][:2])})", True
    line = (
        f"probe: measured {gbps:.2f} GB/s per rank (transfer p50 "
        f"{result['transfer_ms']['p50']:.1f} ms, UCX {lanes}, local processes)"
    )
    if expected_bps is None:
        return line + "; no expected figure to compare (no planned GPU pair)", False
    ratio = gbps * 1e9 / expected_bps
    degraded = ratio < DEGRADED_FRACTION
    line += f" vs {expected_bps / 1e9:.2f} GB/s expected ({ratio:.0%})"
    return line + ("; software path degraded" if degraded else ""), degraded
