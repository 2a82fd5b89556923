"""The SDK must stay importable without UI or engine libraries."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_sdk_import_pulls_in_no_heavy_module():
    code = (
        "import sys, pdctl.sdk, pdctl.sdk.lint, pdctl.sdk.fleetplan, pdctl.sdk.specload\n"
        "from pdctl.sdk import Fleet, AsyncFleet, RouterClient, FleetMonitor, Snapshot\n"
        "print([m for m in sys.modules if m.split('.')[0] in "
        "('textual', 'vllm', 'nixl', 'torch', 'transformers') or "
        "m.startswith(('pdctl.tui', 'pdctl.cli', 'pdctl.connector'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_no_import_cycles_between_modules():
    """No module imports (directly or through others) a module that imports it back,
    type-checking imports included: each room's dependencies point one way."""
    grimp = pytest.importorskip("grimp")  # import-linter's graph library (dev extra)
    graph = grimp.build_graph("pdctl")
    cycles = sorted(
        {
            tuple(sorted((m, imp)))
            for m in graph.modules
            for imp in graph.find_modules_directly_imported_by(m)
            if imp.startswith("pdctl.")
            and graph.chain_exists(importer=imp, imported=m, as_packages=False)
        }
    )
    assert cycles == [], "\n".join(" <-> ".join(c) for c in cycles)
