"""``pdctl model tiny [DIR]``: build (or reuse) the tiny local demo model."""

from __future__ import annotations

import argparse
import contextlib
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
    """:func:`pdctl.sdk.demo.ensure_tiny_model` with a progress line while it builds."""
    from pdctl.sdk.demo import ensure_tiny_model as build
    from pdctl.sdk.paths import tiny_model_dir, tiny_model_ready

    path = (target or tiny_model_dir()).expanduser()
    if tiny_model_ready(path) and not force:
        return path
    status = console(stderr=True).status(f"building the tiny model in {path}…")
    with contextlib.nullcontext() if quiet else status:
        return build(path, force=force, seed=seed)


def run(args: argparse.Namespace) -> int:
    path = ensure_tiny_model(Path(args.dir) if args.dir else None, force=args.force, seed=args.seed)
    if not emit(args, {"model": "tiny", "path": str(path)}):
        console().print(f"tiny model ready at {path}")
    return 0
