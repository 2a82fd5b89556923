"""``pdctl model tiny [DIR]``: build (or reuse) the tiny local demo model."""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from pathlib import Path

from pdctl.cli.args import emit, without_spec
from pdctl.cli.common import console

GRAMMAR = without_spec(
    "the model is built from a seed, not from a fleet spec: drop -f/--set",
    "the tiny model belongs to no fleet: drop --fleet",
    "the model is built on this machine",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="model_command", metavar="KIND", required=True)
    t = sub.add_parser("tiny", help="a seeded random-weight Llama + BPE tokenizer (~2 MB)")
    t.add_argument("dir", nargs="?", default=None, help="where (default: user cache dir)")
    t.add_argument("--force", action="store_true", help="rebuild even if present")
    t.add_argument("--seed", type=int, default=0)


def ensure_tiny_model(
    target: Path | None = None, *, force: bool = False, seed: int = 0, quiet: bool = False
) -> Path:
    """Build the tiny model in a subprocess (it needs torch/transformers); reuse it if there."""
    from pdctl.sdk.errors import LaunchError
    from pdctl.sdk.paths import tiny_model_dir, tiny_model_ready

    path = (target or tiny_model_dir()).expanduser()
    if tiny_model_ready(path) and not force:
        return path
    cmd = [
        sys.executable,
        "-m",
        "pdctl.connector.tinymodel",
        "--out",
        str(path),
        "--seed",
        str(seed),
    ] + (["--force"] if force else [])
    out = console(stderr=True)
    status = out.status(f"building the tiny model in {path}…")
    with contextlib.nullcontext() if quiet else status:
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        if "No module named" in r.stderr:
            raise LaunchError(
                "building the tiny model needs torch and transformers: "
                "pip install 'pdctl[cpu]' (see README for the CPU torch wheel index)"
            )
        raise LaunchError(f"building the tiny model failed:\n{r.stderr[-2000:]}")
    return path


def run(args: argparse.Namespace) -> int:
    path = ensure_tiny_model(Path(args.dir) if args.dir else None, force=args.force, seed=args.seed)
    if not emit(args, {"model": "tiny", "path": str(path)}):
        console().print(f"tiny model ready at {path}")
    return 0
