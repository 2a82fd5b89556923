"""Spec → launch plan: the exact argv and environment of every vLLM instance, and the
ports, devices and cores each gets.

* :mod:`~pdctl.sdk.fleetplan.model` — :class:`InstancePlan`, :class:`FleetPlan`.
* :mod:`~pdctl.sdk.fleetplan.build` — :func:`build_plan` and the router's and
  Prometheus' plans.
* :mod:`~pdctl.sdk.fleetplan.prometheus` — the local Prometheus: its binary, files and
  command line.
* :mod:`~pdctl.sdk.fleetplan.ports` — ports per host; which host names share a port space.
* :mod:`~pdctl.sdk.fleetplan.vllm_args` — vLLM's argv, environment, KV transfer and KV
  event configs.
* :mod:`~pdctl.sdk.fleetplan.cores` — CPU cores per instance and per rank.

Not to be confused with :mod:`pdctl.sdk.plan`, the capacity planner of ``pdctl plan``.
"""

from pdctl.sdk.fleetplan.build import build_plan, prometheus_plan, router_plan
from pdctl.sdk.fleetplan.cores import compress_ranges, cpu_binding, split_cores
from pdctl.sdk.fleetplan.model import FleetPlan, GroupRole, InstancePlan, PlanRole, RouterPlan
from pdctl.sdk.fleetplan.ports import (
    DEFAULT_HTTP_BASE,
    DEFAULT_SIDE_CHANNEL_BASE,
    host_key,
    is_loopback,
    is_wildcard,
)
from pdctl.sdk.fleetplan.vllm_args import (
    CONNECTOR_MODULE,
    CONNECTORS,
    CPU_ENTRYPOINT,
    RENDER_ENTRYPOINT,
    effective_block_size,
    effective_mode,
    flag_value,
    kv_events_config,
    kv_transfer_config,
    priority_scheduling,
    scheduling_policy,
    with_engine_id,
    with_kv_events,
)

__all__ = [
    "CONNECTORS",
    "CONNECTOR_MODULE",
    "CPU_ENTRYPOINT",
    "DEFAULT_HTTP_BASE",
    "DEFAULT_SIDE_CHANNEL_BASE",
    "RENDER_ENTRYPOINT",
    "FleetPlan",
    "GroupRole",
    "InstancePlan",
    "PlanRole",
    "RouterPlan",
    "build_plan",
    "compress_ranges",
    "cpu_binding",
    "effective_block_size",
    "effective_mode",
    "flag_value",
    "host_key",
    "is_loopback",
    "is_wildcard",
    "kv_events_config",
    "kv_transfer_config",
    "priority_scheduling",
    "prometheus_plan",
    "router_plan",
    "scheduling_policy",
    "split_cores",
    "with_engine_id",
    "with_kv_events",
]
