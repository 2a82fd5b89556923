"""The pre-launch linter: every way a P/D fleet spec is known to fail, found before launch.

Each rule has a stable code, names the offending field, says what the problem costs in
production and how to fix it. Rules are plain functions over a :class:`LintContext`;
:data:`RULES` lists them in code order (``pdctl lint --rules`` prints the table).
"""

from __future__ import annotations

from pdctl.sdk.lint import admission as _admission_rules
from pdctl.sdk.lint import cache as _cache_rules
from pdctl.sdk.lint import canary as _canary_rules
from pdctl.sdk.lint import connector as _connector_rules
from pdctl.sdk.lint import contract as _contract_rules
from pdctl.sdk.lint import devices as _devices_rules
from pdctl.sdk.lint import handshake as _handshake_rules
from pdctl.sdk.lint import k8s as _k8s_rules
from pdctl.sdk.lint import network as _network_rules
from pdctl.sdk.lint import observability as _observability_rules
from pdctl.sdk.lint import ray as _ray_rules
from pdctl.sdk.lint import security as _security_rules
from pdctl.sdk.lint import settings as _settings_rules
from pdctl.sdk.lint.core import (
    MACHINE_RULES,
    RAY_MACHINE_RULES,
    RULES,
    SEVERITY_ORDER,
    Finding,
    LintContext,
    LintReport,
    RuleInfo,
    Severity,
    lint,
    require_clean,
    rule,
)

_REGISTERED = (
    _network_rules,
    _contract_rules,
    _handshake_rules,
    _devices_rules,
    _settings_rules,
    _k8s_rules,
    _ray_rules,
    _observability_rules,
    _connector_rules,
    _cache_rules,
    _canary_rules,
    _security_rules,
    _admission_rules,
)  # importing them registers the rules

__all__ = [
    "MACHINE_RULES",
    "RAY_MACHINE_RULES",
    "RULES",
    "SEVERITY_ORDER",
    "Finding",
    "LintContext",
    "LintReport",
    "RuleInfo",
    "Severity",
    "lint",
    "require_clean",
    "rule",
]
