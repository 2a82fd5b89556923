"""The bench's printed table and TTFT ratios when the records compare router policies."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from pdctl.cli.cmd_bench import ratios, table


def rec(mode: str, policy: str | None, ttft: float, **kw: Any) -> dict[str, Any]:
    base = {"input_len": 512, "request_rate": "inf", "completed": 32, "failed": 0}
    return {**base, "mode": mode, "policy": policy, "median_ttft_ms": ttft, **kw}


def test_policies_are_arms_of_their_own():
    rs = ratios([rec("push", "least_loaded", 180.0), rec("push", "cache_aware", 90.0)])
    assert rs == [
        {
            "mode": "push/cache_aware",
            "vs": "push/least_loaded",
            "input_len": 512,
            "request_rate": "inf",
            "median_ttft_ratio": 0.5,
        }
    ]


def test_modes_alone_keep_their_names():
    rs = ratios([rec("push", "round_robin", 100.0), rec("pull", "round_robin", 150.0)])
    assert [(r["mode"], r["vs"], r["median_ttft_ratio"]) for r in rs] == [("pull", "push", 1.5)]


def test_table_names_the_policy_and_its_hit_rates():
    out = Console(width=200, record=True)
    out.print(
        table(
            [
                rec("push", "least_loaded", 180.0, prefill_prefix_hit_rate=0.8),
                rec("push", "cache_aware", 90.0, decode_alone_share=0.75),
            ]
        )
    )
    text = out.export_text()
    for word in ("policy", "least_loaded", "cache_aware", "hit P", "D alone", "0.80", "0.75"):
        assert word in text, word
    out = Console(width=200, record=True)
    out.print(table([rec("push", "round_robin", 100.0)]))
    assert "policy" not in out.export_text()
