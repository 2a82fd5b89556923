"""Where pdctl keeps things on this machine (XDG conventions)."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path


def cache_root() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "pdctl"


def tiny_model_dir() -> Path:
    """Default location of the locally built tiny demo model."""
    return cache_root() / "models" / "tiny"


def demo_spec_text() -> str:
    """The embedded CPU demo fleet spec (identical to examples/cpu-1p1d.toml)."""
    return resources.files("pdctl.sdk").joinpath("data/demo.toml").read_text(encoding="utf-8")


TINY_MARKER = "pdctl-tiny.json"
TINY_FORMAT = 2
"""Bumped when the tiny model's construction changes, so cached copies are rebuilt."""


def tiny_model_ready(path: Path) -> bool:
    """True when ``path`` holds a tiny model of the current :data:`TINY_FORMAT`."""
    p = path.expanduser()
    try:
        marker = json.loads((p / TINY_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("format") == TINY_FORMAT
        and (p / "config.json").is_file()
    )
