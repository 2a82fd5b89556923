"""The demo fleet's model: a tiny random-weight Llama built on this machine.

Building it needs torch and transformers, which the SDK never imports: the builder
(:mod:`pdctl.connector.tinymodel`) runs in a subprocess of this interpreter, and the
SDK only checks the result (:func:`~pdctl.sdk.paths.tiny_model_ready`).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from pdctl.sdk.errors import LaunchError
from pdctl.sdk.paths import demo_spec_text, tiny_model_dir, tiny_model_ready
from pdctl.sdk.specload import LoadedSpec, load_spec

BUILDER = "pdctl.connector.tinymodel"
MISSING_EXTRA = (
    "building the tiny model needs torch and transformers, which this Python lacks: "
    "pip install 'pdctl[cpu]' (see the README for the CPU torch wheel index)"
)


def ensure_tiny_model(
    target: str | Path | None = None,
    *,
    force: bool = False,
    seed: int = 0,
    python: str | None = None,
) -> Path:
    """The tiny demo model's directory, built first when it is missing or outdated.

    ``target`` defaults to the user cache (:func:`~pdctl.sdk.paths.tiny_model_dir`);
    ``python`` is the interpreter that builds it (default: this one). Raises
    :class:`LaunchError` naming the missing extra when the builder cannot import torch.
    """
    path = (Path(target) if target is not None else tiny_model_dir()).expanduser()
    if tiny_model_ready(path) and not force:
        return path
    cmd = [python or sys.executable, "-m", BUILDER, "--out", str(path), "--seed", str(seed)]
    if force:
        cmd.append("--force")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as e:
        raise LaunchError(f"cannot run {cmd[0]} to build the tiny model: {e}") from None
    if r.returncode != 0:
        if "No module named" in r.stderr:
            raise LaunchError(MISSING_EXTRA)
        raise LaunchError(f"building the tiny model in {path} failed:\n{r.stderr[-2000:]}")
    return path


def load_demo_spec(model: str | Path | None = None, overrides: Sequence[str] = ()) -> LoadedSpec:
    """The embedded CPU demo spec (``examples/cpu-1p1d.toml``) on ``model`` (default: the
    tiny model, built first when missing, as :meth:`Fleet.demo` does), with ``PDCTL_``
    environment variables and ``overrides`` (``KEY=VALUE``) on top."""
    path = model if model is not None else ensure_tiny_model()
    return load_spec(
        "<embedded demo spec>", [f"model.path={path}", *overrides], text=demo_spec_text()
    )
