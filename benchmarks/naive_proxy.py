"""A naive sequential P/D proxy (FastAPI + httpx), the baseline of router_overhead.py.

What a quick proxy looks like: prefill first, then decode with prefill's
kv_transfer_params, one shared httpx.AsyncClient. Written for the benchmark only.

    python benchmarks/naive_proxy.py --prefill URL --decode URL --port N
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


def make_app(prefill: str, decode: str) -> FastAPI:
    app = FastAPI()
    client = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=256))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        rid = uuid.uuid4().hex
        headers = {"X-Request-Id": rid}
        pbody = dict(
            body,
            max_tokens=1,
            stream=False,
            kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False},
        )
        p = await client.post(prefill + "/v1/completions", json=pbody, headers=headers)
        dbody = dict(body, kv_transfer_params=p.json().get("kv_transfer_params"))
        if body.get("stream"):
            req = client.build_request(
                "POST", decode + "/v1/completions", json=dbody, headers=headers
            )
            r = await client.send(req, stream=True)

            async def relay() -> AsyncIterator[bytes]:
                async for chunk in r.aiter_raw():
                    yield chunk
                await r.aclose()

            return StreamingResponse(relay(), media_type="text/event-stream")
        d = await client.post(decode + "/v1/completions", json=dbody, headers=headers)
        return JSONResponse(d.json(), status_code=d.status_code)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", required=True)
    ap.add_argument("--decode", required=True)
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    uvicorn.run(make_app(a.prefill, a.decode), host="127.0.0.1", port=a.port, log_level="warning")
