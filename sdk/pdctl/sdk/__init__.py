"""pdctl SDK: describe, plan, lint, launch and watch disaggregated P/D vLLM fleets.

The SDK never imports textual, vllm, nixl or torch; front ends (CLI, TUI) sit on top.
Names are resolved lazily so that importing one light module (e.g. the errors) does not
pull in pydantic and the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

_EXPORTS: dict[str, str] = {
    "PdctlError": "errors",
    "SpecError": "errors",
    "SpecProblem": "errors",
    "LintFailed": "errors",
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
    from pdctl.sdk.errors import LintFailed, PdctlError, SpecError, SpecProblem
    from pdctl.sdk.fleetplan import FleetPlan, InstancePlan, build_plan
    from pdctl.sdk.lint import Finding, LintReport, lint, require_clean
    from pdctl.sdk.spec import FleetSpec
    from pdctl.sdk.specload import LoadedSpec, load_spec


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pdctl.sdk' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pdctl.sdk.{module}"), name)


__all__ = [
    "Finding",
    "FleetPlan",
    "FleetSpec",
    "InstancePlan",
    "LintFailed",
    "LintReport",
    "LoadedSpec",
    "PdctlError",
    "SpecError",
    "SpecProblem",
    "__version__",
    "build_plan",
    "lint",
    "load_spec",
    "require_clean",
]
