"""Deprecated: the router client is :mod:`pdctl.sdk.client` (``from pdctl.sdk import
RouterClient``). Importing from here still works, with a DeprecationWarning."""

from typing import Any

from pdctl.sdk.router._moved import moved

_NAMES = {n: "pdctl.sdk.client" for n in ("RouterClient", "AsyncRouterClient")}
_NAMES.update({n: "pdctl.sdk.client.base" for n in ("DEFAULT_TIMEOUT_S", "CONTROL_TIMEOUT_S")})


def __getattr__(name: str) -> Any:
    return moved(__name__, _NAMES, name)
