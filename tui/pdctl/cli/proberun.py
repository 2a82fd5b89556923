"""Running ``python -m pdctl.connector.probe`` (NIXL in a subprocess, so the CLI never
imports it): for ``pdctl probe``, ``pdctl preflight --probe`` and ``pdctl profile``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
from typing import IO, Any

from pdctl.sdk.errors import PdctlError

INSTALL_HINT = (
    "NIXL is not installed in this Python environment: install pdctl's cpu extra "
    "(pip install 'pdctl[cpu]') or the gpu extra"
)


class ProbeFailed(PdctlError):
    """The probe could not run; the message says why and what to do."""


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


def explain(error: str) -> str:
    if "Address already in use" in error:
        return f"{error}: the --listen port is taken; choose another"
    return error


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
        raise ProbeFailed(f"--probe: {explain(str(result['error']))}")
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
