"""Rule PD049: the router's live output canary (``[router.canary]``,
:mod:`pdctl.sdk.router.canary`) — replays that compare nothing, cost much, or carry the
clients' prompts off the machine."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

from pdctl.sdk.fleetplan import is_loopback
from pdctl.sdk.lint.core import Finding, LintContext, _f, rule

HIGH_RATE = 0.25
"""Above this share of greedy requests, lint notes what the replays cost."""


@rule("PD049", "router.canary: nothing to compare, a high rate, or prompts sent off-host")
def _canary(ctx: LintContext) -> Iterator[Finding]:
    rs = ctx.spec.router
    if rs is None or rs.canary.rate <= 0:
        return
    c = rs.canary
    if ctx.spec.fleet.mode == "colocated":
        yield _f(
            "PD049",
            "warning",
            "router.canary.rate",
            f"router.canary.rate = {c.rate:g} on a colocated fleet",
            "the canary compares disaggregated answers with a replay on one instance; a "
            "colocated fleet has none, so nothing is ever replayed",
            "set router.canary.rate = 0, or run the fleet disaggregated (push or pull)",
        )
        return
    if c.rate > HIGH_RATE:
        where = "the reference" if c.target == "reference" else f"the pair's {c.target}"
        yield _f(
            "PD049",
            "info",
            "router.canary.rate",
            f"router.canary.rate = {c.rate:g}: that share of greedy requests is run twice",
            f"each replay is a whole request on {where}: up to {c.rate:.0%} more greedy "
            "load (replays are dropped, not queued, when the instance is busy)",
            "keep it at a few percent in production (0.01-0.05); 1.0 is for tests",
        )
    ptp = sorted({g.tp for g in ctx.spec.prefill})
    dtp = sorted({g.tp for g in ctx.spec.decode})
    if ptp and dtp and (len(ptp) > 1 or ptp != dtp):
        layouts = ", ".join(f"TP{p}→TP{d}" for p in ptp for d in dtp if p != d)
        yield _f(
            "PD049",
            "info",
            "router.canary.tie_tolerance",
            f"the canary compares heterogeneous-TP pairs ({layouts}) with a near-tie "
            f"tolerance of {c.tie_tolerance:g}",
            "a prefill and decode of different TP sizes do not compute bit for bit alike, "
            "so no single instance reproduces their answer exactly: a first difference "
            "where the two best tokens are within the tolerance is counted 'tied', not "
            "'diverged' (equal-TP pairs are compared exactly)",
            "keep the default (0.05 nats) unless tied counts grow; 0 counts every "
            "difference as diverged",
        )
    if c.target == "reference" and c.reference_url:
        host = urlsplit(c.reference_url).hostname or ""
        if not is_loopback(host):
            yield _f(
                "PD049",
                "warning",
                "router.canary.reference_url",
                f"canary replays go to {host} over plain HTTP",
                "every sampled request's prompt and answer cross the network unencrypted, "
                "to a server outside the fleet's keys",
                "use a reference on this machine (127.0.0.1), or target = 'decode'",
            )
