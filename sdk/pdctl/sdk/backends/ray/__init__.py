"""Ray: every instance a detached actor on a node chosen from the spec's placement
settings. Importing this package does not import Ray (only talking to a cluster does)."""

from pdctl.sdk.backends.ray.backend import RayBackend
from pdctl.sdk.backends.ray.placement import (
    Node,
    Placement,
    PlacementError,
    demands,
    place,
    resolve,
)

__all__ = ["Node", "Placement", "PlacementError", "RayBackend", "demands", "place", "resolve"]
