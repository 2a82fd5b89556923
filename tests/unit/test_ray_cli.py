"""``--backend ray`` and ``--address`` on the command line (no cluster: the options and
what they set, and the errors when no cluster answers)."""

from __future__ import annotations

import argparse
import json

import pytest

from pdctl.cli.args import apply_address
from pdctl.cli.main import main
from pdctl.sdk.errors import PdctlError
from tests.conftest import EXAMPLES

CPU = str(EXAMPLES / "cpu-1p1d.toml")


def ns(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"backend": None, "overrides": [], **kw})


def test_address_implies_the_ray_backend_and_sets_its_address():
    args = ns(address="10.0.0.1:6379")
    apply_address(args)
    assert args.backend == "ray"
    assert args.overrides == ["backend.ray.address=10.0.0.1:6379"]


def test_no_address_changes_nothing():
    args = ns(address=None, backend="k8s")
    apply_address(args)
    assert (args.backend, args.overrides) == ("k8s", [])


def test_address_with_another_backend_is_an_error():
    with pytest.raises(PdctlError, match="--address is for the ray backend"):
        apply_address(ns(address="x:1", backend="k8s"))


def test_render_of_a_ray_fleet_shows_the_instances(capsys: pytest.CaptureFixture[str]):
    # on Ray the router is placed on a node's address: without an admin key, PD045
    assert main(["render", "-f", CPU, "--json", "--backend", "ray"]) != 0
    refused = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in refused["findings"] if f["severity"] != "info"] == ["PD045"]
    opt_out = ["--set", "router.insecure_control=true"]
    rc = main(["render", "-f", CPU, "--json", "--backend", "ray", *opt_out])
    assert rc == 0
    names = [i["name"] for i in json.loads(capsys.readouterr().out)]
    assert names == ["prefill-0", "decode-0"]


def test_status_without_a_cluster_says_how_to_get_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    rc = main(["status", "-f", CPU, "--address", "127.0.0.1:1"])
    err = capsys.readouterr()
    assert rc != 0
    assert "cannot join the Ray cluster at '127.0.0.1:1'" in err.out + err.err
