"""`pdctl events` over a fleet's journal: the table, JSON, filters, bad filters, a
stopped fleet's kept events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdctl.sdk.events import Event, Journal
from pdctl.sdk.fleet import fleet_dir


@pytest.fixture(autouse=True)
def own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own state directory (the unit tier's home is shared by a module)."""
    monkeypatch.setenv("PDCTL_STATE_DIR", str(tmp_path / "state"))


def journal(name: str = "demo") -> Path:
    d = fleet_dir(name)
    Journal.of(d).append(
        [
            Event("exited", "decode-0", "exited with code -9", at=1000.0, data={"code": -9}),
            Event("backoff", "decode-0", "restart in 1 s", at=1000.1),
            Event("control", "prefill-0", "stop", at=1000.05, actor="ops@h via pdctl stop"),
            Event("restarted", "decode-0", "", at=1003.0),
        ]
    )
    return d


def test_json_in_time_order_with_sources_and_who(capsys):
    from pdctl.cli.main import main

    journal()
    assert main(["events", "--fleet", "demo", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fleet"] == "demo"
    got = [(e["kind"], e["source"], e["subject"]) for e in doc["events"]]
    assert got == [
        ("exited", "supervisor", "decode-0"),
        ("control", "operator", "prefill-0"),
        ("backoff", "supervisor", "decode-0"),
        ("restarted", "supervisor", "decode-0"),
    ]
    assert doc["events"][1]["actor"] == "ops@h via pdctl stop"


def test_filters_and_the_table(capsys):
    from pdctl.cli.main import main

    journal()
    assert main(["events", "--fleet", "demo", "--kind", "exited", "--kind", "restarted"]) == 0
    out = capsys.readouterr().out
    assert "exited" in out
    assert "restarted" in out
    assert "backoff" not in out
    assert main(["events", "--fleet", "demo", "--source", "operator", "--json"]) == 0
    (ev,) = json.loads(capsys.readouterr().out)["events"]
    assert ev["kind"] == "control"
    assert main(["events", "--fleet", "demo", "--severity", "error", "--json"]) == 0
    assert [e["kind"] for e in json.loads(capsys.readouterr().out)["events"]] == ["exited"]
    assert main(["events", "--fleet", "demo", "-n", "1", "--json"]) == 0
    assert [e["kind"] for e in json.loads(capsys.readouterr().out)["events"]] == ["restarted"]


def test_a_bad_filter_names_the_known_values(capsys):
    from pdctl.cli.main import main

    journal()
    assert main(["events", "--fleet", "demo", "--kind", "crash"]) == 2
    out = capsys.readouterr().out
    assert "unknown event kind 'crash'" in out
    assert "exited" in out
    assert main(["events", "--fleet", "demo", "--source", "bob"]) == 2
    with pytest.raises(SystemExit):
        main(["events", "--fleet", "demo", "--since", "yesterday"])
    assert "--since 'yesterday'" in capsys.readouterr().err


def test_a_stopped_fleets_journal_is_found_without_naming_it(capsys):
    from pdctl.cli.main import main

    journal("only")  # no state.json: the fleet is down, its events are kept
    assert main(["events", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fleet"] == "only"
    assert main(["events", "--kinds", "--json"]) == 0
    kinds = {k["kind"]: k for k in json.loads(capsys.readouterr().out)}
    assert kinds["kv-release"]["source"] == "router"
