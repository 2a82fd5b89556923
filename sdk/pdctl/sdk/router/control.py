"""Deprecated: ``RouterControl`` is folded into :class:`pdctl.sdk.client.AsyncRouterClient`
(the same operations: ``state``, ``drain``/``resume``, ``notify``, ``set_mode``,
``set_policy``, ``requests``, ``wait_drained``); the API key reader is
:mod:`pdctl.sdk.apikey`. The other names still import from here, with a DeprecationWarning."""

import warnings
from typing import Any

from pdctl.sdk.errors import RouterError
from pdctl.sdk.router._moved import moved

_NAMES = {
    "ApiKeyError": "pdctl.sdk.apikey",
    "read_api_key": "pdctl.sdk.apikey",
    "RoutedInstance": "pdctl.sdk.client",
    "RouterState": "pdctl.sdk.client",
}


def __getattr__(name: str) -> Any:
    if name == "RouterControl":
        raise ImportError(
            "pdctl.sdk.router.control.RouterControl was removed: use "
            "pdctl.sdk.client.AsyncRouterClient (drain(x, drain=False) is resume(x); "
            "requests() gives typed timelines, their .raw is the old dict)"
        )
    if name == "RouterControlError":
        warnings.warn(
            "RouterControlError is pdctl.sdk.errors.RouterError (pdctl.sdk.RouterError)",
            DeprecationWarning,
            stacklevel=2,
        )
        return RouterError
    return moved(__name__, _NAMES, name)
