"""Every GPU ``vllm`` command pdctl renders parses with each vLLM's own parser."""

from __future__ import annotations

from tests.contract import commands


def test_every_rendered_gpu_argv_parses(vllm):
    argvs = vllm["requests"]["argv"]
    answers = vllm["answers"]["argv"]
    assert len(argvs) > commands.SWEEP
    rejected = [
        f"{' '.join(a[:3])} … ({len(a)} args): {r['error']}"
        for a, r in zip(argvs, answers, strict=True)
        if not r["ok"]
    ]
    assert not rejected, f"vLLM {vllm['version']} rejects:\n" + "\n".join(rejected[:10])
    with_ktc = [
        r for a, r in zip(argvs, answers, strict=True) if "--kv-transfer-config" in a and r["ok"]
    ]
    assert with_ktc
    assert all(r["kv_transfer_config"].startswith("KVTransferConfig(") for r in with_ktc)


def test_every_example_has_gpu_commands():
    for name, cmds in commands.example_commands().items():
        assert cmds, name
        assert all(c[:2] in (["vllm", "serve"], ["vllm", "launch"]) for c in cmds), name
