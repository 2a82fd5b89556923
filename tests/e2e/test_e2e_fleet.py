"""A real 1P1D vLLM-CPU push fleet: readiness, completions, real KV through NIXL, crash
detection and a clean teardown."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pdctl.sdk.fleet import Fleet, fleet_status, read_state
from pdctl.sdk.metrics import Sample, parse, total
from pdctl.sdk.pd import PrefillIdentity, push_request
from pdctl.sdk.shepherd import group_members
from tests.conftest import port_free
from tests.e2e.conftest import demo_spec, processes_mentioning, running_fleet

pytestmark = pytest.mark.e2e

NAME = "e2e-fleet"
PROMPTS = [
    "the router sends both legs at once while the prefill engine builds the cache",
    "quiet green servers move blocks across the fleet before the first token",
    "every decode request waits for a push from the prefill that matches its id and "
    "then the answer arrives early",
    "small fast models answer",
]


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    yield from running_fleet(demo_spec(tiny_model, NAME)[0])


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main", *args, "--fleet", NAME],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )


def test_both_instances_become_ready(fleet: Fleet):
    # the spec has a [router]: pdctl up supervises it like the engines
    assert [(s.name, s.state) for s in fleet.status()] == [
        ("prefill-0", "ready"),
        ("decode-0", "ready"),
        ("router", "ready"),
    ]
    r = cli("status", "--json")
    assert r.returncode == 0, r.stderr
    assert [i["state"] for i in json.loads(r.stdout)["instances"]] == ["ready"] * 3


def test_a_completion_on_each_instance(fleet: Fleet):
    for inst in fleet.fleet.plan.instances:
        r = httpx.post(
            f"{inst.url}/v1/completions",
            timeout=60,
            json={
                "model": "tiny",
                "prompt": PROMPTS[0],
                "max_tokens": 5,
                "temperature": 0,
                "ignore_eos": True,
            },
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5


async def _metrics(client: httpx.AsyncClient, url: str) -> list[Sample]:
    return parse((await client.get(url + "/metrics")).text)


def test_push_transfers_real_kv_and_matches_local_output(fleet: Fleet):
    """Disaggregated (KV pushed P→D through NIXL) greedy output == decode computing the
    prompt itself; the counters prove the KV really moved."""
    p, d = fleet.fleet.plan.instances
    ident = PrefillIdentity.from_plan(p)

    async def go() -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            pm0, dm0 = await _metrics(c, p.url), await _metrics(c, d.url)
            prompt_tokens = 0
            for prompt in PROMPTS:
                body = {
                    "model": "tiny",
                    "prompt": prompt,
                    "max_tokens": 12,
                    "temperature": 0,
                    "ignore_eos": True,
                }
                local = (await c.post(d.url + "/v1/completions", json=body)).json()
                pd = await push_request(c, p.url, d.url, ident, body)
                assert pd.text == local["choices"][0]["text"], prompt
                prompt_tokens += local["usage"]["prompt_tokens"]
            pm1, dm1 = await _metrics(c, p.url), await _metrics(c, d.url)
            moved = total(pm1, "vllm:nixl_bytes_transferred_sum") or 0
            moved -= total(pm0, "vllm:nixl_bytes_transferred_sum") or 0
            assert moved > 0
            key = ("vllm:prompt_tokens_by_source_total", {"source": "external_kv_transfer"})
            via_kv = (total(dm1, *key) or 0) - (total(dm0, *key) or 0)
            # every prompt token except the last is served from pushed KV
            assert via_kv >= prompt_tokens - len(PROMPTS)
            assert via_kv > 0

    asyncio.run(go())


def test_logs_from_another_shell(fleet: Fleet):
    r = cli("logs", "prefill-0", "-n", "400")
    assert r.returncode == 0
    assert "=== pdctl: starting prefill-0" in r.stdout
    assert "pdctl: NIXL agent created without its progress thread" in r.stdout


def test_sigkill_of_an_instance_is_reported_within_two_seconds(fleet: Fleet, state_root: Path):
    rec = read_state(state_root / NAME)
    assert rec is not None
    shepherd = rec.instances[1].shepherd_pid
    assert shepherd
    children = Path(f"/proc/{shepherd}/task/{shepherd}/children").read_text().split()
    api_server = int(children[0])
    t0 = time.monotonic()
    os.kill(api_server, signal.SIGKILL)
    while True:
        st = asyncio.run(fleet_status(NAME))
        # exited, then backoff once the supervisor has applied the restart policy
        if st.instances[1].state in ("exited", "backoff"):
            break
        assert time.monotonic() - t0 < 2, st.instances[1]
        time.sleep(0.05)
    assert st.instances[1].exit_code == 137
    assert st.instances[1].log_tail
    # the supervisor records why (within a second) and the restart policy starts it again
    for _ in range(20):
        r = cli("status", "--json")
        assert r.returncode == 1
        decode = json.loads(r.stdout)["instances"][1]
        if decode["last_failure"] is not None:
            break
        time.sleep(0.5)
    assert decode["state"] in ("exited", "backoff", "stopping", "starting"), decode
    assert decode["last_failure"] == "exited with code 137", decode


def test_down_leaves_no_process_and_frees_every_port(fleet: Fleet, state_root: Path):
    rec = read_state(state_root / NAME)
    assert rec is not None
    groups = [i.shepherd_pid for i in rec.instances if i.shepherd_pid]
    ports = [p for i in rec.instances for p in (i.http_port, *i.side_channel_ports)]
    fleet.down()
    assert not any(group_members(g) for g in groups)
    assert processes_mentioning(str(fleet.fleet.spec.model.path)) == []
    assert all(port_free(p) for p in ports), ports
    assert read_state(state_root / NAME) is None
