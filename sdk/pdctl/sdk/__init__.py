"""pdctl SDK: describe, plan, lint, launch and watch disaggregated P/D vLLM fleets.

One import for scripts::

    from pdctl.sdk import Fleet

    with Fleet.demo() as fleet:
        print(fleet.router.complete("the prefill engine").text)
        print(fleet.snapshot().summary.kv_bytes_moved)

The SDK never imports textual, vllm, nixl or torch; front ends (CLI, TUI) sit on top.
Names are resolved lazily so that importing one light module (e.g. the errors) does not
pull in pydantic and the rest.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"  # after 0.1.0 (CHANGELOG); packaging reads it here

_EXPORTS: dict[str, str] = {
    "Fleet": "fleet.sync",
    "AsyncFleet": "fleet.launcher",
    "RouterClient": "client",
    "AsyncRouterClient": "client",
    "Completion": "client",
    "Chunk": "client",
    "RequestTimeline": "client",
    "RouterState": "client",
    "FleetMonitor": "metrics.monitor",
    "Snapshot": "metrics.snapshot",
    "Summary": "metrics.snapshot",
    "ensure_tiny_model": "demo",
    "load_demo_spec": "demo",
    "PdctlError": "errors",
    "SpecError": "errors",
    "SpecProblem": "errors",
    "LintFailed": "errors",
    "LaunchError": "errors",
    "RouterError": "errors",
    "Finding": "lint",
    "LintReport": "lint",
    "lint": "lint",
    "require_clean": "lint",
    "FleetPlan": "fleetplan",
    "InstancePlan": "fleetplan",
    "build_plan": "fleetplan",
    "FleetSpec": "spec",
    "LoadedSpec": "specload",
    "load_spec": "specload",
}

if TYPE_CHECKING:
    from pdctl.sdk.client import (
        AsyncRouterClient,
        Chunk,
        Completion,
        RequestTimeline,
        RouterClient,
        RouterState,
    )
    from pdctl.sdk.demo import ensure_tiny_model, load_demo_spec
    from pdctl.sdk.errors import (
        LaunchError,
        LintFailed,
        PdctlError,
        RouterError,
        SpecError,
        SpecProblem,
    )
    from pdctl.sdk.fleet.launcher import AsyncFleet
    from pdctl.sdk.fleet.sync import Fleet
    from pdctl.sdk.fleetplan import FleetPlan, InstancePlan, build_plan
    from pdctl.sdk.lint import Finding, LintReport, lint, require_clean
    from pdctl.sdk.metrics.monitor import FleetMonitor
    from pdctl.sdk.metrics.snapshot import Snapshot, Summary
    from pdctl.sdk.spec import FleetSpec
    from pdctl.sdk.specload import LoadedSpec, load_spec


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pdctl.sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"pdctl.sdk.{module}"), name)
    globals()[name] = value  # resolved once
    return value


class _FrontDoor(types.ModuleType):
    """``pdctl.sdk`` itself. Python binds a subpackage to its parent's attribute of the
    same name when it first imports it (``import pdctl.sdk.lint`` sets ``pdctl.sdk.lint``
    to the package), which would make ``from pdctl.sdk import lint`` give the package
    instead of the function. An export whose name is also a subpackage keeps the export;
    the subpackage stays importable by its full name (``from pdctl.sdk.lint import …``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name, "").split(".")[0] == name:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _FrontDoor


__all__ = [
    "AsyncFleet",
    "AsyncRouterClient",
    "Chunk",
    "Completion",
    "Finding",
    "Fleet",
    "FleetMonitor",
    "FleetPlan",
    "FleetSpec",
    "InstancePlan",
    "LaunchError",
    "LintFailed",
    "LintReport",
    "LoadedSpec",
    "PdctlError",
    "RequestTimeline",
    "RouterClient",
    "RouterError",
    "RouterState",
    "Snapshot",
    "SpecError",
    "SpecProblem",
    "Summary",
    "__version__",
    "build_plan",
    "ensure_tiny_model",
    "lint",
    "load_demo_spec",
    "load_spec",
    "require_clean",
]
