"""The pdctl command line, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES

HEAVY = ("textual", "vllm", "nixl", "torch")


def pdctl(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    return subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=cwd,
    )


def test_help_imports_nothing_heavy():
    code = (
        "import sys\n"
        "from pdctl.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print([m for m in sys.modules if m.split('.')[0] in {HEAVY!r}])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert "render" in out.stdout
    assert "lint" in out.stdout


def test_version():
    r = pdctl("--version")
    assert r.returncode == 0
    assert r.stdout.startswith("pdctl ")


EIGHT_KV = {"model_type": "llama", "num_attention_heads": 64, "num_key_value_heads": 8}
"""As many KV heads as the examples' models: their TP layouts need them (PD005)."""


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_render_json_every_example(path, model_dir):
    r = pdctl("render", "-f", str(path), "--json", "--set", f"model.path={model_dir(EIGHT_KV)}")
    assert r.returncode == 0, r.stderr
    plans = json.loads(r.stdout)
    assert plans
    for p in plans:
        assert {
            "name",
            "role",
            "host",
            "argv",
            "env",
            "http_port",
            "side_channel_port",
            "engine_id",
        } <= set(p)
        assert p["engine_id"]
        assert p["argv"][0] in ("vllm", sys.executable)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_lint_every_example_has_no_errors(path, model_dir):
    r = pdctl(
        "lint",
        "-f",
        str(path),
        "--json",
        "--no-port-check",
        "--set",
        f"model.path={model_dir(EIGHT_KV)}",
    )
    report = json.loads(r.stdout)
    assert report["errors"] == 0, report["findings"]
    assert r.returncode == 0


def test_render_shell_is_one_line_per_instance(model_dir):
    r = pdctl("render", "-f", str(EXAMPLES / "gpu-8x-4p1d.toml"), "--shell")
    lines = [ln for ln in r.stdout.splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == 5
    assert all(ln.startswith("env ") for ln in lines)


def test_lint_exit_codes(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(
        '[model]\npath="org/m"\n[fleet]\nblock_size=16\n'
        "[[prefill]]\ndevices=[0]\n[[decode]]\ndevices=[1]\n"
    )
    args = ("lint", "-f", str(spec), "--no-port-check")
    assert pdctl(*args).returncode == 0
    r = pdctl(*args, "--strict")
    assert r.returncode == 1
    assert "PD009" in r.stdout
    r = pdctl(*args, "--set", "decode.0.devices=[0]")
    assert r.returncode == 2
    assert "PD013" in r.stdout


def test_render_refuses_a_spec_with_lint_errors(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('[model]\npath="org/m"\n[[prefill]]\ndevices=[0]\n[[decode]]\ndevices=[0]\n')
    r = pdctl("render", "-f", str(spec))
    assert r.returncode == 2
    assert "PD013" in r.stderr
    assert "nothing printed" in r.stderr
    assert r.stdout == ""
    r = pdctl("render", "-f", str(spec), "--json")
    assert r.returncode == 2
    assert json.loads(r.stdout)["ok"] is False


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[model\n", "not valid TOML"),
        ('[model]\npath="m"\n[[prefill]]\ntp="two"\n', "prefill[0].tp"),
        ('[model]\npath="m"\n[[prefill]]\nhots="x"\n', "did you mean 'host'"),
        ('[modle]\npath="m"\n', "did you mean 'model'"),
    ],
)
def test_bad_spec_is_a_clear_error_not_a_traceback(tmp_path, text, needle):
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    for cmd in ("lint", "render"):
        r = pdctl(cmd, "-f", str(spec))
        assert r.returncode == 2
        assert "Traceback" not in r.stderr
        assert needle in r.stderr
        assert str(spec) in r.stderr
    r = pdctl("lint", "-f", str(spec), "--json")
    assert json.loads(r.stdout)["spec_errors"]


def test_missing_default_spec(tmp_path):
    r = pdctl("lint", cwd=tmp_path)
    assert r.returncode == 2
    assert "pdctl.toml" in r.stderr
    assert "examples/" in r.stderr


def test_rules_listing():
    r = pdctl("lint", "--rules", "--json")
    codes = [x["code"] for x in json.loads(r.stdout)]
    assert codes == sorted(codes)
    assert "PD001" in codes


def test_schema_is_json():
    r = pdctl("schema")
    assert "properties" in json.loads(r.stdout)


def test_closed_pipe_is_not_a_traceback(tmp_path):
    # 200 instances render to far more JSON than a pipe buffers, so writing hits EPIPE
    spec = tmp_path / "big.toml"
    spec.write_text('[model]\npath="org/m"\n[[prefill]]\ncount=100\n[[decode]]\ncount=100\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdctl.cli.main", "render", "-f", str(spec), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.read(10)
    proc.stdout.close()
    _, err = proc.communicate(timeout=30)
    assert b"Traceback" not in err
    assert proc.returncode == 141


def test_file_before_the_command_is_the_commands_spec(tmp_path, capsys):
    from pdctl.cli.main import main

    spec = tmp_path / "my.toml"
    spec.write_text((EXAMPLES / "cpu-1p1d.toml").read_text())
    before = main(["-f", str(spec), "lint", "--no-port-check", "--json"])
    out_before = capsys.readouterr().out
    after = main(["lint", "-f", str(spec), "--no-port-check", "--json"])
    out_after = capsys.readouterr().out
    assert before == after
    assert out_before == out_after
    assert str(spec) in out_before or "my.toml" in out_before
