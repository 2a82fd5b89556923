"""Old import paths of the client, kept for one release with a DeprecationWarning."""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def moved(old: str, names: dict[str, str], name: str) -> Any:
    """``name`` of the deprecated module ``old``, from the module ``names`` maps it to."""
    new = names.get(name)
    if new is None:
        raise AttributeError(f"module {old!r} has no attribute {name!r}")
    warnings.warn(
        f"{old}.{name} moved to {new}.{name}; {old} goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(new), name)
