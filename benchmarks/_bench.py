"""Helpers shared by the benchmark scripts (run them from anywhere: python benchmarks/X.py)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from pdctl.sdk.freeports import free_port as free_port


def find_vllm_router(given: str | None) -> str | None:
    """The vllm-router binary: the one given, else on PATH; None (with a note) if absent."""
    found = given or shutil.which("vllm-router")
    if not found:
        print(
            "note: vllm-router not found (pip install vllm-router, or --vllm-router PATH);"
            " it is left out of this run",
            flush=True,
        )
    return found


def vllm_router_argv(binary: str, prefill: str, decode: str, port: int) -> list[str]:
    """vllm-router in PD mode in front of one prefill and one decode (it learns the
    prefill's identity from its first request, then dispatches push requests concurrently)."""
    return [
        binary,
        "--vllm-pd-disaggregation",
        "--prefill",
        prefill,
        "--decode",
        decode,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--prometheus-port",
        str(free_port()),
    ]


def pdctl_router_argv(
    prefill: str, decode: str, port: int, tmp: Path, router: dict[str, Any] | None = None
) -> list[str]:
    """pdctl's router in push mode in front of one prefill and one decode URL (``router``:
    more ``[router]`` settings)."""
    from pdctl.sdk.spec import FleetSpec

    spec = FleetSpec(
        model={"path": "org/m", "served_name": "tiny"},
        fleet={"mode": "push", "platform": "gpu"},
        prefill=[{"http_port": int(prefill.rsplit(":", 1)[1]), "devices": [0]}],
        decode=[{"http_port": int(decode.rsplit(":", 1)[1]), "devices": [1]}],
        router={"port": port, **(router or {})},
    )
    f = tmp / f"spec-{port}.json"
    f.write_text(spec.model_dump_json())
    return [sys.executable, "-m", "pdctl.sdk.router.server", "--spec-json", str(f)]


def greedy_body(prompt: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    """A completions body for the demo's model: greedy, ``ignore_eos`` (exact lengths)."""
    return {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


def write_record(path: str | Path, record: Any) -> None:
    """The run's JSON record to ``path``, and a line saying where it went."""
    Path(path).write_text(json.dumps(record, indent=1) + "\n")
    print(f"\nrecord: {path}")
