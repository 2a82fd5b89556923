"""The router's API key, read from where the spec says it is (the spec never holds it).

Used by the router (to check requests) and by the SDK's own callers of it (the
supervisor, ``Fleet.router``); plain code over the spec's ``router.api_key`` table.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdctl.sdk.spec import ApiKeySpec

__all__ = ["ApiKeyError", "read_api_key"]


class ApiKeyError(ValueError):
    """The router's API key source is configured but unusable."""


def read_api_key(src: ApiKeySpec | None) -> bytes | None:
    """The router's API key, from the spec's env var or file; None when none is
    configured. Raises :class:`ApiKeyError` naming the field."""
    if src is None:
        return None
    if src.env:
        val = os.environ.get(src.env, "")
        if not val:
            raise ApiKeyError(f"router.api_key.env names {src.env}, which is not set")
        return val.encode()
    if src.file:
        try:
            lines = Path(os.path.expanduser(src.file)).read_text().splitlines()
        except OSError as e:
            raise ApiKeyError(f"cannot read router.api_key.file {src.file}: {e}") from None
        if not lines or not lines[0].strip():
            raise ApiKeyError(f"router.api_key.file {src.file} is empty")
        return lines[0].strip().encode()
    return None
