"""Default deny off loopback (PD045), inline keys (PD046), key sources (PD021, PD031) and
the refusal to start that matches PD045."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pdctl.sdk.backends.k8s import router as k8s_router
from pdctl.sdk.errors import PdctlError
from pdctl.sdk.keys import KeySourceError, admin_key, control_exposure, key_sources, read_secret
from pdctl.sdk.lint import lint
from pdctl.sdk.router.server import RouterStartError, build_app
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.specload import load_spec
from tests.conftest import spec_dict

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ADMIN = {"name": "ops", "role": "admin", "env": "PDCTL_T_ADMIN"}
ENV = {"PDCTL_T_ADMIN": "adm1n", "PDCTL_T_INF": "inf"}


def _spec(router: dict[str, Any], **kw: Any) -> FleetSpec:
    return FleetSpec(**spec_dict(router=router, **kw))


def _findings(spec: FleetSpec, code: str) -> list[Any]:
    rep = lint(spec, check_bound_ports=False, environ=ENV)
    return [f for f in rep.findings if f.code == code]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "router.internal"])
def test_off_loopback_without_admin_key_is_an_error_naming_the_fix(host):
    (f,) = _findings(_spec({"host": host}), "PD045")
    assert f.severity == "error"
    assert f.field == "router.keys"
    assert 'role = "admin"' in f.fix
    assert "insecure_control" in f.fix


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.5"])
def test_loopback_needs_no_key(host):
    assert _findings(_spec({"host": host}), "PD045") == []
    assert control_exposure(_spec({"host": host})) is None


def test_an_inference_key_alone_does_not_guard_control():
    inf = {"name": "apps", "role": "inference", "env": "PDCTL_T_INF"}
    (f,) = _findings(_spec({"host": "0.0.0.0", "keys": [inf]}), "PD045")
    assert f.severity == "error"


def test_legacy_api_key_is_an_admin_key():
    s = _spec({"host": "0.0.0.0", "api_key": {"env": "PDCTL_T_ADMIN"}})
    assert _findings(s, "PD045") == []
    assert admin_key(s, ENV) == "adm1n"


def test_insecure_control_is_allowed_but_still_warned():
    s = _spec({"host": "0.0.0.0", "insecure_control": True})
    (f,) = _findings(s, "PD045")
    assert f.severity == "warning"
    assert f.field == "router.insecure_control"
    assert control_exposure(s) is None


def test_kubernetes_router_binds_everything_whatever_router_host_says():
    d = spec_dict(router={"host": "127.0.0.1"}, prefill=[{}], decode=[{}])
    d["backend"] = {"kind": "k8s", "k8s": {"image": "img:1"}}
    (f,) = _findings(FleetSpec(**d), "PD045")
    assert "0.0.0.0" in f.message


def test_ray_places_a_loopback_router_on_its_node_address():
    from tests.unit.test_ray_placement import ray_demo

    open_spec = ray_demo("router.insecure_control=false")
    (f,) = _findings(open_spec, "PD045")
    assert f.severity == "error"
    assert "Ray node" in f.message
    assert _findings(ray_demo(), "PD045")[0].severity == "warning"  # insecure_control


def test_router_refuses_to_start_open_beyond_loopback():
    s = _spec({"host": "0.0.0.0"})
    with pytest.raises(PdctlError, match=r"PD045.*role = \"admin\""):
        build_app(s)  # lint refuses it first
    # the guard refuses it too (the Kubernetes router pod skips lint), and also when only
    # the command line moves the router off loopback
    with pytest.raises(RouterStartError, match="insecure_control"):
        build_app(_spec({}), host="0.0.0.0")
    k8s = spec_dict(prefill=[{}], decode=[{}])
    k8s["backend"] = {"kind": "k8s", "k8s": {"image": "img:1"}}
    with pytest.raises(PdctlError, match=r"binds 0\.0\.0\.0 with no admin key"):
        k8s_router.build(FleetSpec(**k8s))
    s_ok = _spec({"host": "0.0.0.0", "insecure_control": True})
    assert build_app(s_ok).guard.keys.has_keys is False


def test_router_refuses_to_start_with_an_unreadable_key(monkeypatch):
    monkeypatch.delenv("PDCTL_T_ADMIN", raising=False)
    with pytest.raises(RouterStartError, match=r"router.keys\[0\].env names PDCTL_T_ADMIN"):
        build_app(_spec({"host": "0.0.0.0", "keys": [ADMIN]}))


def test_key_sources_env_file_value(tmp_path):
    f = tmp_path / "key"
    f.write_text("from-file\nignored\n")
    s = _spec(
        {
            "keys": [
                ADMIN,
                {"name": "f", "file": str(f), "tenant": "t1"},
                {"name": "v", "value": "inline"},
            ]
        }
    )
    srcs = key_sources(s.router)
    assert [read_secret(x, ENV) for x in srcs] == [b"adm1n", b"from-file", b"inline"]
    assert [x.tenant for x in srcs] == ["ops", "t1", "v"]
    (f45,) = _findings(s, "PD046")
    assert f45.field == "router.keys[2].value"
    assert "inline" not in f45.message + f45.fix  # the finding never repeats the key
    (tmp_path / "empty").write_text("\n")
    empty = _spec({"keys": [{"name": "e", "file": str(tmp_path / "empty")}]})
    with pytest.raises(KeySourceError, match="is empty"):
        read_secret(key_sources(empty.router)[0], ENV)


def test_unset_key_variable_is_pd021_naming_the_key():
    s = _spec({"keys": [{"name": "apps", "env": "PDCTL_T_SURELY_UNSET"}]})
    (f,) = _findings(s, "PD021")
    assert f.field == "router.keys[0].env"
    assert "'apps'" in f.message


@pytest.mark.parametrize(
    ("router", "needle"),
    [
        ({"keys": [{"name": "a", "env": "X"}, {"name": "a", "env": "Y"}]}, "unique"),
        ({"keys": [{"name": "a"}]}, "exactly one of env, file or value"),
        ({"keys": [{"name": "a", "env": "X", "value": "v"}]}, "exactly one"),
        ({"keys": [{"name": "a", "env": "X"}], "tenants": {"zz": {}}}, "no key belongs to"),
        ({"keys": [{"name": "a", "env": "X", "role": "root"}]}, "admin"),
    ],
)
def test_bad_key_specs_name_the_problem(router, needle):
    with pytest.raises(ValueError, match=needle):
        _spec(router)


def test_k8s_example_lints_clean_and_router_keys_reach_only_the_router_pod():
    from pdctl.sdk.backends.k8s.manifests import build_manifests

    spec = load_spec(EXAMPLES / "k8s-multinode.toml", environ={}).spec
    rep = lint(spec, check_bound_ports=False, environ=ENV)
    assert [f for f in rep.findings if f.severity in ("error", "warning")] == []
    router_secrets: set[str] = set()
    other_secrets: set[str] = set()
    for doc in build_manifests(spec):
        tmpl = doc.get("spec", {}).get("template") or doc.get("spec", {}).get(
            "leaderWorkerTemplate", {}
        ).get("workerTemplate")
        if not tmpl:
            continue
        for c in tmpl["spec"]["containers"]:
            names = {e["secretRef"]["name"] for e in c.get("envFrom", [])}
            (router_secrets if c["name"] == "router" else other_secrets).update(names)
    assert "pdctl-router-keys" in router_secrets
    assert "pdctl-router-keys" not in other_secrets


def test_gpu_example_lints_clean_with_its_keys_exported():
    spec = load_spec(EXAMPLES / "gpu-8x-4p1d.toml", environ={}).spec
    env = {"PDCTL_ADMIN_KEY": "a", "PDCTL_INFERENCE_KEY": "b"}
    rep = lint(spec, check_bound_ports=False, environ=env)
    assert {f.code for f in rep.findings if f.severity == "error"} == set()
    assert "PD045" not in {f.code for f in rep.findings}
