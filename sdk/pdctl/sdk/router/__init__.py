"""The push-aware disaggregation router (ASGI app + dispatch engine)."""

from pdctl.sdk.router.app import RouterApp, load_api_key
from pdctl.sdk.router.core import ROUTER_MODES, RouteError, Router, RouterMode, mode_of

__all__ = [
    "ROUTER_MODES",
    "RouteError",
    "Router",
    "RouterApp",
    "RouterMode",
    "load_api_key",
    "mode_of",
]
