"""Reading a router key from where the spec says it is (an environment variable or a file
such as a mounted Secret; the spec never holds it, unless lint's PD046 is accepted).

The one reader of key sources: the router's ``router.api_key`` here, every
``[[router.keys]]`` entry through :mod:`pdctl.sdk.keys`. Used by the router (to check
requests) and by the SDK's own callers of it (the supervisor, ``Fleet.router``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdctl.sdk.spec import ApiKeySpec

__all__ = ["ApiKeyError", "read_api_key", "read_key"]


class ApiKeyError(ValueError):
    """A key source is configured but unusable (the message names the field and the fix)."""


def read_key(
    field: str,
    *,
    env: str | None,
    file: str | None,
    value: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> bytes | None:
    """The key configured at spec ``field`` (inline ``value``, else the ``env`` variable,
    else the first line of ``file``); None when none is configured. Raises
    :class:`ApiKeyError` naming the field when it is configured but cannot be read."""
    if value:
        return value.encode()
    if env:
        val = (os.environ if environ is None else environ).get(env, "").strip()
        if not val:
            raise ApiKeyError(
                f"{field}.env names {env}, which is not set: export {env}=... "
                "(on Kubernetes: a Secret listed in backend.k8s.router_secret_env)"
            )
        return val.encode()
    if file:
        try:
            lines = Path(os.path.expanduser(file)).read_text().splitlines()
        except OSError as e:
            raise ApiKeyError(f"cannot read {field}.file {file}: {e.strerror}") from None
        if not lines or not lines[0].strip():
            raise ApiKeyError(f"{field}.file {file} is empty; write the key on its first line")
        return lines[0].strip().encode()
    return None


def read_api_key(src: ApiKeySpec | None) -> bytes | None:
    """The router's ``router.api_key``; None when none is configured. Raises
    :class:`ApiKeyError` naming the field."""
    if src is None:
        return None
    return read_key("router.api_key", env=src.env, file=src.file)
