"""``pdctl`` entry point.

The parser is built from a table of subcommands; each lives in its own ``cmd_*`` module
(which never imports another), with heavy imports inside its functions, so
``pdctl --help`` stays fast and never imports textual, vllm, nixl or torch. The options
every command shares, and what each does with them, are in :mod:`pdctl.cli.args`.

Exit codes: 0 success; 1 warnings under ``--strict``; 2 invalid spec, lint errors or
another pdctl error; 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdctl.cli.args import (
    Grammar,
    HelpFormatter,
    apply_grammar,
    common_parent,
    deprecated,
    merge,
)
from pdctl.sdk import __version__
from pdctl.sdk.errors import PdctlError

VERSION = __version__


@dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    module: str
    """Module under pdctl.cli with ``add_arguments(parser)``, ``GRAMMAR`` (what it does
    with the shared options, see :mod:`pdctl.cli.args`) and the ``run`` function."""
    run: str = "run"
    deprecated_for: str | None = None
    """An old name: it still works and prints a one-line note naming this command."""
    why: str = ""


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("config", "print what the spec launches: every instance's vLLM command, the "
               "k8s manifests, the Prometheus configuration", "cmd_config"),
    Subcommand("render", "deprecated name of `config`", "cmd_config", run="run_render",
               deprecated_for="config", why="render names vLLM's render server"),
    Subcommand("lint", "check a fleet spec for known P/D failure modes before launch", "cmd_lint"),
    Subcommand("schema", "print the fleet spec's JSON schema", "cmd_schema"),
    Subcommand("up", "start the fleet and supervise it until Ctrl-C", "cmd_up"),
    Subcommand("status", "show every instance of a running fleet", "cmd_status"),
    Subcommand("metrics", "the fleet's derived metrics and alerts: one snapshot (--once) "
               "or a stream", "cmd_metrics"),
    Subcommand("logs", "print (or follow) an instance's log", "cmd_logs"),
    Subcommand("events", "the fleet's events in time order (filter, follow)", "cmd_events"),
    Subcommand("stop", "stop instances of a running fleet and leave them stopped",
               "cmd_instance", run="run_stop"),
    Subcommand("start", "start stopped instances of a running fleet again",
               "cmd_instance", run="run_start"),
    Subcommand("restart", "restart instances of a running fleet, waiting until ready",
               "cmd_instance", run="run_restart"),
    Subcommand("down", "stop a running fleet", "cmd_down"),
    Subcommand("audit", "every listener of a running fleet, probed as an outsider: what "
               "answers without credentials, and the fix", "cmd_audit"),
    Subcommand("router", "run the push-aware disaggregation router", "cmd_router"),
    Subcommand("top", "the terminal UI on a fleet (also `pdctl` with no command)", "cmd_top"),
    Subcommand("demo", "start the local CPU P/D demo fleet and send it traffic", "cmd_demo"),
    Subcommand("model", "build the tiny local demo model", "cmd_model"),
    Subcommand("bench", "A/B push, push-sequential, pull and colocated on one budget", "cmd_bench"),
    Subcommand("preflight", "which path KV takes, and does disaggregation pay", "cmd_preflight"),
    Subcommand("dashboards", "write Grafana dashboards for the fleet's Prometheus",
               "cmd_dashboards"),
    Subcommand("probe", "measure real NIXL push transfers shaped like a model's KV", "cmd_probe"),
    Subcommand("profile", "measure prefill and decode curves of a spec's instance", "cmd_profile"),
    Subcommand("plan", "recommend a P:D layout for a workload and its SLOs", "cmd_plan"),
    Subcommand("scale", "set a group's instance count on Kubernetes", "cmd_scale"),
    Subcommand("selftest", "the GPU smoke kit: inventory, preflight, probe and a 1P1D pair "
               "on this GPU, one report", "cmd_selftest"),
)  # fmt: skip
BY_NAME = {sc.name: sc for sc in SUBCOMMANDS}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdctl",
        description="Operate disaggregated prefill/decode vLLM fleets (NIXL push mode). "
        "The options below work before or after any command's name, with the same effect; "
        "with no command, pdctl opens the terminal UI on -f SPEC (default ./pdctl.toml, "
        "else the fleet running here).",
        epilog="Exit codes: 0 ok, 1 warnings (--strict), 2 errors, 130 interrupted.",
        parents=[common_parent("top_")],
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pdctl {VERSION}")
    parser.add_argument(
        "--readonly", action="store_true", help="with no command: a UI that changes nothing"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for sc in SUBCOMMANDS:
        # an old name's parser speaks as the new one (usage, deprecation notes)
        prog = f"pdctl {sc.deprecated_for or sc.name}"
        sp = sub.add_parser(
            sc.name,
            help=sc.help,
            description=sc.help,
            parents=[common_parent(grammar=_load(sc.module, "GRAMMAR"))],
            prog=prog,
            formatter_class=HelpFormatter,
        )
        sp.set_defaults(_module=sc.module)
        _load(sc.module, "add_arguments")(sp)
    return parser


def _load(module: str, attr: str) -> Any:
    return getattr(importlib.import_module(f"pdctl.cli.{module}"), attr)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The parsed command line, with the shared options joined (given before or after the
    command) and checked against the command's grammar; exits 2 on a usage error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    merge(args, parser.error)
    if args.command is None:
        if args.output is not None or args.json:
            parser.error("-o/--json apply to a command; with none pdctl opens the UI")
        return args
    grammar: Grammar = _load(args._module, "GRAMMAR")
    apply_grammar(args, args.command, grammar, subparser(parser, args.command).error)
    return args


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of one command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sp: argparse.ArgumentParser = action.choices[name]
            return sp
    raise KeyError(name)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        if args.command is None:
            rc = _load("cmd_top", "no_command")(args, build_parser().print_help)
            return rc if isinstance(rc, int) else 0
        sc = BY_NAME[args.command]
        if sc.deprecated_for is not None:
            deprecated(f"pdctl {sc.name}", f"pdctl {sc.deprecated_for}", sc.why)
        result = _load(sc.module, sc.run)(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (e.g. `pdctl config --json | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except PdctlError as e:
        print(f"pdctl: {e}", file=sys.stderr)
        return e.exit_code
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
