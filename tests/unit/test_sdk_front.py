"""The SDK's front door: one import, the quickstart type-checks, RouterClient (sync and
async) against the real router app over mock workers, typed metrics, the tiny-model
builder's errors and the one router-URL helper."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import httpx
import pytest

from pdctl.sdk.router.mock import MockConfig
from pdctl.sdk.router.results import Chunk, Completion, RequestTimeline
from tests.unit.test_launcher import fake_python, make_spec, state_root
from tests.unit.test_router import rig

__all__ = ["fake_python", "state_root"]  # fixtures shared with the launcher tests

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "sdk_quickstart.py"


@pytest.fixture(scope="module")
def event_loop_policy() -> asyncio.AbstractEventLoopPolicy:
    """The router app runs on uvloop (as in production and in test_router)."""
    import uvloop

    policy: asyncio.AbstractEventLoopPolicy = uvloop.EventLoopPolicy()
    return policy


# ---------------------------------------------------------------------- the front door


def test_front_door_names_resolve_and_all_matches_exports():
    import pdctl.sdk as sdk

    for name in ("Fleet", "AsyncFleet", "RouterClient", "FleetMonitor", "Snapshot"):
        assert name in sdk.__all__
    for name in sdk.__all__:
        assert getattr(sdk, name) is not None
    assert set(sdk.__all__) - {"__version__"} == set(sdk._EXPORTS)
    from pdctl.sdk.fleet import AsyncFleet, Fleet

    assert sdk.Fleet is Fleet
    assert sdk.AsyncFleet is AsyncFleet


def test_readme_and_docs_show_the_quickstart_as_it_is():
    script = QUICKSTART.read_text()
    for doc in (ROOT / "README.md", ROOT / "docs" / "sdk.md"):
        assert f"```python\n{script}```" in doc.read_text(), doc


def test_quickstart_uses_only_pdctl_sdk_and_passes_mypy_strict(monkeypatch: pytest.MonkeyPatch):
    from mypy import api

    # the SDK is typed for users' type checkers (PEP 561), and checked here from source
    assert (ROOT / "sdk" / "pdctl" / "sdk" / "py.typed").is_file()
    monkeypatch.chdir(ROOT)  # pyproject's mypy_path is relative to the working directory

    text = QUICKSTART.read_text()
    imports = [ln for ln in text.splitlines() if ln.startswith(("import ", "from "))]
    assert imports == ["from pdctl.sdk import Fleet"]
    assert len([ln for ln in text.splitlines() if ln.strip()]) <= 10
    out, err, rc = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--strict",
            "--follow-imports=silent",
            "--no-incremental",
            str(QUICKSTART),
        ]
    )
    assert rc == 0, out + err
    assert "Success" in out


# ---------------------------------------------------------------------- RouterClient


async def test_router_client_completes_streams_and_reads_timelines():
    from pdctl.sdk import RouterClient

    async with rig("push") as t:

        def script() -> tuple[Completion, Completion, list[Chunk], list[RequestTimeline]]:
            with RouterClient(t.url) as router:
                done = router.complete("hello world", max_tokens=4)
                chat = router.chat([{"role": "user", "content": "hi"}], max_tokens=4)
                chunks = list(router.stream("hello world", max_tokens=4))
                return done, chat, chunks, router.requests(limit=10)

        done, chat, chunks, reqs = await asyncio.to_thread(script)
    assert done.text == "echo:hello world"
    assert done.completion_tokens == 4
    assert done.finish_reason == "length"
    assert chat.text.startswith("echo:")
    assert [c.text for c in chunks] == [" t0", " t1", " t2", " t3"]
    assert len(reqs) == 3
    newest = reqs[0]
    assert newest.stream
    assert newest.outcome == "ok"
    assert (newest.prefill, newest.decode) == ("prefill-0", "decode-0")
    assert newest.ttft_ms is not None
    assert newest.ttft_ms > 0
    assert reqs[2].path == "/v1/completions"
    assert not reqs[2].stream


async def test_router_client_switches_mode_drains_and_resumes():
    from pdctl.sdk import RouterClient

    async with rig("push") as t:

        def script() -> tuple[str, str, bool, bool]:
            router = RouterClient(t.url)
            before = router.mode
            router.mode = "push-sequential"
            drained = router.drain("decode-0").instance("decode-0").drained
            router.wait_drained("decode-0", poll_s=0.01)
            resumed = router.resume("decode-0").instance("decode-0").drained
            after = router.mode
            router.close()
            return before, after, drained, resumed

        assert await asyncio.to_thread(script) == ("push", "push-sequential", True, False)


async def test_router_client_errors_name_status_and_message():
    from pdctl.sdk import RouterClient, RouterError

    async with rig("push", api_key=b"sekret") as t:

        def refused() -> RouterError:
            with pytest.raises(RouterError) as e:
                RouterClient(t.url).complete("hi")
            return e.value

        err = await asyncio.to_thread(refused)
        assert err.status == 401
        assert "API key" in err.message
        assert "401" in str(err)
        assert "/v1/completions" in str(err)

        def unknown() -> RouterError:
            with pytest.raises(RouterError) as e:
                RouterClient(t.url, api_key="sekret").drain("nope")
            return e.value

        err = await asyncio.to_thread(unknown)
        assert err.status == 404
        assert "no instance named 'nope'" in err.message
        ok = await asyncio.to_thread(
            lambda: RouterClient(t.url, api_key="sekret").complete("hi", max_tokens=2).text
        )
        assert ok == "echo:hi"
    with pytest.raises(RouterError, match="cannot reach the router") as e:
        RouterClient("http://127.0.0.1:9").state()
    assert e.value.status is None
    with pytest.raises(ValueError, match="http://"):
        RouterClient("127.0.0.1:8000")


async def test_async_router_client_is_the_same_client_awaited():
    from pdctl.sdk import AsyncRouterClient, RouterError

    slow = MockConfig(role="prefill", engine_id="prefill-0", delay_s=0.3)
    async with rig("push", prefill=slow) as t, AsyncRouterClient(t.url) as router:
        assert (await router.complete("hello", max_tokens=3)).text == "echo:hello"
        chunks = [c.text async for c in router.stream(messages=[{"role": "user", "content": "x"}])]
        assert chunks
        assert all(c.startswith(" t") for c in chunks)
        assert await router.get_mode() == "push"
        assert (await router.set_mode("push-sequential")).mode == "push-sequential"
        pending = asyncio.create_task(router.complete("slow one"))
        for _ in range(100):  # wait for the prefill leg to be in flight
            if (await router.state()).instance("prefill-0").in_flight:
                break
            await asyncio.sleep(0.02)
        await router.drain("prefill-0")
        with pytest.raises(RouterError, match=r"1 request\(s\) in flight"):
            await router.wait_drained("prefill-0", timeout_s=0.05, poll_s=0.01)
        assert (await router.wait_drained("prefill-0", poll_s=0.01)).in_flight == 0
        assert (await pending).text == "echo:slow one"
        timelines = await router.requests(outcome="ok", instance="prefill-0")
        assert [(r.path, r.stream) for r in timelines] == [
            ("/v1/completions", False),
            ("/v1/chat/completions", True),
            ("/v1/completions", False),
        ]
        with pytest.raises(ValueError, match="exactly one"):
            [c async for c in router.stream()]


def test_router_client_over_a_mock_transport_sends_the_key_and_reads_errors():
    from pdctl.sdk import RouterClient, RouterError

    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/pdctl/mode":
            return httpx.Response(
                400,
                json={"error": {"message": "mode 'pull' is not available", "type": "x"}},
            )
        return httpx.Response(200, json={"mode": "push", "modes": ["push"], "instances": []})

    router = RouterClient("http://r:1/", api_key="k", transport=httpx.MockTransport(handler))
    assert router.mode == "push"
    with pytest.raises(RouterError) as e:
        router.mode = "pull"
    assert (e.value.status, e.value.message) == (400, "mode 'pull' is not available")
    assert [str(r.url) for r in seen] == ["http://r:1/v1/pdctl/state", "http://r:1/v1/pdctl/mode"]
    assert all(r.headers["authorization"] == "Bearer k" for r in seen)


def test_sse_lines_become_chunks():
    from pdctl.sdk.router.results import parse_sse_line

    assert parse_sse_line("") is None
    assert parse_sse_line(": keep-alive") is None
    assert parse_sse_line("data: [DONE]") is None
    c = parse_sse_line('data: {"choices": [{"delta": {"content": "hi"}, "finish_reason": null}]}')
    assert c is not None
    assert (c.text, c.finish_reason) == ("hi", None)
    c = parse_sse_line('data: {"choices": [{"text": " x", "finish_reason": "stop"}]}')
    assert c is not None
    assert (c.text, c.finish_reason) == (" x", "stop")
    usage = parse_sse_line('data: {"choices": [], "usage": {"completion_tokens": 3}}')
    assert usage is not None
    assert usage.text == ""
    assert usage.raw["usage"]["completion_tokens"] == 3


# ---------------------------------------------------------------------- helpers


def test_router_url_has_one_helper():
    from pdctl.sdk import SpecError, load_demo_spec
    from pdctl.sdk.urls import http_url, router_url

    assert http_url("0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert http_url("::", 8000) == "http://127.0.0.1:8000"
    assert http_url("fe80::1", 8000) == "http://[fe80::1]:8000"
    assert http_url("10.0.0.2", 81) == "http://10.0.0.2:81"
    loaded = load_demo_spec("/m", ["router.port=9123", "router.host=0.0.0.0"])
    assert loaded.router_url == "http://127.0.0.1:9123"
    spec = loaded.spec.model_copy(update={"router": None})
    with pytest.raises(SpecError) as e:
        router_url(spec)
    assert e.value.problems[0].field == "router"
    assert "[router]" in e.value.problems[0].fix


def test_tiny_model_builder_failure_names_the_missing_extra(tmp_path: Path):
    from pdctl.sdk import LaunchError, ensure_tiny_model

    fake = tmp_path / "python"
    fake.write_text(
        textwrap.dedent(
            """\
            #!/bin/sh
            echo "ModuleNotFoundError: No module named 'torch'" >&2
            exit 1
            """
        )
    )
    fake.chmod(0o755)
    with pytest.raises(LaunchError, match=r"pdctl\[cpu\]"):
        ensure_tiny_model(tmp_path / "m", python=str(fake))
    (tmp_path / "broken").write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    (tmp_path / "broken").chmod(0o755)
    with pytest.raises(LaunchError, match="boom"):
        ensure_tiny_model(tmp_path / "m", python=str(tmp_path / "broken"))


def test_tiny_model_is_reused_without_running_the_builder(tmp_path: Path):
    from pdctl.sdk import ensure_tiny_model
    from pdctl.sdk.paths import TINY_FORMAT, TINY_MARKER

    (tmp_path / TINY_MARKER).write_text(f'{{"format": {TINY_FORMAT}}}')
    (tmp_path / "config.json").write_text("{}")
    assert ensure_tiny_model(tmp_path, python="/nonexistent/python") == tmp_path


# ---------------------------------------------------------------------- Fleet facade


def test_sync_fleet_stops_restarts_snapshots_and_always_goes_down(
    fake_python: str, state_root: Path
):
    from pdctl.sdk import Fleet, SpecError, Summary
    from pdctl.sdk.fleet import read_state

    spec = make_spec(fake_python)  # no [router] table
    with Fleet(spec, grace=2, ready_timeout=60) as fleet:
        assert fleet.instance_names() == ["prefill-0", "decode-0"]
        snap = fleet.snapshot()
        assert isinstance(snap.summary, Summary)
        assert snap.summary.instances == 2
        assert [i.name for i in snap.instances] == ["prefill-0", "decode-0"]
        fleet.stop("decode-0")
        assert {s.name: s.state for s in fleet.status()}["decode-0"] == "stopped"
        fleet.restart("decode-0")
        assert {s.name: s.state for s in fleet.status()}["decode-0"] == "ready"
        with pytest.raises(SpecError) as e:
            _ = fleet.router
        assert e.value.problems[0].field == "router"
    assert read_state(state_root / "t") is None
