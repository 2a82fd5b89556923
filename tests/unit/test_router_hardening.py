"""The router against hostile clients on real loopback sockets: oversized and too many
headers, slowloris heads and bodies, silent and idle connections, a flood of connections,
deep JSON; TLS and mTLS with certificates made here; the supervisor's socket mode."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import ssl
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.sdk.spec import TlsSpec
from tests.unit.test_router import body, rig

HTTP = {
    "max_header_bytes": 4096,
    "max_headers": 20,
    "header_timeout_s": 0.5,
    "body_timeout_s": 0.5,
    "max_connections": 32,
    "max_json_depth": 16,
}


@pytest.fixture(scope="module")
def event_loop_policy() -> asyncio.AbstractEventLoopPolicy:
    import uvloop

    policy: asyncio.AbstractEventLoopPolicy = uvloop.EventLoopPolicy()
    return policy


async def raw(url: str, data: bytes, *, wait_s: float = 3.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the router closes it."""
    host, port = url.removeprefix("http://").split(":")
    r, w = await asyncio.open_connection(host, int(port))
    try:
        w.write(data)
        await w.drain()
        return await asyncio.wait_for(r.read(), wait_s)
    except ConnectionResetError:
        return b"<reset>"  # the router closed with our bytes unread: the kernel resets
    finally:
        w.close()


async def healthy(url: str) -> None:
    async with httpx.AsyncClient(timeout=1.0) as c:
        assert (await c.get(url + "/health")).status_code == 200


async def test_header_count_and_size_limits():
    async with rig("push", router={"http": HTTP}) as t:
        many = b"".join(b"x-h%d: v\r\n" % i for i in range(30))
        out = await raw(t.url, b"GET /health HTTP/1.1\r\nhost: x\r\n" + many + b"\r\n")
        assert out.startswith(b"HTTP/1.1 431")
        big = b"x-big: " + b"a" * 8000 + b"\r\n"
        out = await raw(t.url, b"GET /health HTTP/1.1\r\nhost: x\r\n" + big + b"\r\n")
        assert out.startswith(b"HTTP/1.1 431")
        out = await raw(t.url, b"GET /" + b"a" * 8000 + b" HTTP/1.1\r\nhost: x\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 431")
        # a head far beyond the limit in one write is refused before parsing all of it, and
        # the refusal reaches the client though most of its bytes were never read
        out = await raw(t.url, b"GET /health HTTP/1.1\r\nx: " + b"a" * 200_000)
        assert out.startswith(b"HTTP/1.1 431")
        ok = await raw(t.url, b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200")
        await healthy(t.url)


async def test_slowloris_head_and_silent_connection_are_closed():
    async with rig("push", router={"http": HTTP}) as t:
        host, port = t.url.removeprefix("http://").split(":")
        r, w = await asyncio.open_connection(host, int(port))
        w.write(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        reading = asyncio.create_task(r.read())
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        while not reading.done() and loop.time() - t0 < 5:
            # a byte of a header every 5 ms, never a whole head: bytes still arrive as the
            # refusal is sent, and the refusal must reach the client all the same
            w.write(b"x")
            await asyncio.sleep(0.005)
        got = await asyncio.wait_for(reading, 1)
        assert got.startswith(b"HTTP/1.1 408")
        assert loop.time() - t0 < 2.0  # header_timeout_s = 0.5
        w.close()
        silent = await raw(t.url, b"", wait_s=3.0)
        assert silent.startswith(b"HTTP/1.1 408")
        await healthy(t.url)


async def _keep_sending(w: asyncio.StreamWriter) -> None:
    while True:  # ignored while the router lingers, refused once it has closed
        w.write(b"x" * 1024)
        await w.drain()
        await asyncio.sleep(0.01)


async def test_a_refused_client_that_keeps_sending_is_cut_after_the_linger():
    from pdctl.sdk.router.httpproto import LINGER_S

    async with rig("push", router={"http": HTTP}) as t:
        host, port = t.url.removeprefix("http://").split(":")
        r, w = await asyncio.open_connection(host, int(port))
        w.write(b"GET /" + b"a" * 8000 + b" HTTP/1.1\r\n")
        got = await asyncio.wait_for(r.read(), 3)
        assert got.startswith(b"HTTP/1.1 431")  # answered, then its write side shut
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            await asyncio.wait_for(_keep_sending(w), LINGER_S + 3)
        w.close()
        await healthy(t.url)


async def test_slow_body_is_cut_and_never_routed():
    async with rig("push", router={"http": HTTP}) as t:
        head = (
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 500\r\n\r\n"
        )
        out = await raw(t.url, head + b'{"model": "tiny", ', wait_s=3.0)
        assert out.startswith(b"HTTP/1.1 408")
        assert t.p.state.requests == []
        assert t.d.state.requests == []
        await healthy(t.url)


async def test_a_shorter_deadline_after_a_longer_one_is_still_kept():
    # the connection's timer is armed for the 30 s head deadline; the body's 0.5 s
    # deadline comes after it and is due first
    async with rig("push", router={"http": {**HTTP, "header_timeout_s": 30}}) as t:
        head = (
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 500\r\n\r\n"
        )
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        out = await raw(t.url, head + b'{"model": "tiny", ', wait_s=5.0)
        assert out.startswith(b"HTTP/1.1 408")
        assert loop.time() - t0 < 3.0
        assert t.d.state.requests == []


async def test_each_request_on_a_kept_connection_gets_its_own_head_deadline():
    async with rig("push", router={"http": HTTP}) as t:
        host, port = t.url.removeprefix("http://").split(":")
        r, w = await asyncio.open_connection(host, int(port))
        loop = asyncio.get_running_loop()
        for _ in range(3):  # answered requests, each within its deadline, past the first's
            w.write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            got = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 2)
            assert got.startswith(b"HTTP/1.1 200")
            length = int(got.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await r.readexactly(length)
            await asyncio.sleep(0.3)
        w.write(b"GET /health HTTP/1.1\r\nhost: x\r\n")  # a head that never ends
        reading = asyncio.create_task(r.read())
        t0 = loop.time()
        while not reading.done() and loop.time() - t0 < 5:
            w.write(b"x")
            await asyncio.sleep(0.1)
        got = await asyncio.wait_for(reading, 1)
        assert got.startswith(b"HTTP/1.1 408")
        assert loop.time() - t0 < 2.0  # header_timeout_s = 0.5
        w.close()


async def _answer(r: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
    status, *lines = head[:-4].split(b"\r\n")
    fields = dict(line.split(b": ", 1) for line in lines)
    return status, fields, await r.readexactly(int(fields[b"content-length"]))


async def test_a_whole_answer_is_sent_in_one_step_as_uvicorn_would_and_the_connection_kept():
    async with rig("push", router={"http": HTTP}) as t:
        host, port = t.url.removeprefix("http://").split(":")
        r, w = await asyncio.open_connection(host, int(port))
        payload = json.dumps(body()).encode()
        req = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        for _ in range(3):  # one connection, kept
            w.write(req + b"content-length: %d\r\n\r\n" % len(payload) + payload)
            status, fields, answer = await _answer(r)
            assert status == b"HTTP/1.1 200 OK"
            assert fields[b"content-type"] == b"application/json"
            assert b"date" in fields
            assert fields[b"server"] == b"uvicorn"
            assert b"connection" not in fields
            assert b"transfer-encoding" not in fields
            assert json.loads(answer)["choices"]
        w.write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")  # the ASGI way, same connection
        status, _, answer = await _answer(r)
        assert status == b"HTTP/1.1 200 OK"
        assert json.loads(answer)["status"]
        # the client asks to close: the answer says so and the router closes
        w.write(req + b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload)
        status, fields, answer = await _answer(r)
        assert status == b"HTTP/1.1 200 OK"
        assert fields[b"connection"] == b"close"
        assert json.loads(answer)["choices"]
        assert await asyncio.wait_for(r.read(), 2) == b""
        w.close()
        assert len(t.d.state.requests) == 4


async def test_connection_flood_evicts_the_longest_idle_and_health_still_answers():
    async with rig("push", router={"http": {**HTTP, "header_timeout_s": 30}}) as t:
        host, port = t.url.removeprefix("http://").split(":")
        conns = [await asyncio.open_connection(host, int(port)) for _ in range(80)]
        await asyncio.sleep(0.2)
        await healthy(t.url)  # past the cap: the oldest idle ones made room
        closed = 0
        for r, _ in conns:
            try:
                data = await asyncio.wait_for(r.read(), 0.05)
                closed += data == b""
            except TimeoutError:
                pass
        assert closed >= 80 - 32
        for _, w in conns:
            w.close()


async def test_past_the_cap_with_every_connection_busy_the_refusal_reaches_the_client():
    async with rig("push", router={"http": {**HTTP, "header_timeout_s": 30}}) as t:
        host, port = t.url.removeprefix("http://").split(":")
        busy = []
        for _ in range(32):  # HTTP["max_connections"], each mid-head: busy, never evicted
            r, w = await asyncio.open_connection(host, int(port))
            w.write(b"GET /health HTTP/1.1\r\n")
            busy.append((r, w))
        await asyncio.sleep(0.2)
        # its request is in the router's socket, unread, when the router refuses it
        out = await raw(t.url, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n" + b"x" * 4000)
        assert out.startswith(b"HTTP/1.1 503")
        assert b"too many connections" in out
        for _, w in busy:
            w.close()
        await asyncio.sleep(0.2)
        await healthy(t.url)


@pytest.mark.parametrize("depth", [17, 100, 200_000])
async def test_deep_json_is_400_not_a_crash(depth):
    async with rig("push", router={"http": HTTP}) as t, httpx.AsyncClient() as c:
        deep = '{"model": "tiny", "prompt": "x", "x": ' + "[" * depth + "]" * depth + "}"
        r = await c.post(
            t.url + "/v1/completions", content=deep, headers={"content-type": "application/json"}
        )
        assert r.status_code == 400
        assert "nests deeper than 16" in r.json()["error"]["message"]
        ok = await c.post(t.url + "/v1/completions", json=body(x=[[[1]]]))
        assert ok.status_code == 200


# ---------------------------------------------------------------- TLS


def _certs(tmp: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(stem: str, key: Any, cert: x509.Certificate) -> None:
        (tmp / f"{stem}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        (tmp / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("pdctl test CA"))
        .issuer_name(name("pdctl test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    write("ca", ca_key, ca)

    def leaf(cn: str, usage: Any, san: list[Any] | None) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        b = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        write(cn, key, b.sign(ca_key, hashes.SHA256()))

    leaf(
        "server",
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    leaf("ops", ExtendedKeyUsageOID.CLIENT_AUTH, None)
    return {k: str(tmp / k) for k in ("ca.pem", "server.pem", "server.key", "ops.pem", "ops.key")}


def _client_ctx(files: dict[str, str], cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=files["ca.pem"])
    if cert:
        ctx.load_cert_chain(files["ops.pem"], files["ops.key"])
    return ctx


async def test_tls_serves_https_with_a_real_certificate(tmp_path):
    f = _certs(tmp_path)
    tls = {"cert_file": f["server.pem"], "key_file": f["server.key"]}
    async with rig("push", router={"tls": tls}) as t:
        url = t.url.replace("http://", "https://")
        async with httpx.AsyncClient(verify=_client_ctx(f, cert=False)) as c:
            assert (await c.post(url + "/v1/completions", json=body())).status_code == 200
        async with httpx.AsyncClient(verify=ssl.create_default_context()) as c:
            with pytest.raises(httpx.ConnectError):  # not signed by anything it trusts
                await c.get(url + "/health")
        out = await raw(t.url, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert not out.startswith(b"HTTP/1.1 200")  # no plaintext answer on the TLS port


async def test_mtls_guards_the_control_endpoints_only(tmp_path):
    f = _certs(tmp_path)
    env = {"K_ADMIN": "adm-1d2c3b4a"}
    router = {
        "tls": {
            "cert_file": f["server.pem"],
            "key_file": f["server.key"],
            "client_ca_file": f["ca.pem"],
        },
        "keys": [{"name": "ops", "role": "admin", "env": "K_ADMIN"}],
    }
    audit = tmp_path / "audit.jsonl"
    async with rig("push", router=router, environ=env, audit_path=str(audit)) as t:
        url = t.url.replace("http://", "https://")
        h = {"Authorization": f"Bearer {env['K_ADMIN']}"}
        mode = {"mode": "push"}
        async with httpx.AsyncClient(verify=_client_ctx(f, cert=False)) as c:
            assert (
                await c.post(url + "/v1/completions", json=body(), headers=h)
            ).status_code == 200
            r = await c.post(url + "/v1/pdctl/mode", json=mode, headers=h)
            assert r.status_code == 403
            assert "client certificate" in r.json()["error"]["message"]
        async with httpx.AsyncClient(verify=_client_ctx(f, cert=True)) as c:
            assert (await c.post(url + "/v1/pdctl/mode", json=mode, headers=h)).status_code == 200
            # the certificate alone is not enough: the admin key is still needed
            assert (await c.post(url + "/v1/pdctl/mode", json=mode)).status_code == 401
    reasons = [
        json.loads(x).get("detail", {}).get("reason") for x in audit.read_text().splitlines()
    ]
    assert "client_cert" in reasons


async def test_pdctls_clients_speak_tls_with_a_ca_bundle_and_verify_by_default(tmp_path):
    from pdctl.sdk.client import AsyncRouterClient, RouterClient
    from pdctl.sdk.errors import RouterError

    f = _certs(tmp_path)
    tls = {"cert_file": f["server.pem"], "key_file": f["server.key"]}
    async with rig("push", router={"tls": tls}) as t:
        url = t.url.replace("http://", "https://")
        for pool in (True, False):
            async with AsyncRouterClient(url, verify=f["ca.pem"], pool=pool) as c:
                assert (await c.state()).mode == "push"
                assert (await c.complete("x", max_tokens=2)).text
        # by default the certificate is checked against the system's CAs: refused
        async with AsyncRouterClient(url) as c:
            with pytest.raises(RouterError, match="CERTIFICATE_VERIFY_FAILED"):
                await c.state()

        def blocking() -> str:
            with RouterClient(url, verify=f["ca.pem"]) as c:
                return c.state().mode

        assert await asyncio.to_thread(blocking) == "push"
    with pytest.raises(ValueError, match="cannot load the CA bundle"):
        AsyncRouterClient("https://127.0.0.1:1", verify=str(tmp_path / "missing.pem"))


async def test_unloadable_certificate_is_a_clear_start_error(tmp_path):
    from pdctl.sdk.router.server import RouterStartError, serve

    (tmp_path / "bad.pem").write_text("not a certificate")
    tls = {"cert_file": str(tmp_path / "bad.pem"), "key_file": str(tmp_path / "bad.pem")}
    async with rig("push") as t:
        app = t.app
        settings = app.router.settings.model_copy(update={"tls": TlsSpec(**tls)})
        app.router.settings = settings
        with pytest.raises(RouterStartError, match=r"router\.tls"):
            await asyncio.to_thread(serve, app, "127.0.0.1", 1)


async def test_supervisor_control_socket_is_0600_and_survives_hostile_clients(tmp_path):
    from pdctl.sdk.fleet import control

    async def handler(req: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    path = tmp_path / "control.sock"
    old = os.umask(0o000)  # even under a permissive umask
    try:
        server = await control.serve(path, handler)
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        r, w = await asyncio.open_unix_connection(str(path))
        w.write(b"x" * (control.MAX_LINE + 10))  # no newline, over the line limit
        await w.drain()
        assert await asyncio.wait_for(r.read(), 3) == b""  # closed, nothing answered
        w.close()
        reply = await asyncio.to_thread(control.request, path, {"cmd": "ping"}, 3.0)
        assert reply == {"ok": True}
    finally:
        server.close()


def test_open_files_limit_is_raised_and_a_too_low_one_is_named():
    import resource

    from pdctl.sdk.router.hardening import FDS_PER_CONNECTION, FDS_SPARE, open_files_for

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fits = max(1, (min(soft, hard) - FDS_SPARE) // FDS_PER_CONNECTION)
    assert open_files_for(fits) is None
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard  # soft raised to hard
    if hard == resource.RLIM_INFINITY:
        return
    warning = open_files_for(hard)  # three descriptors per connection cannot fit
    assert warning is not None
    assert "router.http.max_connections" in warning
    assert str(hard) in warning


def test_a_whole_answer_lets_its_request_go_and_leaves_the_odd_ones_to_asgi():
    """The answer sent, the object the scope holds no longer holds the request (no
    reference cycle per request for the collector); a header uvicorn acts on, or an
    answer already started, goes the ASGI way with nothing written."""
    from types import SimpleNamespace

    from pdctl.sdk.router.httpproto import _HeadWithBody

    written: list[bytes] = []
    transport = SimpleNamespace(write=written.append, close=lambda: None)

    def cycle() -> SimpleNamespace:
        return SimpleNamespace(
            response_started=False,
            disconnected=False,
            flow=SimpleNamespace(write_paused=False),
            access_log=False,
            scope={"method": "POST"},
            default_headers=[(b"server", b"uvicorn")],
            keep_alive=True,
            message_event=asyncio.Event(),
            on_response=lambda: None,
        )

    c = cycle()
    out = _HeadWithBody(transport, c, None)  # type: ignore[arg-type]
    c.transport = out
    assert out.answer(200, [(b"Content-Type", b"application/json")], b"{}")
    assert written == [
        b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-type: application/json\r\n"
        b"content-length: 2\r\n\r\n{}"
    ]
    assert c.response_complete
    assert c.transport is transport
    assert out._cycle is None
    assert not out.answer(200, [], b"{}")  # once
    written.clear()
    for headers in ([(b"Content-Length", b"2")], [(b"x", b"a\nb")], [(b"connection", b"close")]):
        c = cycle()
        assert not _HeadWithBody(transport, c, None).answer(200, headers, b"{}")
        assert not c.response_started
    assert written == []
