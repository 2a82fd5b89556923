"""One command-line grammar: the options every command shares mean the same before and
after the command's name, -o json is --json, old spellings still work and say so."""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path
from typing import Any

import pytest

from pdctl.cli import main as cli_main
from pdctl.cli.main import SUBCOMMANDS, build_parser, main, parse, subparser
from tests.conftest import EXAMPLES, FIXTURES, REPO

GPU = str(EXAMPLES / "gpu-8x-4p1d.toml")
CLI = REPO / "tui" / "pdctl" / "cli"


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _required(p: argparse.ArgumentParser) -> list[str]:
    """Words that satisfy a parser's required positionals and options."""
    words: list[str] = []
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            name, nested = next(iter(a.choices.items()))
            words += [name, *_required(nested)]
        elif not a.option_strings and a.nargs not in ("?", "*"):
            words.append("x")
        elif a.option_strings and a.required:
            words += [a.option_strings[-1], "1"]
    return words


def _outcome(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> dict[str, Any] | tuple[Any, str]:
    """The parsed namespace, or the usage error's message."""
    try:
        return vars(parse(argv))
    except SystemExit as e:
        return (e.code, capsys.readouterr().err.splitlines()[-1])


def test_the_table_and_the_parser_agree():
    assert list(_commands()) == [sc.name for sc in SUBCOMMANDS]


@pytest.mark.parametrize("command", [sc.name for sc in SUBCOMMANDS])
def test_every_command_takes_dash_f_before_or_after_its_name(command, capsys):
    """The same namespace, or for a command that reads no spec the same refusal."""
    words = _required(_commands()[command])
    nested = any(isinstance(a, argparse._SubParsersAction) for a in _commands()[command]._actions)
    before = _outcome(["-f", "my.toml", command, *words], capsys)
    assert _outcome([command, "-f", "my.toml", *words], capsys) == before
    if not nested:  # `model tiny -f X` would be the nested command's option
        assert _outcome([command, *words, "--file", "my.toml"], capsys) == before
    if isinstance(before, dict):
        assert before["file"] == "my.toml"
    else:
        assert before[0] == 2


@pytest.mark.parametrize("command", [sc.name for sc in SUBCOMMANDS])
def test_every_shared_option_means_the_same_on_either_side(command, capsys):
    words = _required(_commands()[command])
    shared = ["--set", "a.b=1", "--fleet", "f1", "--backend", "local", "-o", "table"]
    before = _outcome([*shared, command, *words], capsys)
    assert _outcome([command, *shared, *words], capsys) == before
    if isinstance(before, dict):
        assert (before["overrides"], before["fleet"], before["backend"]) == (
            ["a.b=1"],
            "f1",
            "local",
        )


def test_set_adds_up_on_both_sides_and_two_specs_are_refused(capsys):
    args = parse(["--set", "a=1", "lint", "--set", "b=2"])
    assert args.overrides == ["a=1", "b=2"]
    with pytest.raises(SystemExit):
        parse(["-f", "a.toml", "lint", "-f", "b.toml"])
    assert "two different -f/--file" in capsys.readouterr().err


@pytest.mark.parametrize("command", [sc.name for sc in SUBCOMMANDS])
def test_json_switch_and_dash_o_json_parse_alike(command, capsys):
    words = _required(_commands()[command])
    switch = _outcome([command, "--json", *words], capsys)
    dash_o = _outcome([command, "-o", "json", *words], capsys)
    if isinstance(switch, dict) and isinstance(dash_o, dict):
        assert switch.pop("json_switch") is True
        assert dash_o.pop("json_switch") is False
        assert (switch["output"], switch["json"]) == ("json", True)
    assert switch == dash_o


@pytest.mark.parametrize(
    "argv",
    [
        ["config", "-f", GPU],
        ["lint", "-f", GPU, "--no-port-check"],
        ["schema"],
        ["lint", "--rules"],
    ],
)
def test_json_and_yaml_print_the_same_document(argv, capsys):
    rc = main([*argv, "--json"])
    switch = capsys.readouterr().out
    assert main([*argv, "-o", "json"]) == rc
    dash_o = capsys.readouterr().out
    assert switch == dash_o
    assert main([*argv, "-o", "yaml"]) == rc
    yaml = pytest.importorskip("yaml", reason="reading -o yaml back needs PyYAML")
    assert yaml.safe_load(capsys.readouterr().out) == json.loads(dash_o)


def test_a_format_a_command_does_not_print_is_named_with_those_it_does(capsys):
    with pytest.raises(SystemExit) as e:
        parse(["logs", "decode-0", "-o", "json"])
    assert e.value.code == 2
    assert "-o json is not supported; logs prints: table" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["lint", "-o", "shell"])
    assert "lint prints: table, json, yaml" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["config", "--json", "-o", "yaml"])
    assert "--json and -o yaml disagree" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["schema", "-f", "x.toml"], "the schema is the same for every spec"),
        (["model", "-f", "x.toml", "tiny"], "drop -f/--set"),
        (["demo", "-f", "x.toml"], "pdctl up -f SPEC"),
        (["probe", "--fleet", "f"], "drop --fleet"),
        (["stop", "--backend", "k8s", "decode-0"], "drop --backend"),
        (["scale", "--backend", "local"], "Kubernetes only"),
        (["lint", "-f"], "needs a spec path"),
    ],
)
def test_an_option_a_command_cannot_use_is_refused_with_the_reason(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_stop_start_and_restart_take_instances():
    for verb in ("stop", "start", "restart"):
        args = parse([verb, "prefill-0", "decode-0", "--fleet", "f1"])
        assert args.instances == ["prefill-0", "decode-0"]
        assert (args.fleet, args._module) == ("f1", "cmd_instance")
    assert parse(["stop", "decode-0", "--grace", "3"]).grace == 3.0
    assert parse(["restart", "decode-0", "--ready-timeout", "9"]).ready_timeout == 9.0


def test_stop_asks_the_supervisor_for_each_instance(monkeypatch, capsys):
    calls: list[tuple[str, str, float]] = []
    monkeypatch.setattr(
        "pdctl.sdk.fleet.remote_stop",
        lambda fleet, name, grace: calls.append((fleet, name, grace)),
    )
    assert main(["stop", "prefill-0", "decode-0", "--fleet", "f1", "--grace", "2", "--json"]) == 0
    assert calls == [("f1", "prefill-0", 2.0), ("f1", "decode-0", 2.0)]
    assert json.loads(capsys.readouterr().out) == [
        {"fleet": "f1", "instance": "prefill-0", "result": "stopped"},
        {"fleet": "f1", "instance": "decode-0", "result": "stopped"},
    ]


def test_render_is_config_with_a_note(capsys):
    assert main(["config", "-f", GPU, "--json"]) == 0
    new = capsys.readouterr()
    assert main(["render", "-f", GPU, "--json"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out
    assert new.err == ""
    assert old.err == (
        "pdctl: `pdctl render` is deprecated; use `pdctl config` "
        "(render names vLLM's render server)\n"
    )
    assert main(["render", "-f", GPU, "--shell"]) == 0
    assert "use `pdctl config -o shell`" in capsys.readouterr().err


def test_render_json_on_k8s_keeps_the_command_lines_config_gives_the_manifests(capsys):
    k8s = str(EXAMPLES / "k8s-multinode.toml")
    assert main(["render", "-f", k8s, "--json"]) == 0
    assert {"argv", "engine_id"} <= set(json.loads(capsys.readouterr().out)[0])
    assert main(["config", "-f", k8s, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "List"
    assert main(["config", "-f", k8s, "--commands", "--json"]) == 0
    assert {"argv", "engine_id"} <= set(json.loads(capsys.readouterr().out)[0])


def test_status_once_is_metrics_once_with_a_note(monkeypatch, capsys):
    seen: list[argparse.Namespace] = []

    def snapshot(args: argparse.Namespace) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr("pdctl.cli.metricsview.print_snapshot", snapshot)
    monkeypatch.setattr("pdctl.cli.cmd_metrics.print_snapshot", snapshot)
    assert main(["status", "--once", "-f", GPU, "--timeout", "3"]) == 0
    assert main(["metrics", "--once", "-f", GPU, "--scrape-timeout", "3"]) == 0
    assert [a.scrape_timeout for a in seen] == [3.0, 3.0]
    assert capsys.readouterr().err.splitlines() == [
        "pdctl: `pdctl status --timeout` is deprecated; use `pdctl status --scrape-timeout`",
        "pdctl: `pdctl status --once` is deprecated; use `pdctl metrics --once`",
    ]


def test_top_once_still_prints_the_uis_first_update_with_a_note(capsys):
    replay = str(FIXTURES / "vllm-cpu-0.32")
    assert main(["top", "--once", "--replay", replay]) in (0, 1)
    out = capsys.readouterr()
    assert "snapshot" in json.loads(out.out)
    assert "use `pdctl metrics --once`" in out.err


def test_old_timeouts_and_old_follow_still_work_with_a_note(capsys):
    assert parse(["up", "--timeout", "5"]).ready_timeout == 5.0
    assert parse(["demo", "--timeout", "6"]).ready_timeout == 6.0
    assert parse(["metrics", "--timeout", "7"]).scrape_timeout == 7.0
    err = capsys.readouterr().err
    assert "`pdctl up --timeout` is deprecated; use `pdctl up --ready-timeout`" in err
    assert "use `pdctl metrics --scrape-timeout`" in err
    old = parse(["logs", "decode-0", "-f", "-n", "5"])
    assert (old.bare_file, old.file, old.lines) == (True, None, 5)
    new = parse(["logs", "-f", "my.toml", "decode-0", "--follow"])
    assert (new.bare_file, new.file, new.follow) == (False, "my.toml", True)


def test_one_spelling_of_the_expected_kv_throughput(capsys):
    rules = ["config", "--prometheus-rules"]
    assert parse([*rules, "--expect-gbps", "5"]).expected_gbps == 5.0
    assert parse([*rules, "--expected-gbps", "5"]).expected_gbps == 5.0
    assert "use `pdctl config --expect-gbps`" in capsys.readouterr().err
    assert parse(["metrics", "--expect-gbps", "5"]).expect_gbps == 5.0


def test_old_dash_o_path_is_out_with_a_note(capsys):
    args = parse(["profile", "-o", "prof.json", "--json"])
    assert (args.out, args.output) == ("prof.json", "json")
    assert "use `pdctl profile --out PATH`" in capsys.readouterr().err


def test_cmd_modules_never_import_each_other():
    found = []
    for path in sorted(CLI.glob("cmd_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            found += [f"{path.name}: {n}" for n in names if n.startswith("pdctl.cli.cmd_")]
    assert found == []


def test_every_command_states_its_grammar():
    for sc in SUBCOMMANDS:
        assert cli_main._load(sc.module, "GRAMMAR").outputs, sc.name
        assert callable(cli_main._load(sc.module, sc.run)), sc.name
        assert subparser(build_parser(), sc.name).prog.startswith("pdctl ")


def test_no_command_with_an_output_format_is_refused(capsys, tmp_path: Path):
    with pytest.raises(SystemExit):
        parse(["-o", "json"])
    assert "with none pdctl opens the UI" in capsys.readouterr().err


def test_the_grammar_table_in_the_docs_is_the_code():
    rows = {}
    for line in (REPO / "docs" / "cli.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("`") and cells[1] in ("yes", "no"):
            rows[cells[0].strip("`")] = cells[1:]
    want = {}
    for sc in SUBCOMMANDS:
        g = cli_main._load(sc.module, "GRAMMAR")
        used = ["yes" if why is None else "no" for why in (g.spec, g.overrides, g.fleet)]
        want[sc.name] = [*used, ", ".join(g.backends) or "-", ", ".join(g.outputs)]
    assert rows == want
