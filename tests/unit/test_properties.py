"""Property: any valid spec plans unique ports per host and explicit engine ids."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from pdctl.sdk.fleetplan import build_plan, host_key
from pdctl.sdk.lint import lint
from pdctl.sdk.spec import FleetSpec

HOSTS = ["127.0.0.1", "localhost", "10.0.0.1", "10.0.0.2"]


@st.composite
def groups(draw, role: str):
    n = draw(st.integers(1, 3))
    out = []
    for _ in range(n):
        out.append(
            {
                "host": draw(st.sampled_from(HOSTS)),
                "count": draw(st.integers(1, 4)),
                "tp": draw(st.sampled_from([1, 2, 4])),
                "dp": draw(st.sampled_from([1, 2, 3])),
                "pp": 1 if role == "decode" else draw(st.sampled_from([1, 2])),
            }
        )
    return out


@st.composite
def specs(draw):
    mode = draw(st.sampled_from(["push", "pull"]))
    d = {
        "model": {"path": "org/m"},
        "fleet": {
            "mode": mode,
            "platform": draw(st.sampled_from(["gpu", "cpu"])),
            "block_size": draw(st.sampled_from([32, 64, 128])),
        },
        "prefill": draw(groups("prefill")),
        "decode": draw(groups("decode")),
    }
    if draw(st.booleans()):
        d["router"] = {
            "host": draw(st.sampled_from(HOSTS)),
            "port": draw(st.sampled_from([8000, 8100, 8200, 5600, 9000])),
        }
    return FleetSpec(**d)


@settings(max_examples=300, deadline=None)
@given(specs())
def test_ports_unique_and_engine_ids_explicit(spec):
    plan = build_plan(spec)
    used: Counter[tuple[str, int]] = Counter()
    if spec.router is not None:
        used[(host_key(spec.router.host), spec.router.port)] += 1
    for inst in plan.instances:
        for p in inst.ports():
            used[(host_key(inst.host), p)] += 1
    assert all(n == 1 for n in used.values()), [k for k, n in used.items() if n > 1]
    ids = [e for inst in plan.instances for e in inst.engine_ids]
    assert all(ids)
    assert len(ids) == len(set(ids))
    assert len(ids) == sum(i.dp for i in plan.instances)
    for inst in plan.instances:
        assert f'"engine_id":"{inst.engine_id}"' in " ".join(inst.argv)
    codes = {f.code for f in lint(spec, check_bound_ports=False).findings}
    assert not codes & {"PD001", "PD010", "PD011"}
