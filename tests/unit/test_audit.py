# ruff: noqa: E501  (the /proc tables are quoted as the kernel writes them)
"""pdctl audit's pure parts on fake listener sets: the /proc tables, attribution to the
fleet's processes, the plan reconciled with the OS, the verdicts, and the probes against
answers recorded in httpx.MockTransport."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from pdctl.sdk.audit import Answer, Listener, audit_plan, judge
from pdctl.sdk.audit.expected import planned, reconcile
from pdctl.sdk.audit.probe import probe_router, probe_vllm
from pdctl.sdk.audit.sockets import (
    OsListener,
    Socket,
    attribute,
    descendants,
    listening,
    parse_proc_net_tcp,
)
from pdctl.sdk.fleetplan import build_plan
from pdctl.sdk.spec import FleetSpec

HEAD = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
TCP = HEAD + (
    # 127.0.0.1:8100 LISTEN, 192.0.2.2:55891 LISTEN, an established one (01), a short line
    "   0: 0100007F:1FA4 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0\n"
    "   1: 0202000C:DA53 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1 0 100 0 0 10 0\n"
    "   2: 0100007F:1FA4 0100007F:D000 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0 100 0 0 10 0\n"
    "   3: garbage\n"
)
TCP6 = HEAD + (
    # [::]:8000 and [::1]:5600
    "   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 444 1 0 100 0 0 10 0\n"
    "   1: 00000000000000000000000001000000:15E0 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 555 1 0 100 0 0 10 0\n"
)


def test_proc_net_tcp_tables_parse_as_ss_shows_them() -> None:
    assert parse_proc_net_tcp(TCP) == [
        Socket("127.0.0.1", 8100, 111),
        Socket("12.0.2.2", 55891, 222),
    ]
    assert parse_proc_net_tcp(TCP6) == [Socket("::", 8000, 444), Socket("::1", 5600, 555)]


def test_proc_address_words_are_little_endian() -> None:
    # 192.0.2.2 is C0000202 in network order; the table holds the word as the host does
    (s,) = parse_proc_net_tcp(HEAD + TCP.splitlines()[2].replace("0202000C", "020200C0") + "\n")
    assert s.host == "192.0.2.2"


def test_sockets_are_given_to_the_processes_that_hold_them() -> None:
    socks = [Socket("127.0.0.1", 8100, 111), Socket("0.0.0.0", 9999, 999)]
    fds = {20: {3: "socket:[111]", 4: "pipe:[7]"}, 10: {5: "socket:[111]"}}
    got = attribute(socks, fds, {10: "python", 20: "VLLM::Worker"})
    # shared across fork: the lowest pid; a socket nobody of the fleet holds is not listed
    assert got == [OsListener("127.0.0.1", 8100, 10, "python", 5)]


def test_descendants_follow_the_tree_from_the_roots_only() -> None:
    parents = {1: 0, 10: 1, 11: 10, 12: 11, 20: 1, 21: 20}
    assert descendants(parents, [10]) == {10, 11, 12}
    assert descendants(parents, [99]) == set()


def test_listening_reads_a_proc_tree(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text(TCP)
    (tmp_path / "net" / "tcp6").write_text(TCP6)
    fd = tmp_path / "42" / "fd"
    fd.mkdir(parents=True)
    os.symlink("socket:[222]", fd / "7")
    os.symlink("/dev/null", fd / "0")
    (tmp_path / "42" / "comm").write_text("VLLM::Worker\n")
    assert listening([42, 43], tmp_path) == [OsListener("12.0.2.2", 55891, 42, "VLLM::Worker", 7)]


def _spec(**router: object) -> FleetSpec:
    return FleetSpec.model_validate(
        {
            "fleet": {"name": "t", "platform": "cpu"},
            "model": {"path": "m"},
            "prefill": [{"count": 1}],
            "decode": [{"count": 1}],
            "router": router,
        }
    )


def test_the_plan_reconciled_with_the_os_finds_what_the_plan_does_not_name() -> None:
    spec = _spec()
    plan = build_plan(spec)
    expected = planned(spec, plan)
    kinds = {(x.owner, x.kind, x.port) for x in expected}
    p, d = plan.instances
    assert (p.name, "vllm-http", p.http_port) in kinds
    assert (d.name, "side-channel", d.side_channel_ports[0]) in kinds
    assert ("router", "router", 8000) in kinds
    seen = [
        OsListener("127.0.0.1", p.http_port, 100, "python", 12),
        OsListener("192.0.2.2", 47377, 101, "VLLM::Worker", 95),  # UCX behind the plan
        OsListener("127.0.0.1", 8000, 300, "python", 15),
    ]
    owner_of = {100: p.name, 101: p.name, 300: "router"}
    got = {(x.owner, x.kind, x.port): x for x in reconcile(expected, seen, owner_of)}
    assert got[(p.name, "vllm-http", p.http_port)].seen is True
    assert got[(p.name, "vllm-http", p.http_port)].pid == 100
    assert got[(d.name, "vllm-http", d.http_port)].seen is False
    extra = got[(p.name, "unplanned", 47377)]
    assert (extra.planned, extra.host, extra.process) == (False, "192.0.2.2", "VLLM::Worker")
    # the router's workers share its address (SO_REUSEPORT): one listener, not three
    workers = [OsListener("0.0.0.0", 8000, pid, "python", 15) for pid in (300, 301, 302)]
    both = reconcile(expected, workers, {**owner_of, 301: "router", 302: "router"})
    assert [(x.kind, x.host) for x in both if x.owner == "router" and x.seen] == [
        ("router", "0.0.0.0")
    ]
    # a planned port bound by another instance's process is not taken for the planned one
    wrong = reconcile(expected, [OsListener("127.0.0.1", d.http_port, 100, "x", 3)], owner_of)
    assert {(x.owner, x.kind) for x in wrong if x.seen} == {(p.name, "unplanned")}


OPEN = Answer("POST /invocations", 200, True)
PUBLIC = Answer("GET /health", 200, True, public=True)
SHUT = Answer("POST /v1/completions", 401, False)


@pytest.mark.parametrize(
    ("host", "answers", "strict", "is_open"),
    [
        ("0.0.0.0", (OPEN, SHUT), False, True),
        ("192.0.2.2", (OPEN,), False, True),
        ("127.0.0.1", (OPEN,), False, False),  # loopback only ...
        ("127.0.0.1", (OPEN,), True, True),  # ... unless loopback counts
        ("0.0.0.0", (PUBLIC, SHUT), False, False),  # health is open by design
        ("0.0.0.0", (SHUT,), False, False),
    ],
)
def test_open_means_answering_an_outsider_beyond_loopback(
    host: str, answers: tuple[Answer, ...], strict: bool, is_open: bool
) -> None:
    f = judge(Listener("decode-0", "vllm-http", host, 8200), answers, strict=strict)
    assert f.open is is_open
    assert bool(f.fix) is is_open
    if is_open:
        assert "POST /invocations" in f.verdict
        assert "vllm#58144" in f.fix


def test_a_planned_listener_that_is_not_there_is_not_open() -> None:
    f = judge(Listener("decode-0", "vllm-http", "0.0.0.0", 8200, seen=False), (OPEN,))
    assert not f.open
    assert "not listening" in f.verdict


@pytest.mark.parametrize(("mode", "is_open"), [(0o600, False), (0o660, True), (0o777, True)])
def test_the_control_socket_is_open_when_others_may_connect(mode: int, is_open: bool) -> None:
    x = Listener("supervisor", "supervisor-socket", "", path="/s/control.sock", mode=mode)
    assert judge(x, ()).open is is_open


def _vllm_app(guard: bool) -> httpx.MockTransport:
    """vLLM's behaviour as its authenticate middleware and routers give it (GUARDED_PREFIX
    guarded when --api-key is set; POST-only routes answer GET with 405)."""
    posts = {"/invocations", "/tokenize", "/sleep", "/collective_rpc", "/v1/completions"}
    gets = {"/health", "/metrics", "/v1/models", "/version", "/load", "/ping"}
    calls: list[tuple[str, str]] = []

    def handle(req: httpx.Request) -> httpx.Response:
        path = req.url.path
        calls.append((req.method, path))
        if guard and path.startswith(("/v1", "/v2", "/inference", "/cohere")):
            return httpx.Response(401)
        if path in posts:
            return httpx.Response(200 if req.method == "POST" else 405)
        return httpx.Response(200 if path in gets and req.method == "GET" else 404)

    t = httpx.MockTransport(handle)
    t.calls = calls  # type: ignore[attr-defined]
    return t


async def test_vllm_probes_find_the_unguarded_routes_and_change_nothing() -> None:
    t = _vllm_app(guard=True)
    x = Listener("decode-0", "vllm-http", "0.0.0.0", 8200)
    answers = {a.probe: a for a in await probe_vllm(x, "tiny", transport=t)}
    assert answers["POST /invocations"].open
    assert answers["POST /invocations"].status == 200
    assert answers["POST /tokenize"].open
    assert answers["GET /metrics"].open
    assert answers["GET /sleep"].open
    assert answers["GET /sleep"].status == 405
    assert answers["GET /collective_rpc"].open
    assert not answers["POST /v1/completions"].open  # --api-key guards /v1
    assert not answers["GET /v1/models"].open
    assert not answers["GET /wake_up"].open  # 404: not registered (no dev mode)
    assert answers["GET /health"].public
    # nothing that acts was POSTed: only the inference routes got a body
    posted = {p for m, p in t.calls if m == "POST"}  # type: ignore[attr-defined]
    assert posted == {"/invocations", "/tokenize", "/v1/completions"}
    f = judge(x, tuple(answers.values()))
    assert f.open
    assert "/invocations" in f.verdict


async def test_router_probes_tell_a_keyed_router_from_an_open_one() -> None:
    def app(keyed: bool) -> httpx.MockTransport:
        def handle(req: httpx.Request) -> httpx.Response:
            path = req.url.path
            if path in ("/health", "/metrics"):
                return httpx.Response(200)
            if keyed:
                return httpx.Response(401)
            if path.startswith("/v1/pdctl/") and path.rsplit("/", 1)[-1] in (
                "drain",
                "mode",
                "instance",
                "policy",
            ):
                return httpx.Response(405 if req.method == "GET" else 400)
            return httpx.Response(200)

        return httpx.MockTransport(handle)

    x = Listener("router", "router", "0.0.0.0", 8000)
    keyed = await probe_router(x, transport=app(True))
    assert not judge(x, keyed).open
    assert {a.probe for a in keyed if a.open} == {"GET /health", "GET /metrics"}
    bare = await probe_router(x, transport=app(False))
    f = judge(x, bare)
    assert f.open
    assert "GET /v1/pdctl/drain" in f.verdict
    assert "PD045" in f.fix


async def test_probes_of_a_dead_or_silent_listener_answer_closed() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=req)

    x = Listener("decode-0", "vllm-http", "127.0.0.1", 8200)
    answers = await probe_vllm(x, "tiny", transport=httpx.MockTransport(refuse))
    assert len(answers) == 1
    assert not answers[0].open
    assert "ConnectError" in answers[0].note


def test_k8s_audit_from_the_plan_follows_the_network_policies() -> None:
    d = _spec(keys=[{"name": "ops", "role": "admin", "env": "X"}]).model_dump()
    d["backend"] = {"kind": "k8s", "k8s": {"namespace": "llm", "image": "vllm:x"}}
    rep = audit_plan(FleetSpec.model_validate(d), "k8s")
    assert not rep.probed
    assert rep.open == []
    assert all(f.listener.host == "0.0.0.0" for f in rep.findings)
    d["backend"]["k8s"]["network_policies"] = False
    rep = audit_plan(FleetSpec.model_validate(d), "k8s")
    assert {f.listener.kind for f in rep.open} == {"vllm-http", "side-channel"}
    # no key at all (insecure_control): control and completions are open to the cluster
    d["router"]["keys"] = []
    d["router"]["insecure_control"] = True
    rep = audit_plan(FleetSpec.model_validate(d), "k8s")
    assert "router" in {f.listener.kind for f in rep.open}


def test_the_cli_exit_codes_and_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from pdctl.cli.main import main
    from tests.conftest import EXAMPLES

    k8s = str(EXAMPLES / "k8s-multinode.toml")
    assert main(["audit", "-f", k8s, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["backend"], doc["probed"], doc["open"]) == ("k8s", False, 0)
    unfenced = ["--set", "backend.k8s.network_policies=false"]
    assert main(["audit", "-f", k8s, *unfenced]) == 1
    out = capsys.readouterr().out
    assert "OPEN" in out
    assert "network_policies = true" in out
    monkeypatch.setenv("PDCTL_STATE_DIR", str(tmp_path))
    assert main(["audit", "--fleet", "nosuch"]) == 2
    assert "is not running here" in capsys.readouterr().err
