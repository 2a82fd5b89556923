"""Spec loading: TOML file, PDCTL_ environment, --set overrides, and the errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdctl.sdk.errors import SpecError
from pdctl.sdk.specload import load_spec
from tests.conftest import EXAMPLES

MINIMAL = """
[model]
path = "~/.cache/pdctl/models/tiny"
served_name = "tiny"
[fleet]
mode = "push"
platform = "cpu"
block_size = 32
[[prefill]]
host = "127.0.0.1"
[[decode]]
host = "127.0.0.1"
[router]
port = 8000
"""


def load(text: str = MINIMAL, overrides=(), env=None):
    return load_spec("spec.toml", overrides, env or {}, text=text).spec


def problems(exc: pytest.ExceptionInfo[SpecError]) -> dict[str, str]:
    return {p.field: f"{p.message} | {p.fix}" for p in exc.value.problems}


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_examples_load(path: Path):
    spec = load_spec(path, environ={}).spec
    assert spec.prefill
    assert spec.decode


def test_minimal_issue_example_defaults():
    spec = load()
    assert spec.fleet.mode == "push"
    assert spec.fleet.effective_block_size == 32
    assert spec.fleet.effective_kv_buffer_device == "cpu"
    assert spec.router is not None
    assert spec.router.port == 8000
    assert spec.model.effective_served_name == "tiny"


def test_env_overrides_file_and_set_overrides_env():
    env = {"PDCTL_ROUTER__PORT": "9001", "PDCTL_FLEET__MODE": "pull"}
    spec = load(env=env)
    assert spec.router is not None
    assert spec.router.port == 9001
    assert spec.fleet.mode == "pull"
    spec = load(env=env, overrides=["router.port=9002", "fleet.mode=colocated"])
    assert spec.router is not None
    assert spec.router.port == 9002
    assert spec.fleet.mode == "colocated"


def test_list_indices_in_env_and_set():
    spec = load(env={"PDCTL_PREFILL__0__TP": "2"})
    assert spec.prefill[0].tp == 2
    assert spec.prefill[0].host == "127.0.0.1"  # the rest of the table survives
    spec = load(overrides=["prefill.0.tp=4", "decode[0].tp=4"])
    assert (spec.prefill[0].tp, spec.decode[0].tp) == (4, 4)
    spec = load(overrides=["decode.1.host=127.0.0.2"])
    assert [d.host for d in spec.decode] == ["127.0.0.1", "127.0.0.2"]


def test_set_values_are_toml_literals():
    spec = load(overrides=["fleet.nixl_backends=['UCX','LIBFABRIC']", "prefill.0.cpu_cores=[0,1]"])
    assert spec.fleet.nixl_backends == ["UCX", "LIBFABRIC"]
    assert spec.prefill[0].cpu_cores == [0, 1]


def test_env_json_list():
    spec = load(env={"PDCTL_FLEET__NIXL_BACKENDS": '["libfabric"]'})
    assert spec.fleet.nixl_backends == ["LIBFABRIC"]


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(SpecError) as e:
        load(MINIMAL.replace("block_size = 32", "blocksize = 32"))
    p = problems(e)
    assert "fleet.blocksize" in p
    assert "block_size" in p["fleet.blocksize"]


def test_unknown_env_var_is_an_error():
    with pytest.raises(SpecError) as e:
        load(env={"PDCTL_ROUTR__PORT": "1"})
    assert any("PDCTL_ROUTR__PORT" in f for f in problems(e))


def test_wrong_type_names_field_and_value():
    with pytest.raises(SpecError) as e:
        load(overrides=["prefill.0.tp='two'"])
    p = problems(e)
    assert "prefill[0].tp" in p
    assert "'two'" in p["prefill[0].tp"]


def test_bad_enum_lists_choices():
    with pytest.raises(SpecError) as e:
        load(overrides=["fleet.mode=pushy"])
    assert "'push'" in problems(e)["fleet.mode"]


def test_invalid_toml_names_file_and_line():
    with pytest.raises(SpecError) as e:
        load("[model\npath='x'")
    msg = str(e.value)
    assert "spec.toml" in msg
    assert "line 1" in msg


def test_missing_model_section():
    with pytest.raises(SpecError) as e:
        load("[[prefill]]\n[[decode]]\n")
    assert "model" in problems(e)


def test_no_instances():
    with pytest.raises(SpecError) as e:
        load('[model]\npath = "x"\n')
    assert "no instances" in str(e.value)


def test_duplicate_group_names():
    text = MINIMAL + '[[decode]]\nname = "decode-a"\n'
    with pytest.raises(SpecError) as e:
        load(
            text.replace(
                '[[decode]]\nhost = "127.0.0.1"',
                '[[decode]]\nhost = "127.0.0.1"\nname = "decode-a"',
            )
        )
    assert "decode-a" in str(e.value)


def test_unknown_engine_id_placeholder():
    with pytest.raises(SpecError) as e:
        load(overrides=["prefill.0.engine_id='{nme}'"])
    assert "{nme}" in str(e.value)


def test_lease_must_cover_heartbeat():
    with pytest.raises(SpecError) as e:
        load(overrides=["fleet.kv_lease_duration_s=3"])
    assert "fleet.kv_lease_duration_s" in problems(e)


def test_missing_file_explicit_and_default(tmp_path, monkeypatch):
    with pytest.raises(SpecError) as e:
        load_spec(tmp_path / "nope.toml", environ={})
    assert "file not found" in str(e.value)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as e:
        load_spec(None, environ={})
    assert "examples/" in str(e.value)


def test_bad_override_syntax():
    with pytest.raises(SpecError) as e:
        load(overrides=["router.port"])
    assert "KEY=VALUE" in str(e.value)
    with pytest.raises(SpecError) as e:
        load(overrides=["prefill.5.tp=2"])
    assert "out of range" in str(e.value)
