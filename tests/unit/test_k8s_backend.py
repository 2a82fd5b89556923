"""The k8s backend against a fake ``kubectl`` on PATH that records every call and answers
with responses in kubectl's shape (tests/data/k8s/recorded; no cluster exists here)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from pdctl.cli.main import main
from pdctl.sdk.backends import BackendError, open_backend
from pdctl.sdk.backends.k8s import K8sBackend, Kubectl, KubectlError, build_manifests
from pdctl.sdk.backends.k8s.names import LWS_RESOURCE
from pdctl.sdk.errors import LaunchError, NotRunningError
from tests.conftest import EXAMPLES, FIXTURES
from tests.unit.test_k8s_manifests import k8s_example

RECORDED = FIXTURES / "k8s" / "recorded"
GPU = EXAMPLES / "gpu-8x-4p1d.toml"
MULTI = EXAMPLES / "k8s-multinode.toml"
SELECTOR = "app.kubernetes.io/managed-by=pdctl,pdctl.io/fleet=node8"

BASE = "deployments.apps,services,configmaps,networkpolicies.networking.k8s.io"
BASE += ",poddisruptionbudgets.policy"


class FakeKubectl:
    def __init__(self, state: Path) -> None:
        self.state = state

    def answer(self, name: str, text: str) -> None:
        (self.state / name).write_text(text)

    def gets(self, *recorded: str) -> None:
        """The responses of successive ``kubectl get`` calls (the last one repeats)."""
        for i, name in enumerate(recorded):
            shutil.copy(RECORDED / name, self.state / f"get-{i}.json")

    def calls(self) -> list[dict[str, Any]]:
        path = self.state / "calls.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines]

    def verbs(self) -> list[str]:
        return [c["argv"][0] for c in self.calls()]


@pytest.fixture
def kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKubectl:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "kubectl"
    # run by this interpreter, isolated and without site-packages (it needs neither):
    # ``python3`` on PATH may be a slow shim (pyenv) or another Python altogether
    script = (RECORDED / "fake_kubectl.py").read_text().split("\n", 1)[1]
    exe.write_text(f"#!{sys.executable} -IS\n{script}")
    exe.chmod(0o755)
    state = tmp_path / "kubectl"
    state.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBECTL_DIR", str(state))
    fake = FakeKubectl(state)
    fake.answer("context.txt", "kind-test\n")
    fake.answer("api-resources.txt", f"{LWS_RESOURCE}\n")
    return fake


def backend(path: Path = GPU, **kw: Any) -> K8sBackend:
    b = open_backend(k8s_example(path), **kw)
    assert isinstance(b, K8sBackend)
    b.poll_s = 0
    return b


async def test_up_applies_the_rendered_manifests_and_prunes_stale_objects(kubectl):
    kubectl.gets("get-objects-stale.json")
    b = backend()
    await b.up(wait=False)
    calls = kubectl.calls()
    assert [c["argv"][:2] for c in calls] == [
        ["config", "current-context"],
        ["api-resources", "-o"],
        ["apply", "-n"],
        [
            "get",
            f"{BASE},{LWS_RESOURCE}",
        ],
        ["delete", "deployment/node8-prefill-9"],
    ]
    apply = calls[2]
    assert apply["argv"] == ["apply", "-n", "default", "-o", "name", "-f", "-"]
    assert json.loads(apply["stdin"])["items"] == build_manifests(b.spec)
    assert calls[3]["argv"][2:] == ["-n", "default", "-l", SELECTOR, "-o", "json"]
    assert calls[4]["argv"][:3] == [
        "delete",
        "deployment/node8-prefill-9",
        "service/node8-prefill-9",
    ]


async def test_up_without_leaderworkerset_in_the_cluster_says_how_to_install_it(kubectl):
    kubectl.answer("api-resources.txt", "")
    with pytest.raises(BackendError, match=r"llama405-prefill-0 span nodes.*LeaderWorkerSet"):
        await backend(MULTI).up(wait=False)
    assert "apply" not in kubectl.verbs()


async def test_up_waits_until_every_instance_is_ready(kubectl):
    kubectl.gets("get-objects-stale.json", "get-pods-starting.json", "get-pods-ready.json")
    b = backend()
    await b.up(wait=True)
    assert kubectl.verbs().count("get") == 3
    st = await b.status()
    assert st.all_ready
    assert [i.name for i in st.instances][-1] == "router"


async def test_wait_gives_up_naming_what_is_not_ready(kubectl):
    kubectl.gets("get-pods-mixed.json")
    times = iter([0.0, 0.0, 10.0, 10.0, 10.0])
    b = backend(ready_timeout=5)
    b.clock = lambda: next(times)
    with pytest.raises(LaunchError, match=r"prefill-1 starting \(Unschedulable: 0/4 nodes"):
        await b.wait_ready()
    assert "delete" not in kubectl.verbs()  # the cluster keeps trying


async def test_status_maps_recorded_pods(kubectl):
    kubectl.gets("get-pods-mixed.json")
    st = await backend().status()
    states = {i.name: i.state for i in st.instances}
    assert states == {
        "prefill-0": "ready",
        "prefill-1": "starting",
        "prefill-2": "exited",
        "prefill-3": "unhealthy",
        "decode-0": "unhealthy",
        "router": "ready",
    }
    by_name = {i.name: i for i in st.instances}
    assert by_name["prefill-2"].exit_code == 1
    assert by_name["prefill-2"].restarts == 3
    assert by_name["prefill-3"].log_tail[0].startswith("ImagePullBackOff")
    assert by_name["prefill-0"].url.startswith("http://node8-prefill-0.default.svc.cluster.local:")
    assert "logs -l pdctl.io/fleet=node8,pdctl.io/instance=decode-0" in by_name["decode-0"].log
    (get,) = [c for c in kubectl.calls() if c["argv"][0] == "get"]
    assert get["argv"][1].startswith("pods,deployments.apps")


async def test_status_of_nothing_is_not_running(kubectl):
    with pytest.raises(NotRunningError, match="no fleet named 'node8'"):
        await backend().status()


async def test_down_deletes_everything_labelled_with_the_fleet(kubectl):
    kubectl.answer("delete.txt", "deployment.apps/node8-prefill-0\nservice/node8-prefill-0\n")
    assert "deleted 2 object(s)" in await backend().down()
    (delete,) = [c for c in kubectl.calls() if c["argv"][0] == "delete"]
    assert delete["argv"] == [
        "delete",
        f"{BASE},{LWS_RESOURCE}",
        "-n",
        "default",
        "-l",
        SELECTOR,
        "--ignore-not-found",
        "--wait=false",
        "-o",
        "name",
    ]


async def test_down_leaves_out_leaderworkerset_when_the_cluster_has_none(kubectl):
    kubectl.answer("api-resources.txt", "")
    kubectl.answer("delete.txt", "")
    assert "nothing of fleet 'node8'" in await backend().down()
    (delete,) = [c for c in kubectl.calls() if c["argv"][0] == "delete"]
    assert delete["argv"][1] == BASE


async def test_named_context_goes_on_every_call(kubectl):
    b = backend()
    b.kubectl.context = "prod"
    kubectl.gets("get-pods-ready.json")
    await b.status()
    assert all(c["argv"][:2] == ["--context", "prod"] for c in kubectl.calls())


def test_no_kubectl_says_what_to_install(tmp_path):
    k = Kubectl("default", executable=str(tmp_path / "kubectl"))
    with pytest.raises(KubectlError, match="install kubectl"):
        k.current_context()


def test_no_context_says_how_to_choose_one(kubectl):
    (kubectl.state / "context.txt").unlink()
    with pytest.raises(KubectlError, match="use-context"):
        Kubectl("default").current_context()


def test_api_errors_carry_kubectl_stderr(kubectl):
    with pytest.raises(KubectlError, match="unknown command"):
        Kubectl("default").run(["frobnicate"])


def test_unknown_backend_is_refused():
    with pytest.raises(BackendError, match=r"'nomad' backend is not available.*k8s, local, ray"):
        open_backend(k8s_example(GPU), "nomad")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- CLI


def test_cli_up_detach_status_and_down(kubectl, capsys):
    path = str(MULTI)
    labels = {"app.kubernetes.io/managed-by": "pdctl", "pdctl.io/fleet": "llama405"}
    spec_map = {"kind": "ConfigMap", "metadata": {"name": "llama405-spec", "labels": labels}}
    kubectl.answer("get-0.json", '{"items": []}')  # nothing stale to prune
    kubectl.answer("get-1.json", json.dumps({"items": [spec_map]}))  # no pod yet
    assert main(["up", "-f", path, "--detach"]) == 0
    assert "apply" in kubectl.verbs()
    assert "llama405-decode-0" in capsys.readouterr().out
    assert main(["status", "-f", path, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["backend"] == "k8s"
    assert doc["where"] == "current context/llm"
    assert {i["state"] for i in doc["instances"]} == {"gone"}
    assert main(["down", "-f", path]) == 0
    assert "llama405" in capsys.readouterr().out


def test_cli_status_table_shows_why(kubectl, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    kubectl.gets("get-pods-mixed.json")
    rc = main(["status", "-f", str(GPU), "--backend", "k8s", "--set", "backend.k8s.image=i:1"])
    assert rc == 1
    out = capsys.readouterr().out
    assert "CrashLoopBackOff" in out
    assert "Insufficient nvidia.com/gpu" in out
