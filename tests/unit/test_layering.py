"""The SDK must stay importable without UI or engine libraries."""

from __future__ import annotations

import subprocess
import sys


def test_sdk_import_pulls_in_no_heavy_module():
    code = (
        "import sys, pdctl.sdk, pdctl.sdk.lint, pdctl.sdk.render, pdctl.sdk.specload\n"
        "print([m for m in sys.modules if m.split('.')[0] in "
        "('textual', 'vllm', 'nixl', 'torch', 'transformers')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
