"""Every ``vllm:*`` metric pdctl reads (monitor, dashboards, alerts) is one vLLM defines."""

from __future__ import annotations

from tests.contract.names import metric_names


def test_every_metric_pdctl_reads_exists(vllm):
    wanted = vllm["requests"]["metrics"]
    assert len(wanted) > 15
    where = metric_names()
    missing = [
        f"{n} (read by {', '.join(sorted(where[n]))})"
        for n, a in zip(wanted, vllm["answers"]["metrics"], strict=True)
        if not a["ok"]
    ]
    assert not missing, f"vLLM {vllm['version']} defines none of:\n" + "\n".join(missing)
