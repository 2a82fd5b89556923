"""``pdctl render``: the exact command line and environment of every instance."""

from __future__ import annotations

import argparse
import sys

from pdctl.cli.backendargs import add_backend_argument, chosen_backend
from pdctl.cli.common import (
    add_spec_arguments,
    console,
    load,
    print_findings,
    print_json,
    spec_error_json,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_spec_arguments(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="a JSON list, one object per instance")
    fmt.add_argument("--shell", action="store_true", help="a shell script, one line per instance")
    add_backend_argument(p)
    from pdctl.cli.observability import add_render_arguments

    add_render_arguments(p)
    p.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json"),
        default=None,
        help="k8s backend: multi-document YAML (default) or one JSON List",
    )


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.errors import SpecError
    from pdctl.sdk.lint import lint

    if args.prometheus or args.prometheus_rules:
        from pdctl.cli.observability import render_prometheus

        return render_prometheus(args)
    if chosen_backend(args) == "k8s" and not (args.json or args.shell):
        return _manifests(args)
    try:
        loaded = load(args)
    except SpecError as e:
        if args.json:
            print_json(spec_error_json(e))
        else:
            console(stderr=True).print(f"[bold red]error[/]: {e}")
        return 2
    # Ports bound right now (e.g. by the running fleet) do not make the plan wrong.
    report = lint(loaded.spec, check_bound_ports=False)
    if report.errors or report.plan is None:
        if args.json:
            d = report.as_dict()
            d["source"] = loaded.source
            print_json(d)
        else:
            err = console(stderr=True)
            print_findings(report.errors, err)
            err.print(
                f"[bold red]error[/]: {loaded.source} has {len(report.errors)} lint error(s); "
                "nothing rendered (see `pdctl lint`)"
            )
        return 2
    plan = report.plan
    if args.json:
        print_json([inst.as_json() for inst in plan.instances])
        return 0
    if args.shell:
        print("#!/usr/bin/env bash")
        print(f"# rendered by pdctl from {loaded.source}; one line per instance")
        for inst in plan.instances:
            print(f"# {inst.name}: {inst.role} on {inst.host}, engine {inst.engine_id}")
            print(inst.shell())
        return 0
    out = console()
    for inst in plan.instances:
        ports = f"http {inst.http_port}"
        if inst.side_channel_ports:
            ports += ", side channel " + ",".join(str(p) for p in inst.side_channel_ports)
        where = ", ".join(
            x
            for x in (
                f"GPUs {','.join(map(str, inst.devices))}" if inst.devices else "",
                f"cores {','.join(map(str, inst.cpu_cores))}" if inst.cpu_cores else "",
            )
            if x
        )
        out.print(
            f"[bold]{inst.name}[/] [cyan]{inst.role}[/] {inst.host} ({ports})"
            + (f" engine [magenta]{inst.engine_id}[/]" if inst.engine_id else "")
            + (f" {where}" if where else "")
        )
        out.print(inst.shell(), markup=False, soft_wrap=True)
        out.print()
    if plan.router:
        out.print(f"[bold]router[/] {plan.router.host}:{plan.router.port}")
    for f in report.warnings:
        out.print(f"[yellow]warning[/] {f.code} {f.field}: {f.message}")
    return 0


def _manifests(args: argparse.Namespace) -> int:
    """The backend's manifests (k8s: YAML or a JSON List); --json and --shell still give
    the instances' command lines."""
    from pdctl.cli.common import summary_line
    from pdctl.sdk.backends.k8s import build_manifests, to_json, to_yaml
    from pdctl.sdk.lint import lint

    loaded = load(args)
    report = lint(loaded.spec, check_bound_ports=False)
    err = console(stderr=True)
    if report.errors or report.plan is None:
        print_findings(report.errors, err)
        err.print(f"[bold red]error[/]: {summary_line(report, loaded.source)}; nothing rendered")
        return 2
    docs = build_manifests(loaded.spec, report.plan)
    sys.stdout.write(to_json(docs) if args.output == "json" else to_yaml(docs))
    for f in report.warnings:
        err.print(f"[yellow]warning[/] {f.code} {f.field}: {f.message}")
    return 0
