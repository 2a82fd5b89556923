"""Where the Kubernetes source finds its API server and credentials: kubeconfigs (token,
CA and client certificate data, exec plugins, contexts, merged files), the pod's service
account (token re-read as kubelet rotates it), label selectors checked before sending,
and the watch stream's framing."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pdctl.sdk import kube
from pdctl.sdk.errors import PdctlError
from pdctl.sdk.kube import KubeConfigError, KubeError, KubeUnreachable, Selector, SelectorError
from pdctl.sdk.kube.api import decode_stream
from pdctl.sdk.kube.config import from_kubeconfig, load_config
from tests.kubeapi_server import FakeKubeAPI, pod
from tests.unit.test_router_hardening import _certs

D = {"llm-d.ai/role": "decode"}


def kubeconfig(
    path: Path, server: str, user: dict[str, Any], yaml: Any = None, **cluster: Any
) -> Path:
    """A kubeconfig with contexts ``main`` (namespace llm) and ``other`` (prod); YAML, as
    kubectl writes it, given the ``yaml`` fixture, else JSON (a kubeconfig too)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "main",
        "contexts": [
            {"name": "main", "context": {"cluster": "c", "user": "u", "namespace": "llm"}},
            {"name": "other", "context": {"cluster": "c", "user": "u", "namespace": "prod"}},
        ],
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": user}],
    }
    path.write_text(yaml.safe_dump(doc) if yaml is not None else json.dumps(doc))
    return path


async def names_via(cfg: kube.KubeConfig, namespace: str = "llm") -> list[str]:
    d = kube.discovery(namespace, preset="llm-d", config=cfg)
    try:
        await d.start()
        return [e.name for e in d.endpoints()]
    finally:
        await d.aclose()


def b64(path: str) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


async def test_kubeconfig_with_a_token_and_the_contexts_namespace(tmp_path, yaml):
    with FakeKubeAPI() as api:
        api.add(pod("d-0", D))
        cfg = from_kubeconfig(
            str(kubeconfig(tmp_path / "kc", api.url, {"token": "good-token"}, yaml))
        )
        assert cfg.namespace == "llm"
        assert await names_via(cfg) == ["d-0"]
        other = from_kubeconfig(str(tmp_path / "kc"), "other")
        assert other.namespace == "prod"


async def test_tls_with_ca_and_client_certificate_data(tmp_path):
    f = _certs(tmp_path)
    tls = {"cert": f["server.pem"], "key": f["server.key"], "client_ca": f["ca.pem"]}
    with FakeKubeAPI(tls=tls) as api:
        api.add(pod("d-0", D))
        user = {"client-certificate-data": b64(f["ops.pem"]), "client-key-data": b64(f["ops.key"])}
        kc = kubeconfig(
            tmp_path / "kc", api.url, user, **{"certificate-authority-data": b64(f["ca.pem"])}
        )
        assert await names_via(from_kubeconfig(str(kc))) == ["d-0"]
        # without the cluster's CA the server's certificate is not trusted
        bare = kubeconfig(tmp_path / "kc2", api.url, user)
        with pytest.raises(KubeUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
            await names_via(from_kubeconfig(str(bare)))


async def test_an_exec_plugin_gives_the_token(tmp_path):
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json, os\n"
        "assert json.loads(os.environ['KUBERNETES_EXEC_INFO'])['kind'] == 'ExecCredential'\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', "
        "'kind': 'ExecCredential', 'status': {'token': os.environ['TOKEN']}}))\n"
    )
    with FakeKubeAPI() as api:
        api.add(pod("d-0", D))
        user = {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": sys.executable,
                "args": [str(plugin)],
                "env": [{"name": "TOKEN", "value": "good-token"}],
            }
        }
        cfg = from_kubeconfig(str(kubeconfig(tmp_path / "kc", api.url, user)))
        assert await names_via(cfg) == ["d-0"]
        # the plugin's cached token is refused (it was revoked): it runs again, once
        api.token = "renewed"
        assert cfg.exec_spec is not None
        cfg.exec_spec["env"] = [{"name": "TOKEN", "value": "renewed"}]
        assert await names_via(cfg) == ["d-0"]
        user["exec"]["command"] = str(tmp_path / "no-such-plugin")
        user["exec"]["installHint"] = "install the cloud's CLI"
        cfg = from_kubeconfig(str(kubeconfig(tmp_path / "kc", api.url, user)))
        with pytest.raises(KubeConfigError, match=r"users\[u\]\.exec.*was not found: install"):
            await names_via(cfg)


async def test_in_a_pod_the_service_account_token_is_reread_as_kubelet_rotates_it(
    tmp_path, monkeypatch
):
    f = _certs(tmp_path)
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("good-token\n")
    (sa / "namespace").write_text("llm")
    (sa / "ca.crt").symlink_to(f["ca.pem"])
    with FakeKubeAPI(tls={"cert": f["server.pem"], "key": f["server.key"]}) as api:
        api.add(pod("d-0", D))
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", api.url.rsplit(":", 1)[1])
        cfg = load_config(sa_dir=str(sa))
        assert cfg.source.startswith("the pod's service account")
        assert cfg.namespace == "llm"
        assert await names_via(cfg) == ["d-0"]
        api.token = "rotated"
        (sa / "token").write_text("rotated")
        assert await names_via(cfg) == ["d-0"]


def test_kubeconfig_errors_name_the_file_entry_and_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match=r"no kubeconfig at .*missing.*--k8s-kubeconfig"):
        load_config()
    kc = kubeconfig(tmp_path / "kc", "https://k:6443", {"token": "t"})
    with pytest.raises(
        KubeConfigError, match=r"context 'nope' is not defined \(contexts: main, other\)"
    ):
        from_kubeconfig(str(kc), "nope")
    bad = kubeconfig(tmp_path / "bad", "k:6443", {"token": "t"})
    with pytest.raises(
        KubeConfigError, match=r"clusters\[c\]\.server 'k:6443' is not an https:// URL"
    ):
        from_kubeconfig(str(bad))
    old = kubeconfig(tmp_path / "old", "https://k:6443", {"auth-provider": {"name": "gcp"}})
    with pytest.raises(KubeConfigError, match=r"users\[u\]\.auth-provider.*exec plugin"):
        from_kubeconfig(str(old))
    half = kubeconfig(tmp_path / "half", "https://k:6443", {"client-certificate-data": "eA=="})
    with pytest.raises(KubeConfigError, match="needs its key"):
        from_kubeconfig(str(half))


def test_kubeconfig_files_merge_first_wins(tmp_path, monkeypatch, yaml):
    a = kubeconfig(tmp_path / "a", "https://first:6443", {"token": "a"}, yaml)
    b = kubeconfig(tmp_path / "b", "https://second:6443", {"token": "b"})
    doc = json.loads(b.read_text())
    doc["current-context"] = "other"
    b.write_text(json.dumps(doc))  # JSON is a kubeconfig too
    monkeypatch.setenv("KUBECONFIG", f"{a}:{b}")
    cfg = from_kubeconfig()
    assert (cfg.server, cfg.token, cfg.namespace) == ("https://first:6443", "a", "llm")


def test_selectors_are_checked_before_sending_and_match_as_the_server_does():
    s = Selector.parse("llm-d.ai/role in (prefill, decode),tier!=gpu-old,!canary,app")
    assert str(s) == "llm-d.ai/role in (prefill,decode),tier!=gpu-old,!canary,app"
    assert s.matches({"llm-d.ai/role": "decode", "app": "x"})
    assert not s.matches({"llm-d.ai/role": "decode", "app": "x", "canary": "1"})
    assert not s.matches({"llm-d.ai/role": "decode", "app": "x", "tier": "gpu-old"})
    assert not s.matches({"llm-d.ai/role": "router", "app": "x"})
    assert Selector.parse("a==b").matches({"a": "b"})
    assert Selector.parse("a notin (b)").matches({})
    for bad, why in [
        ("", "is empty"),
        ("role=prefill,", "empty requirement"),
        ("role in ()", "lists no values"),
        ("Bad_Key/x=1", "not a label key"),
        ("role=a b", "cannot read"),
        ("role=-x", "not a label value"),
    ]:
        with pytest.raises(SelectorError, match=rf"--k8s-decode-selector .*{why}"):
            Selector.parse(bad, "--k8s-decode-selector")


def test_a_preset_or_selectors_are_needed_and_a_bad_one_is_named():
    cfg = kube.KubeConfig(server="https://k:6443", source="x")
    with pytest.raises(PdctlError, match="--k8s-preset"):
        kube.discovery("llm", config=cfg)
    with pytest.raises(SelectorError, match="--k8s-prefill-selector"):
        kube.discovery("llm", prefill_selector="a=(", config=cfg)
    with pytest.raises(PdctlError, match="no such preset; choose one of llm-d"):
        kube.discovery("llm", preset="vllm-production-stack", config=cfg)


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


async def collect(*parts: bytes) -> list[dict[str, Any]]:
    return [e async for e in decode_stream(chunks(*parts))]


async def test_watch_stream_framing():
    ev = json.dumps({"type": "ADDED", "object": {"n": "é"}}, ensure_ascii=False).encode()
    cut = ev.index("é".encode()) + 1  # inside the two-byte character
    assert (
        await collect(ev[:cut], ev[cut:] + b"\n" + ev, b"\n")
        == [{"type": "ADDED", "object": {"n": "é"}}] * 2
    )
    with pytest.raises(KubeError, match="not JSON events"):
        await collect(b"<html>")
    with pytest.raises(KubeError, match="ended inside an event"):
        await collect(ev[:10])
