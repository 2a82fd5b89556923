"""Where pdctl's router differs from vllm-router on substance (not speed), shown on mocks.

For each router, fresh, in front of a mock prefill that takes ``--prefill-ms`` to answer:

* is the decode leg sent before prefill answers — on the first request, and after?
* does the decode leg carry ``pp_size`` (without it a pipeline-parallel prefill
  silently leaves layers unwritten)?
* when the prefill "restarts" with a new engine id, is the request whose prefill answer
  reveals it re-sent to decode with the live engine (a decode registered with the dead
  engine waits until the client times out), and does the next request name it?

    python benchmarks/router_contract.py [--vllm-router PATH] [--out router_contract.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _bench import find_vllm_router, free_port, pdctl_router_argv, vllm_router_argv

from pdctl.sdk.router.httpclient import Pool
from pdctl.sdk.router.mock import MockConfig, MockServer

BODY = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 4}).encode()


async def send(url: str) -> int:
    pool = Pool(url)
    r = await pool.request("POST", "/v1/completions", BODY, [("Content-Type", "application/json")])
    await r.read()
    pool.close()
    return r.status


async def wait_up(url: str) -> None:
    for _ in range(150):
        try:
            pool = Pool(url)
            r = await pool.request("GET", "/health")
            await r.read()
            pool.close()
            if r.status == 200:
                return
        except Exception:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} never became healthy")


async def check(name: str, argv_for: Any, prefill_ms: float) -> dict[str, Any]:
    pm = await MockServer(
        MockConfig(role="prefill", engine_id="prefill-0", delay_s=prefill_ms / 1000)
    ).start()
    dm = await MockServer(MockConfig(role="decode")).start()
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *argv_for(pm.url, dm.url, port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_up(url)
        out: dict[str, Any] = {"router": name}

        def legs() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            # only the disaggregated legs (routers may send their own health-check requests)
            return (
                [r for r in pm.state.requests if "kv_transfer_params" in r["body"]],
                [r for r in dm.state.requests if "kv_transfer_params" in r["body"]],
            )

        for i in range(2):
            status = await send(url)
            ps, ds = legs()
            p, d = ps[-1], ds[-1]
            out[f"request{i + 1}"] = {
                "status": status,
                "decode_sent_before_prefill_done": d["at"] < p["at"] + prefill_ms / 2000,
                "decode_sent_after_prefill_sent_ms": round((d["at"] - p["at"]) * 1000, 1),
            }
        ktp = legs()[1][-1]["body"]["kv_transfer_params"]
        out["decode_params_have_pp_size"] = "pp_size" in ktp
        pm.config.engine_id = "prefill-0-restarted"
        await send(url)  # the first answer that shows the new identity
        rid = legs()[0][-1]["request_id"]
        out["restart_request_decode_legs_named"] = [
            r["body"]["kv_transfer_params"].get("remote_engine_id")
            for r in legs()[1]
            if r["request_id"] == rid
        ]
        await send(url)
        out["after_restart_decode_names"] = legs()[1][-1]["body"]["kv_transfer_params"].get(
            "remote_engine_id"
        )
        return out
    finally:
        proc.terminate()
        await proc.wait()
        await pm.stop()
        await dm.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill-ms", type=float, default=200)
    ap.add_argument("--vllm-router", default=None)
    ap.add_argument("--out", default="router_contract.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pdctl-contract-"))

    def pdctl_argv(p: str, d: str, port: int) -> list[str]:
        return pdctl_router_argv(p, d, port, tmp)

    async def run() -> list[dict[str, Any]]:
        rows = [await check("pdctl", pdctl_argv, args.prefill_ms)]
        vr = find_vllm_router(args.vllm_router)
        if vr:
            rows.append(
                await check(
                    "vllm-router",
                    lambda p, d, port: vllm_router_argv(vr, p, d, port),
                    args.prefill_ms,
                )
            )
        return rows

    rows = asyncio.run(run())
    for r in rows:
        print(json.dumps(r))
    Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
