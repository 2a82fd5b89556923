"""``pdctl plan``/``pdctl profile``'s engine: from a measured profile, a workload and
its SLOs to a P:D layout.

* :mod:`~pdctl.sdk.plan.profile` — the profile schema and its fitted curves.
* :mod:`~pdctl.sdk.plan.latency` — queueing and latency of one layout (docs/plan.md).
* :mod:`~pdctl.sdk.plan.transfer` — KV transfer time: measured, or preflight's path model.
* :mod:`~pdctl.sdk.plan.planner` — candidates, recommendation, reasons.
* :mod:`~pdctl.sdk.plan.specout` — the recommended layout as a spec.
* :mod:`~pdctl.sdk.plan.profiler` — measures a profile on a running instance.
* :mod:`~pdctl.sdk.plan.live` — live figures of a fleet and the correction factors.
* :mod:`~pdctl.sdk.plan.recommend` — the recommendation for a running fleet's live load.
"""

from pdctl.sdk.plan.latency import Correction, Prediction, Transfer, Workload
from pdctl.sdk.plan.planner import Candidate, Layout, Plan, Slos, layouts, make_plan
from pdctl.sdk.plan.profile import (
    Curves,
    Profile,
    ProfileError,
    fit,
    load_profile,
    save_profile,
)
from pdctl.sdk.plan.recommend import Figure, LivePlanner, LiveRecommendation, recommend
from pdctl.sdk.plan.transfer import transfers

__all__ = [
    "Candidate",
    "Correction",
    "Curves",
    "Figure",
    "Layout",
    "LivePlanner",
    "LiveRecommendation",
    "Plan",
    "Prediction",
    "Profile",
    "ProfileError",
    "Slos",
    "Transfer",
    "Workload",
    "fit",
    "layouts",
    "load_profile",
    "make_plan",
    "recommend",
    "save_profile",
    "transfers",
]
