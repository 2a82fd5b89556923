"""Rules PD042-PD043: pdctl connector settings passed through ``fleet.connector_options``."""

from __future__ import annotations

from collections.abc import Iterator

from pdctl.sdk.lint.core import Finding, LintContext, _f, rule

FAILPOINT_PREFIX = "pdctl_failpoint_"
"""Keys that make the pdctl connector fail on purpose (the chaos suite's WRITE failure)."""
ALLOW_FAILPOINTS_ENV = "PDCTL_ALLOW_FAILPOINTS"
"""Set to 1 by the chaos suite and the tests; nothing else should set it."""
SYNC_MODES = ("strict", "rw", "none")


@rule("PD042", "a connector failpoint outside tests")
def _failpoint(ctx: LintContext) -> Iterator[Finding]:
    if ctx.environ.get(ALLOW_FAILPOINTS_ENV) == "1":
        return
    for key in ctx.spec.fleet.connector_options:
        if key.startswith(FAILPOINT_PREFIX):
            yield _f(
                "PD042",
                "error",
                f"fleet.connector_options.{key}",
                f"{key} makes the pdctl connector fail transfers on purpose",
                "requests fail or recompute although nothing is wrong; it exists for the "
                "chaos suite",
                f"remove fleet.connector_options.{key} (tests set {ALLOW_FAILPOINTS_ENV}=1)",
            )


@rule("PD043", "a NIXL agent sync mode that can crash the engine")
def _sync_mode(ctx: LintContext) -> Iterator[Finding]:
    value = ctx.spec.fleet.connector_options.get("pdctl_nixl_sync_mode")
    if value is None:
        return
    name = str(value).strip().lower()
    if name not in SYNC_MODES:
        yield _f(
            "PD043",
            "error",
            "fleet.connector_options.pdctl_nixl_sync_mode",
            f"pdctl_nixl_sync_mode = {value!r} is not a NIXL sync mode",
            "the connector refuses to start",
            f"use one of {', '.join(SYNC_MODES)} ('strict' is the default)",
        )
    elif name == "none" and ctx.spec.fleet.cpu_tuning:
        yield _f(
            "PD043",
            "warning",
            "fleet.connector_options.pdctl_nixl_sync_mode",
            "pdctl_nixl_sync_mode = 'none' with the NIXL progress thread off",
            "vLLM's writer and engine threads then call UCX at once: prefill segfaulted "
            "under load in this setting (see docs/reliability.md)",
            "remove the key (strict is the default) unless you are reproducing the crash",
        )
