"""Helpers shared by the benchmark scripts (run them from anywhere: python benchmarks/X.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from pdctl.sdk.chaos import completion
from pdctl.sdk.freeports import free_port as free_port
from pdctl.sdk.spec import FleetSpec


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


def pair_spec(p: int, d: int, port: int, router: dict[str, Any] | None = None) -> FleetSpec:
    """A push-mode spec of one prefill and one decode on local ports (pdctl's mocks or any
    OpenAI-style servers there) behind a router on ``port`` (``router``: more settings)."""
    return FleetSpec(
        model={"path": "org/m", "served_name": "tiny"},
        fleet={"mode": "push", "platform": "gpu"},
        prefill=[{"http_port": p, "devices": [0]}],
        decode=[{"http_port": d, "devices": [1]}],
        router={"port": port, **(router or {})},
    )


def admission_room(clients: int, workers: int = 1) -> dict[str, Any]:
    """``[router]`` settings that let ``clients`` concurrent requests in: admission's stage
    limits and queue at that number (its defaults, 32 requests in prefill per instance and
    512 queued, answer most of a thousand clients with 429 at once; vllm-router, with no
    admission control, queues nothing). With ``workers`` router processes, each enforces
    1/``workers`` of every limit while the kernel spreads connections over them unevenly
    (by a hash of each connection's addresses): the limits are ``clients`` times
    ``workers``, so that each worker has room for every client (at exactly ``clients``, 10,000
    streams over two workers had 110 refused with 503 ``decode_saturated``: the worker that
    got more than 5,000 queued the rest until they timed out)."""
    n = clients * max(1, workers)
    room = {"prefill_in_flight_per_instance": n, "decode_in_flight_per_instance": n}
    return {"admission": {**room, "max_queued": n}}


def pdctl_router_argv(
    prefill: str, decode: str, port: int, tmp: Path, router: dict[str, Any] | None = None
) -> list[str]:
    """pdctl's router in push mode in front of one prefill and one decode URL (``router``:
    more ``[router]`` settings)."""
    p, d = (int(u.rsplit(":", 1)[1]) for u in (prefill, decode))
    spec = pair_spec(p, d, port, router)
    f = tmp / f"spec-{port}.json"
    # only what is set: a baseline router (an earlier commit's spec) reads it too
    f.write_text(spec.model_dump_json(exclude_defaults=True))
    return [sys.executable, "-m", "pdctl.sdk.router.server", "--spec-json", str(f)]


def greedy_body(prompt: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    """A completions body for the demo's model: greedy, ``ignore_eos`` (exact lengths),
    streamed unless told otherwise (the chaos suite's :func:`~pdctl.sdk.chaos.completion`)."""
    return completion(prompt, max_tokens, stream=stream)


def write_record(path: str | Path, record: Any) -> None:
    """The run's JSON record to ``path``, and a line saying where it went."""
    Path(path).write_text(json.dumps(record, indent=1) + "\n")
    print(f"\nrecord: {path}")


def wait_health(url: str, timeout: float = 60) -> None:
    """Wait until ``url``'s ``/health`` answers 200 (RuntimeError after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} never became healthy")


def build_at(ref: str, dest: Path) -> list[str]:
    """This repository's ``sdk``, ``tui`` and ``connector`` as they are at git ``ref``,
    extracted under ``dest``: the ``sys.path`` entries of that build (to measure an
    earlier commit in the same run as the working tree)."""
    parts = ("sdk", "tui", "connector")
    root = Path(__file__).resolve().parent.parent
    dest.mkdir(parents=True, exist_ok=True)
    tree = subprocess.run(
        ["git", "-C", str(root), "archive", ref, *parts], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tree.stdout, check=True)
    return [str(dest / p) for p in parts]
