"""The linter's engine: findings, the rule registry, the context rules read, the
driver. The rules themselves live in :mod:`~pdctl.sdk.lint.network` (ports and hosts),
:mod:`~pdctl.sdk.lint.contract` (the P/D contract), :mod:`~pdctl.sdk.lint.handshake`
(what vLLM's handshake accepts), :mod:`~pdctl.sdk.lint.devices`,
:mod:`~pdctl.sdk.lint.settings` (managed flags, model path, UCX, router),
:mod:`~pdctl.sdk.lint.k8s`, :mod:`~pdctl.sdk.lint.ray`, :mod:`~pdctl.sdk.lint.observability`,
:mod:`~pdctl.sdk.lint.connector`, :mod:`~pdctl.sdk.lint.cache` and
:mod:`~pdctl.sdk.lint.admission` (``[router.admission]``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Literal

from pdctl.sdk.errors import LintFailed
from pdctl.sdk.fleetplan import (
    FleetPlan,
    InstancePlan,
    build_plan,
)
from pdctl.sdk.modelinfo import (
    ModelInfo,
    ModelInfoError,
    read_model_info,
)
from pdctl.sdk.spec import (
    FleetSpec,
    InstanceGroup,
    Role,
)
from pdctl.sdk.specload import SpecLike, spec_of

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    field: str
    message: str
    cost: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class LintContext:
    spec: FleetSpec
    plan: FleetPlan
    model: ModelInfo | None
    model_error: str | None
    check_bound_ports: bool
    environ: dict[str, str]

    def groups(self) -> Iterator[tuple[Role, int, InstanceGroup, str]]:
        for role, gi, g in self.spec.groups():
            yield role, gi, g, f"{role}[{gi}]"

    def instances_of(self, role: Role, gi: int) -> list[InstancePlan]:
        return [i for i in self.plan.instances if i.group_role == role and i.group_index == gi]


@dataclass
class LintReport:
    findings: list[Finding]
    plan: FleetPlan | None
    model: ModelInfo | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def exit_code(self, strict: bool = False) -> int:
        """0 clean, 1 warnings only (under ``strict``), 2 errors."""
        if self.errors:
            return 2
        if strict and self.warnings:
            return 1
        return 0

    def as_dict(self) -> dict[str, object]:
        return {
            "ok": not self.errors,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "findings": [f.as_dict() for f in self.findings],
            "notes": list(self.notes),
        }


Rule = Callable[[LintContext], Iterator[Finding]]


@dataclass(frozen=True)
class RuleInfo:
    code: str
    title: str
    check: Rule


RULES: list[RuleInfo] = []


def rule(code: str, title: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        RULES.append(RuleInfo(code, title, fn))
        RULES.sort(key=lambda r: r.code)  # code order, whichever module registers first
        return fn

    return deco


def _f(code: str, severity: Severity, field_: str, message: str, cost: str, fix: str) -> Finding:
    return Finding(code, severity, field_, message, cost, fix)


# --------------------------------------------------------------------------- ports


MACHINE_RULES = frozenset({"PD002", "PD003", "PD004", "PD012", "PD013", "PD019", "PD021"})
"""Rules about this machine's ports, hosts, devices and files: on Kubernetes every pod has
its own network, devices and disk, so the PD024+ rules check those things there instead."""

RAY_MACHINE_RULES = frozenset({"PD002", "PD019", "PD021"})
"""On Ray the ports, the model and the router's key live on the nodes, not on the machine
pdctl runs on: each actor checks the model path on its node before starting."""


# --------------------------------------------------------------------------- driver


def lint(
    spec: SpecLike,
    *,
    check_bound_ports: bool = True,
    environ: dict[str, str] | None = None,
) -> LintReport:
    """Run every rule over ``spec`` (a :class:`FleetSpec`, or what :func:`load_spec`
    gives). Never raises for problems in the spec; they become findings."""
    spec = spec_of(spec)
    try:
        plan = build_plan(spec)
    except ValueError as e:
        return LintReport(
            findings=[
                _f(
                    "PD000",
                    "error",
                    "",
                    f"cannot plan the fleet: {e}",
                    "nothing starts",
                    "fix the ports or counts named above",
                )
            ],
            plan=None,
        )
    model: ModelInfo | None = None
    model_error: str | None = None
    try:
        model = read_model_info(spec.model.path)
    except ModelInfoError as e:
        model_error = str(e)
    ctx = LintContext(
        spec=spec,
        plan=plan,
        model=model,
        model_error=model_error,
        check_bound_ports=check_bound_ports,
        environ=dict(os.environ if environ is None else environ),
    )
    findings: list[Finding] = []
    skip = {"k8s": MACHINE_RULES, "ray": RAY_MACHINE_RULES}.get(spec.backend.kind, frozenset())
    for r in RULES:
        if r.code not in skip:
            findings.extend(r.check(ctx))
    findings.sort(key=lambda f: (SEVERITY_ORDER[f.severity], f.code, f.field))
    notes = []
    if model is None and model_error is None:
        given = [f for f in ("kv_heads", "mla") if getattr(spec.model, f) is not None]
        notes.append(
            f"model {spec.model.path!r} is not a local directory: TP rules use model."
            + " and model.".join(given)
            if given
            else f"model {spec.model.path!r} is not a local directory: TP rules assume a "
            "standard (non-MLA) model of unknown KV heads (set model.kv_heads, model.mla)"
        )
    if not check_bound_ports:
        notes.append("port-in-use check (PD002) skipped")
    if skip:
        where = "Kubernetes" if spec.backend.kind == "k8s" else "Ray"
        notes.append(f"on {where}, checks of this machine skipped: {', '.join(sorted(skip))}")
    return LintReport(findings=findings, plan=plan, model=model, notes=notes)


def require_clean(report: LintReport) -> FleetPlan:
    """The plan, or :class:`LintFailed` when the spec has lint errors."""
    if report.errors or report.plan is None:
        lines = [f"{f.code} {f.field}: {f.message} — fix: {f.fix}" for f in report.errors]
        raise LintFailed("the spec has lint errors:\n  " + "\n  ".join(lines))
    return report.plan
