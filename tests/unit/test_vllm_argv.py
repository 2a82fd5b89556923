"""Every vLLM command pdctl plans is parsed by the installed vLLM's own argument parser.

The parser is built in-process the way ``vllm`` builds it (``FlexibleArgumentParser`` with
the ``serve`` and ``launch`` subcommands' ``subparser_init``, which call vLLM's
``make_arg_parser``), so a flag renamed or dropped upstream fails here, on a machine
without GPUs, instead of on the operator's. CPU commands (``python -m
vllm.entrypoints.openai.api_server``) go through the same ``make_arg_parser``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdctl.sdk.backends.k8s.manifests import build_manifests
from pdctl.sdk.fleetplan import CPU_ENTRYPOINT, build_plan
from pdctl.sdk.spec import FleetSpec
from pdctl.sdk.specload import load_spec
from tests.conftest import EXAMPLES

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'pdctl[cpu]')")

IMAGE = "registry.example.com/pdctl-vllm:test"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.toml"))
_K8S_VAR = re.compile(r"\$\$?\(([A-Z_]+)\)")
_K8S_VALUES = {"PDCTL_NODE_RANK": "1", "LWS_LEADER_ADDRESS": "10.0.0.9"}


class Rejected(Exception):
    pass


class VllmCli:
    """vLLM's ``vllm`` parser (serve, launch render) and the api_server module's parser."""

    def __init__(self) -> None:
        import vllm.entrypoints.cli.launch as launch
        import vllm.entrypoints.cli.serve as serve
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        self.cli = FlexibleArgumentParser(prog="vllm")
        sub = self.cli.add_subparsers(required=True, dest="subparser")
        for module in (serve, launch):
            for cmd in module.cmd_init():
                cmd.subparser_init(sub)
        self.module = make_arg_parser(FlexibleArgumentParser(prog=CPU_ENTRYPOINT))
        self.validate = validate_parsed_serve_args

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        """Parse a planned argv; :class:`Rejected` names what vLLM refused."""
        args = list(argv)
        if args[0] == "vllm":
            parser, rest = self.cli, args[1:]
        elif args[1:3] == ["-m", CPU_ENTRYPOINT]:
            parser, rest = self.module, args[3:]
        else:
            raise AssertionError(f"not a vLLM command pdctl plans: {args[:3]}")
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns: argparse.Namespace = parser.parse_args(rest)
        except SystemExit:
            raise Rejected(err.getvalue().strip().splitlines()[-1]) from None
        try:
            self.validate(ns)  # what vllm runs next: combinations it refuses
        except (TypeError, ValueError) as e:
            raise Rejected(f"{type(e).__name__}: {e}") from None
        return ns


@pytest.fixture(scope="module")
def vllm_cli() -> VllmCli:
    return VllmCli()


def _k8s(spec: FleetSpec) -> FleetSpec:
    if spec.backend.k8s is not None:
        return spec
    data = spec.model_dump(mode="json")
    data["backend"] = {"kind": "k8s", "k8s": {"image": IMAGE}}
    return FleetSpec(**data)


def _container_commands(docs: list[dict[str, Any]]) -> list[list[str]]:
    """Every vLLM container command of the manifests, with Kubernetes' $(VAR) filled in."""
    out = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("name") == "vllm" and isinstance(node.get("command"), list):
                out.append(
                    [_K8S_VAR.sub(lambda m: _K8S_VALUES[m.group(1)], a) for a in node["command"]]
                )
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(docs)
    return out


def _all_commands(spec: FleetSpec) -> list[list[str]]:
    plan = build_plan(spec)
    cmds = [list(i.argv) for i in plan.instances]
    return cmds + _container_commands(build_manifests(_k8s(spec)))


def _check(cli: VllmCli, spec: FleetSpec) -> int:
    n = 0
    for argv in _all_commands(spec):
        try:
            ns = cli.parse(argv)
        except Rejected as e:
            pytest.fail(f"vLLM {_version()} rejects {' '.join(argv[:3])} …: {e}")
        n += 1
        if "--kv-transfer-config" in argv:
            assert ns.kv_transfer_config is not None  # parsed into vLLM's KVTransferConfig
    return n


def _version() -> str:
    import importlib.metadata

    return importlib.metadata.version("vllm")


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_every_example_command_parses(vllm_cli, path):
    spec = load_spec(path, environ={}).spec
    assert _check(vllm_cli, spec) > 0
    if spec.fleet.platform == "cpu":
        gpu = FleetSpec(
            **{
                **spec.model_dump(mode="json"),
                "fleet": {**spec.fleet.model_dump(mode="json"), "platform": "gpu", "python": None},
            }
        )
        assert _check(vllm_cli, gpu) > 0


def test_a_misspelled_flag_is_caught_and_named(vllm_cli):
    spec = load_spec(EXAMPLES / "gpu-8x-4p1d.toml", environ={}).spec
    argv = list(build_plan(spec).instances[0].argv)
    assert argv[:2] == ["vllm", "serve"]
    vllm_cli.parse(argv)
    with pytest.raises(Rejected, match="--tensor-paralel-size"):
        vllm_cli.parse([a.replace("--tensor-parallel-size", "--tensor-paralel-size") for a in argv])
    with pytest.raises(Rejected, match="--no-such-flag"):
        vllm_cli.parse([*argv, "--no-such-flag"])


@st.composite
def gpu_specs(draw):
    group = st.fixed_dictionaries(
        {
            "host": st.sampled_from(["127.0.0.1", "10.0.0.1", "10.0.0.2"]),
            "count": st.integers(1, 2),
            "tp": st.sampled_from([1, 2, 4]),
            "dp": st.sampled_from([1, 2]),
            "pp": st.sampled_from([1, 2]),
            "max_num_seqs": st.none() | st.integers(1, 512),
        }
    )
    model: dict[str, Any] = {"path": "org/m"}
    model["dtype"] = draw(st.sampled_from(["auto", "bfloat16", "float16"]))
    model["kv_cache_dtype"] = draw(st.sampled_from(["auto", "fp8"]))
    model["max_model_len"] = draw(st.none() | st.integers(256, 131072))
    model["trust_remote_code"] = draw(st.booleans())
    fleet = {
        "platform": "gpu",
        "mode": draw(st.sampled_from(["push", "pull"])),
        "block_size": draw(st.sampled_from([16, 32, 64, 128])),
        "connector": draw(st.sampled_from(["pdctl", "stock"])),
        "nixl_backends": draw(st.sampled_from([["UCX"], ["LIBFABRIC"], ["UCX", "LIBFABRIC"]])),
        "enable_prefix_caching": draw(st.none() | st.booleans()),
        "failure_policy": draw(st.sampled_from(["fail", "recompute"])),
    }
    d: dict[str, Any] = {
        "model": model,
        "fleet": fleet,
        "prefill": draw(st.lists(group, min_size=1, max_size=2)),
        "decode": draw(st.lists(group, min_size=1, max_size=2)),
    }
    if draw(st.booleans()):
        d["router"] = {
            "host": "0.0.0.0",
            "port": 8000,
            "path": draw(st.sampled_from(["text", "tokens"])),
        }
        if d["router"]["path"] == "tokens":
            d["render"] = [{"host": "127.0.0.1", "count": 1}]
    return d


@pytest.mark.slow  # sixty specs through vLLM's parser
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(gpu_specs())
def test_swept_gpu_specs_parse(vllm_cli, d):
    assert _check(vllm_cli, FleetSpec(**d)) > 0
