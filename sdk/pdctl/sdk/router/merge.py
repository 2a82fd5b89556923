"""Several router workers as one router: their metrics, recent requests and control state
merged into the one view a client of ``/metrics``, ``/v1/pdctl/requests`` and
``/v1/pdctl/state`` expects (:mod:`pdctl.sdk.router.workers`). Pure functions over the
plain data each worker sends.

* Metrics: counters and histograms add up (a request is counted by the one worker that
  served it; histograms with the same buckets add bucket by bucket); a gauge is merged by
  its own rule (:data:`~pdctl.sdk.router.promreg.GaugeMerge`: in-flight counts add up, an
  instance is up while every worker sees it up, a breaker counts as open while any
  worker's is).
* Requests: the newest first over all workers (by the wall-clock time each was received).
* State: mode, policy and drained flags are the same on every worker (control changes reach
  all of them); an instance's ``in_flight`` is the sum, ``healthy`` whether every worker
  sees it healthy, ``breaker`` the worst worker's, with each worker's own under
  ``workers``.
"""

from __future__ import annotations

from typing import Any

from pdctl.sdk.router.promreg import Snapshot

_MERGE = {"sum": sum, "max": max, "min": min}
_BREAKER_RANK = {"closed": 0, "half-open": 1, "open": 2}


def merge_metrics(snapshots: list[Snapshot]) -> Snapshot:
    """One snapshot from several workers' (:meth:`~.promreg.Registry.snapshot`), families
    in the order they first appear. A histogram whose buckets differ from the first
    worker's is a programming error (every worker runs the same code) and raises."""
    families: dict[str, dict[str, Any]] = {}
    values: dict[str, dict[tuple[str, ...], list[Any]]] = {}
    for snap in snapshots:
        for fam in snap:
            name = fam["name"]
            if name not in families:
                families[name] = {k: v for k, v in fam.items() if k != "samples"}
                values[name] = {}
            elif fam["type"] == "histogram" and fam["bounds"] != families[name]["bounds"]:
                raise ValueError(f"{name}: workers disagree on the histogram's buckets")
            seen = values[name]
            for lv, v in fam["samples"]:
                seen.setdefault(tuple(lv), []).append(v)
    out: Snapshot = []
    samples: list[list[Any]]
    for name, fam in families.items():
        if fam["type"] == "histogram":
            samples = [
                [list(lv), [sum(c) for c in zip(*vs, strict=True)]]
                for lv, vs in values[name].items()
            ]
        else:
            how: Any = _MERGE[fam.get("merge", "sum")] if fam["type"] == "gauge" else sum
            samples = [[list(lv), float(how(vs))] for lv, vs in values[name].items()]
        out.append({**fam, "samples": samples})
    return out


def merge_requests(per_worker: list[list[dict[str, Any]]], limit: int) -> list[dict[str, Any]]:
    """The ``limit`` most recent requests over all workers, newest first (each worker's
    list is newest first already; ``received`` is the wall-clock time of arrival)."""
    every = [r for rs in per_worker for r in rs]
    every.sort(key=lambda r: float(r.get("received") or 0.0), reverse=True)
    return every[:limit]


def merge_state(per_worker: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``/v1/pdctl/state`` from every worker's (first worker first)."""
    if not per_worker:
        raise ValueError("no worker answered")
    first = per_worker[0]
    out = {k: v for k, v in first.items() if k != "instances"}
    instances: list[dict[str, Any]] = []
    for i, inst in enumerate(first["instances"]):
        views = [w["instances"][i] for w in per_worker if len(w["instances"]) > i]
        instances.append(
            {
                **inst,
                "healthy": all(v["healthy"] for v in views),
                "in_flight": sum(int(v["in_flight"]) for v in views),
                "breaker": max((v["breaker"] for v in views), key=_BREAKER_RANK.__getitem__),
                "workers": [
                    {"healthy": v["healthy"], "in_flight": v["in_flight"], "breaker": v["breaker"]}
                    for v in views
                ],
            }
        )
    out["instances"] = instances
    preds = [w["predictor"] for w in per_worker if isinstance(w.get("predictor"), dict)]
    if preds:  # each worker learns its own models: all of them, the first's as "pairs"
        out["predictor"] = {**preds[0], "workers": [p.get("pairs", []) for p in preds]}
    adm = [w["admission"] for w in per_worker if isinstance(w.get("admission"), dict)]
    if adm and adm[0].get("enabled"):
        counts = ("queued", "in_prefill", "in_flight")
        out["admission"] = {**adm[0], **{k: sum(int(a.get(k, 0)) for a in adm) for k in counts}}
    return out
