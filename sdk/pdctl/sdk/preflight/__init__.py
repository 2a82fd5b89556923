"""Topology preflight: what path KV will take between P and D, and whether disaggregation pays.

Pure core (text → model, model → verdicts) with thin I/O edges (:mod:`.inventory`). Entry
point: :func:`run_preflight` → :class:`PreflightReport` (``as_dict()`` is JSON-ready;
``expected_throughput_bps()`` feeds the fleet monitor's PA004 alert).
"""

from __future__ import annotations

from pdctl.sdk.preflight.inventory import PreflightInputError, collect_inventory
from pdctl.sdk.preflight.kvpath import PathClass
from pdctl.sdk.preflight.kvsize import KvLayout, ModelConfigError, kv_layout
from pdctl.sdk.preflight.model import GpuInfo, Inventory, NicInfo, Topology
from pdctl.sdk.preflight.report import PairResult, PreflightReport, PreflightWarning, Verdict
from pdctl.sdk.preflight.run import run_preflight
from pdctl.sdk.preflight.topo import parse_topo

__all__ = [
    "GpuInfo",
    "Inventory",
    "KvLayout",
    "ModelConfigError",
    "NicInfo",
    "PairResult",
    "PathClass",
    "PreflightInputError",
    "PreflightReport",
    "PreflightWarning",
    "Topology",
    "Verdict",
    "collect_inventory",
    "kv_layout",
    "parse_topo",
    "run_preflight",
]
