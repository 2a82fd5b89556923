"""The router client (pdctl.sdk.client): the blocking and asyncio twins against the real
router app over mock workers, the same method names on both, streams that close and
read SSE as the standard says (a real local HTTP server sending vLLM-shaped events with
U+2028, U+2029 and U+0085), and a client that imports nothing of the router server."""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from pdctl.sdk.client import AsyncRouterClient, Chunk, Completion, RequestTimeline, RouterClient
from pdctl.sdk.router.mock import MockConfig
from tests.unit.test_router import rig


@pytest.fixture(scope="module")
def event_loop_policy() -> asyncio.AbstractEventLoopPolicy:
    """The router app runs on uvloop (as in production and in test_router)."""
    import uvloop

    policy: asyncio.AbstractEventLoopPolicy = uvloop.EventLoopPolicy()
    return policy


# ---------------------------------------------------------------------- one API, two twins


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        n: inspect.signature(f)
        for n, f in inspect.getmembers(cls, inspect.isfunction)
        if not n.startswith("_")
    }


def test_the_twins_have_the_same_methods_with_the_same_parameters():
    sync, aio = _public(RouterClient), _public(AsyncRouterClient)
    assert sync.pop("close").parameters.keys() == aio.pop("aclose").parameters.keys()
    assert sync.keys() == aio.keys()
    assert {"complete", "chat", "stream", "requests", "state", "get_mode", "set_mode"} <= set(sync)
    assert {"set_policy", "drain", "resume", "notify", "wait_drained", "run"} <= set(sync)
    for name in sync:
        assert list(sync[name].parameters) == list(aio[name].parameters), name
        f = getattr(AsyncRouterClient, name)
        assert inspect.iscoroutinefunction(f) == (name != "stream"), name
    init_s = inspect.signature(RouterClient.__init__).parameters
    init_a = inspect.signature(AsyncRouterClient.__init__).parameters
    assert set(init_s) == set(init_a) - {"pool"}


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
            before = router.get_mode()
            router.set_mode("push-sequential")
            drained = router.drain("decode-0").instance("decode-0").drained
            router.wait_drained("decode-0", poll_s=0.01)
            resumed = router.resume("decode-0").instance("decode-0").drained
            after = router.get_mode()
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
    assert router.get_mode() == "push"
    with pytest.raises(RouterError) as e:
        router.set_mode("pull")
    assert (e.value.status, e.value.message) == (400, "mode 'pull' is not available")
    assert [str(r.url) for r in seen] == ["http://r:1/v1/pdctl/state", "http://r:1/v1/pdctl/mode"]
    assert all(r.headers["authorization"] == "Bearer k" for r in seen)


async def test_notify_and_set_policy_are_client_operations():
    from pdctl.sdk import RouterError

    async with rig("push", health_interval_s=30) as t:

        def script() -> tuple[bool, bool, str]:
            with RouterClient(t.url) as router:
                down = router.notify("decode-0", "down").instance("decode-0").healthy
                up = router.notify("decode-0", "up").instance("decode-0").healthy
                with pytest.raises(RouterError) as e:
                    router.set_policy("cache_aware")
                return down, up, e.value.message

        down, up, refusal = await asyncio.to_thread(script)
        assert (down, up) == (False, True)
        assert "cache_aware needs" in refusal
        async with AsyncRouterClient(t.url) as router:
            assert not (await router.notify("prefill-0", "down")).instance("prefill-0").healthy
            assert (await router.notify("prefill-0", "up")).instance("prefill-0").healthy


async def test_set_admission_is_a_client_operation():
    from pdctl.sdk import RouterError

    async with rig("push") as t:
        async with AsyncRouterClient(t.url) as router:
            st = await router.set_admission(max_queued=9, max_kv_usage=0.5)
            assert (st.admission["max_queued"], st.admission["max_kv_usage"]) == (9, 0.5)
            with pytest.raises(RouterError) as e:
                await router.set_admission(max_queued=-1)
            assert "max_queued" in e.value.message
            assert (await router.state()).admission["max_queued"] == 9

        def script() -> int:
            with RouterClient(t.url) as router:
                return int(router.set_admission(max_queued=3).admission["max_queued"])

        assert await asyncio.to_thread(script) == 3


async def test_leaving_a_stream_early_closes_its_connection():
    slow = MockConfig(role="decode", chunk_delay_s=0.2)
    async with rig("push", decodes=[slow]) as t:
        async with AsyncRouterClient(t.url) as router:
            async with router.stream("hello world", max_tokens=50) as chunks:
                first = await anext(chunks)
            assert first.text == " t0"
            for _ in range(200):  # the router sees the client hang up
                reqs = await router.requests(limit=1)
                if reqs and reqs[0].outcome != "running":
                    break
                await asyncio.sleep(0.05)
            assert reqs[0].outcome == "cancelled"

        def sync_script() -> str:
            with RouterClient(t.url) as r, r.stream("hello world", max_tokens=50) as s:
                return next(s).text

        assert await asyncio.to_thread(sync_script) == " t0"


# ---------------------------------------------------------------------- SSE by the standard

TEXTS = ["a\u2028b", "c\u2029d", "e\u0085f", "plain"]
"""What vLLM sends unescaped inside its JSON strings (pydantic's JSON keeps them raw)."""


def _vllm_events() -> bytes:
    out = b""
    for i, text in enumerate(TEXTS):
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
        if i == len(TEXTS) - 1:
            choice["finish_reason"] = "length"
        ev = {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [choice]}
        out += b"data: " + json.dumps(ev, ensure_ascii=False).encode() + b"\n\n"
    return out + b"data: [DONE]\n\n"


def _old_text(line: str) -> str | None:
    """What the client read from one line before it parsed by the standard."""
    try:
        return str(json.loads(line[5:])["choices"][0]["text"])
    except ValueError:
        return None


@asynccontextmanager
async def sse_server(payload: bytes, piece: int = 5) -> AsyncIterator[str]:
    """A real HTTP/1.1 server on loopback answering every POST with ``payload`` as an
    event stream, written ``piece`` bytes at a time."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(h.split(b":")[1])
                for h in head.split(b"\r\n")
                if h.lower().startswith(b"content-length:")
            ),
            0,
        )
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        )
        for i in range(0, len(payload), piece):
            writer.write(payload[i : i + piece])
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def test_streamed_text_keeps_u2028_u2029_u0085_from_a_real_server():
    async with sse_server(_vllm_events()) as url:
        # the old way of reading (httpx's line iterator) loses three events' text
        async with httpx.AsyncClient() as c, c.stream("POST", url, json={}) as r:
            lines = [ln async for ln in r.aiter_lines() if ln.startswith("data: {")]
        assert [_old_text(ln) for ln in lines] == [None, None, None, "plain"]
        async with AsyncRouterClient(url) as router:
            chunks = [c async for c in router.stream("x")]
        assert [c.text for c in chunks] == TEXTS
        assert chunks[-1].finish_reason == "length"

        def sync_read() -> list[str]:
            with RouterClient(url) as router:
                return [c.text for c in router.stream("x")]

        assert await asyncio.to_thread(sync_read) == TEXTS


async def test_the_load_generator_reads_the_same_text():
    from pdctl.sdk.bench.loadgen import stream_one
    from pdctl.sdk.bench.stats import RequestResult

    async with sse_server(_vllm_events(), piece=3) as url, httpx.AsyncClient() as c:
        result = RequestResult(index=0, prompt_tokens=1, sent_at=0.0)
        await stream_one(c, url, {"prompt": "x", "stream": True}, result, 10)
    assert result.error is None
    assert result.ok
    assert result.text == "".join(TEXTS)


# ---------------------------------------------------------------------- only a client


def test_importing_the_client_loads_no_router_server_module():
    code = (
        "import sys\n"
        "import pdctl.sdk.client\n"
        "from pdctl.sdk import RouterClient, AsyncRouterClient, Completion, Chunk\n"
        "from pdctl.sdk import RequestTimeline, RouterState, RouterError\n"
        "print([m for m in sys.modules if m.startswith('pdctl.sdk.router') or "
        "m.split('.')[0] in ('httptools', 'uvicorn', 'uvloop', 'pydantic')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_old_import_paths_warn_and_give_the_new_objects():
    import pdctl.sdk.client as client

    with pytest.warns(DeprecationWarning, match=r"moved to pdctl\.sdk\.client"):
        from pdctl.sdk.router.client import RouterClient as Old
    assert Old is client.RouterClient
    with pytest.warns(DeprecationWarning, match="pdctl.sdk.client.results"):
        from pdctl.sdk.router.results import RequestTimeline as OldTimeline
    assert OldTimeline is client.RequestTimeline
    with pytest.warns(DeprecationWarning, match="RouterError"):
        from pdctl.sdk.router.control import RouterControlError
    assert RouterControlError is client.RouterError
    with pytest.warns(DeprecationWarning, match="pdctl.sdk.apikey"):
        from pdctl.sdk.router.control import read_api_key
    from pdctl.sdk.apikey import read_api_key as new_reader

    assert read_api_key is new_reader
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # removed, not deprecated: no warning, an error
        with pytest.raises(ImportError, match="AsyncRouterClient"):
            from pdctl.sdk.router.control import RouterControl  # noqa: F401
