"""``pdctl`` entry point.

The parser is built from a table of subcommands; each handler lives in its own module
and is imported only when that subcommand runs, so ``pdctl --help`` stays fast and never
imports textual, vllm, nixl or torch.

Exit codes: 0 success; 1 warnings under ``--strict``; 2 invalid spec, lint errors or
another pdctl error; 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdctl.sdk.errors import PdctlError

VERSION = "0.1.0.dev0"


@dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    module: str
    """Module under pdctl.cli with ``add_arguments(parser)`` and ``run(args) -> int``."""


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("render", "print the exact vLLM command of every instance", "cmd_render"),
    Subcommand("lint", "check a fleet spec for known P/D failure modes before launch", "cmd_lint"),
    Subcommand("schema", "print the fleet spec's JSON schema", "cmd_schema"),
    Subcommand("up", "start the fleet and supervise it until Ctrl-C", "cmd_up"),
    Subcommand("status", "show every instance of a running fleet", "cmd_status"),
    Subcommand("metrics", "stream the fleet's derived metrics and alerts", "cmd_metrics"),
    Subcommand("logs", "print (or follow) an instance's log", "cmd_logs"),
    Subcommand("restart", "restart one instance of a running fleet", "cmd_restart"),
    Subcommand("down", "stop a running fleet", "cmd_down"),
    Subcommand("router", "run the push-aware disaggregation router", "cmd_router"),
    Subcommand("top", "the terminal UI on a fleet (also `pdctl` with no command)", "cmd_top"),
    Subcommand("demo", "start the local CPU P/D demo fleet and send it traffic", "cmd_demo"),
    Subcommand("model", "build the tiny local demo model", "cmd_model"),
    Subcommand("bench", "A/B push, push-sequential, pull and colocated on one budget", "cmd_bench"),
    Subcommand("preflight", "which path KV takes, and does disaggregation pay", "cmd_preflight"),
    Subcommand(
        "dashboards", "write Grafana dashboards for the fleet's Prometheus", "observability"
    ),
    Subcommand("probe", "measure real NIXL push transfers shaped like a model's KV", "cmd_probe"),
    Subcommand("profile", "measure prefill and decode curves of a spec's instance", "cmd_profile"),
    Subcommand("plan", "recommend a P:D layout for a workload and its SLOs", "cmd_plan"),
    Subcommand("scale", "set a group's instance count on Kubernetes", "cmd_scale"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdctl",
        description="Operate disaggregated prefill/decode vLLM fleets (NIXL push mode).",
        epilog="Exit codes: 0 ok, 1 warnings (--strict), 2 errors, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"pdctl {VERSION}")
    parser.add_argument(
        "-f",
        "--file",
        metavar="SPEC",
        default=None,
        dest="top_file",
        help="fleet spec for the command (as `COMMAND -f SPEC`); with no command, open the "
        "terminal UI on it (default ./pdctl.toml, else the fleet running here)",
    )
    parser.add_argument(
        "--readonly", action="store_true", help="with no command: a UI that changes nothing"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for sc in SUBCOMMANDS:
        sp = sub.add_parser(sc.name, help=sc.help, description=sc.help)
        sp.set_defaults(_module=sc.module)
        _load(sc.module, "add_arguments")(sp)
    return parser


def _load(module: str, attr: str) -> Callable[..., object]:
    mod = importlib.import_module(f"pdctl.cli.{module}")
    fn: Callable[..., object] = getattr(mod, attr)
    return fn


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.top_file is not None:
        # `pdctl -f SPEC COMMAND` means the same as `pdctl COMMAND -f SPEC`
        if not hasattr(args, "file"):
            parser.error(f"{args.command} takes no fleet spec: drop -f/--file")
        if args.file is None:
            args.file = args.top_file
        elif args.file != args.top_file:
            parser.error("two different specs given (-f before and after the command)")
    try:
        if not getattr(args, "_module", None):
            rc = _load("cmd_top", "no_command")(args, parser.print_help)
            return rc if isinstance(rc, int) else 0
        result = _load(args._module, "run")(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (e.g. `pdctl render --json | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except PdctlError as e:
        print(f"pdctl: {e}", file=sys.stderr)
        return e.exit_code
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
