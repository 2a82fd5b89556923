"""``pdctl config``: what a spec launches, resolved (docker compose's ``config``): the
exact command line and environment of every instance, the k8s manifests, or the
Prometheus configuration. Nothing starts. ``pdctl render`` is its deprecated old name
(*render* names vLLM's render server), kept as it was (:func:`run_render`).

Formats (``-o``): ``table`` (default; on k8s ``yaml``), ``json``, ``yaml`` (the instances,
or on k8s the manifests), ``shell`` (a script, one line per instance). Exit codes: 0
printed, 2 invalid spec or lint errors (nothing printed on stdout).
"""

from __future__ import annotations

import argparse
import sys

from pdctl.cli.args import FORMATS, Grammar, add_old_name, emit
from pdctl.cli.backendargs import chosen_backend
from pdctl.cli.common import (
    console,
    load,
    print_findings,
    spec_error_json,
    summary_line,
)
from pdctl.cli.observability import add_prometheus_arguments, print_prometheus

GRAMMAR = Grammar(outputs=FORMATS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_old_name(p, "--shell", "-o shell", "output", nargs=0, const="shell")
    p.add_argument(
        "--commands",
        action="store_true",
        help="the instances' command lines also with the k8s backend (whose -o json|yaml "
        "default is its manifests)",
    )
    add_prometheus_arguments(p)


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.errors import PdctlError, SpecError
    from pdctl.sdk.lint import lint

    if args.prometheus or args.prometheus_rules:
        if args.output not in (None, "json", "yaml"):
            raise PdctlError(f"--prometheus prints yaml or json, not -o {args.output}")
        return print_prometheus(args)
    commands = args.commands or args.output in ("table", "shell")
    if not commands and chosen_backend(args) == "k8s":
        return _manifests(args)  # -o yaml (default) or json; table and shell: the commands
    try:
        loaded = load(args)
    except SpecError as e:
        if not emit(args, spec_error_json(e)):
            console(stderr=True).print(f"[bold red]error[/]: {e}")
        return 2
    # Ports bound right now (e.g. by the running fleet) do not make the plan wrong.
    report = lint(loaded.spec, check_bound_ports=False)
    if report.errors or report.plan is None:
        d = report.as_dict()
        d["source"] = loaded.source
        if not emit(args, d):
            err = console(stderr=True)
            print_findings(report.errors, err)
            err.print(
                f"[bold red]error[/]: {loaded.source} has {len(report.errors)} lint error(s); "
                "nothing printed (see `pdctl lint`)"
            )
        return 2
    plan = report.plan
    if emit(args, [inst.as_json() for inst in plan.instances]):
        return 0
    if args.output == "shell":
        print("#!/usr/bin/env bash")
        print(f"# written by pdctl config from {loaded.source}; one line per instance")
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


def run_render(args: argparse.Namespace) -> int:
    """The deprecated ``pdctl render``: ``config`` as it was, where ``--json`` meant the
    command lines on every backend (on k8s, ``config --json`` is ``-o json``: the
    manifests; the command lines are ``config --commands -o json``)."""
    args.commands = args.commands or args.json_switch
    return run(args)


def _manifests(args: argparse.Namespace) -> int:
    """The backend's manifests: multi-document YAML, or one JSON List with ``-o json``."""
    from pdctl.sdk.backends.k8s import build_manifests, to_json, to_yaml
    from pdctl.sdk.lint import lint

    loaded = load(args)
    report = lint(loaded.spec, check_bound_ports=False)
    err = console(stderr=True)
    if report.errors or report.plan is None:
        print_findings(report.errors, err)
        err.print(f"[bold red]error[/]: {summary_line(report, loaded.source)}; nothing printed")
        return 2
    docs = build_manifests(loaded.spec, report.plan)
    sys.stdout.write(to_json(docs) if args.output == "json" else to_yaml(docs))
    for f in report.warnings:
        err.print(f"[yellow]warning[/] {f.code} {f.field}: {f.message}")
    return 0
