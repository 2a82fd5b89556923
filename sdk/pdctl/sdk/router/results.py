"""Deprecated: the router's answers as typed values are :mod:`pdctl.sdk.client.results`.
Importing from here still works, with a DeprecationWarning."""

from typing import Any

from pdctl.sdk.router._moved import moved

_NAMES = {
    n: "pdctl.sdk.client.results"
    for n in ("Chunk", "Completion", "RequestTimeline", "RoutedInstance", "RouterState", "Segment")
}


def __getattr__(name: str) -> Any:
    return moved(__name__, _NAMES, name)
