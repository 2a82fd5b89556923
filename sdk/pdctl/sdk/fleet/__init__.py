"""Launching and supervising a local fleet (async first, with a sync facade)."""

from pdctl.sdk.fleet.events import FleetEvent, InstanceStatus
from pdctl.sdk.fleet.launcher import AsyncFleet
from pdctl.sdk.fleet.policy import RestartPolicy
from pdctl.sdk.fleet.remote import (
    FleetStatus,
    cleanup_stale,
    fleet_status,
    remote_down,
    remote_restart,
    remote_stop,
)
from pdctl.sdk.fleet.state import fleet_dir, read_state, state_root, tail
from pdctl.sdk.fleet.sync import Fleet

__all__ = [
    "AsyncFleet",
    "Fleet",
    "FleetEvent",
    "FleetStatus",
    "InstanceStatus",
    "RestartPolicy",
    "cleanup_stale",
    "fleet_dir",
    "fleet_status",
    "read_state",
    "remote_down",
    "remote_restart",
    "remote_stop",
    "state_root",
    "tail",
]
