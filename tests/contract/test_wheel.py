"""A missing vLLM 0.33 wheel fails the tier with the command to fetch it (never a skip)."""

from __future__ import annotations

import pytest

from tests.contract.wheel import require_vllm033


def test_missing_wheel_fails_with_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("PDCTL_VLLM033_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(pytest.fail.Exception, match=r"pip download --no-deps vllm==0\.33\.0"):
        require_vllm033()
