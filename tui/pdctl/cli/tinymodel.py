"""The tiny demo model for the commands that fall back to the embedded CPU demo spec
(demo, bench, profile): the one import to change when its builder moves, so that no
``cmd_*`` imports another."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from pdctl.cli.args import human
from pdctl.cli.cmd_model import ensure_tiny_model
from pdctl.cli.common import load, spec_overrides

if TYPE_CHECKING:
    from pdctl.sdk.spec import FleetSpec

__all__ = ["ensure_tiny_model", "spec_or_demo"]


def spec_or_demo(args: argparse.Namespace) -> tuple[FleetSpec, str]:
    """The spec of ``-f`` (or ./pdctl.toml); without one the embedded CPU demo spec on
    the tiny model (built if needed). ``--set``/``--fleet`` apply to either."""
    from pdctl.sdk.demo import load_demo_spec

    if args.file or os.path.exists("pdctl.toml"):
        loaded = load(args)
        return loaded.spec, str(loaded.source)
    model = ensure_tiny_model(quiet=not human(args))
    return load_demo_spec(model, spec_overrides(args)).spec, "<embedded CPU demo spec>"
