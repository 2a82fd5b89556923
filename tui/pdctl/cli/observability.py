"""``pdctl config --prometheus`` / ``--prometheus-rules``: what a fleet hands to
Prometheus (``pdctl dashboards`` gives Grafana its part)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pdctl.cli.args import add_old_name
from pdctl.cli.common import console, load, print_findings, summary_line


def add_prometheus_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Prometheus")
    what = g.add_mutually_exclusive_group()
    what.add_argument(
        "--prometheus",
        action="store_true",
        help="a Prometheus scrape configuration for every instance and the router "
        "(k8s backend: a PodMonitor)",
    )
    what.add_argument(
        "--prometheus-rules",
        action="store_true",
        help="pdctl's alerts (PA001...) as Prometheus alerting rules",
    )
    g.add_argument(
        "--file-sd",
        action="store_true",
        help="with --prometheus: file_sd targets (JSON) instead of a whole prometheus.yml",
    )
    g.add_argument(
        "--scrape-interval", default="5s", help="with --prometheus: scrape interval (5s)"
    )
    g.add_argument(
        "--rule-file",
        action="append",
        default=[],
        metavar="PATH",
        help="with --prometheus: a rule file for prometheus.yml to load (repeatable)",
    )
    g.add_argument(
        "--window",
        default="1m",
        help="with --prometheus-rules: range of the counter conditions (1m, the monitor's)",
    )
    g.add_argument(
        "--down-for",
        default="15s",
        help="with --prometheus-rules: how long an instance is down before PA006 fires",
    )
    g.add_argument(
        "--expect-gbps",
        dest="expected_gbps",
        type=float,
        default=None,
        help="with --prometheus-rules: expected KV throughput (GB/s, see `pdctl preflight`); "
        "adds PA004",
    )
    add_old_name(g, "--expected-gbps", "--expect-gbps", "expected_gbps", type=float)


def _emit(doc: Any, as_json: bool) -> None:
    from pdctl.sdk.observability import to_yaml

    print(json.dumps(doc, indent=2) if as_json else to_yaml(doc), end="" if not as_json else "\n")


def print_prometheus(args: argparse.Namespace) -> int:
    from pdctl.cli.backendargs import chosen_backend
    from pdctl.sdk.lint import lint
    from pdctl.sdk.observability import (
        RuleOptions,
        file_sd,
        pod_monitor,
        rule_groups,
        scrape_config,
        scrape_targets,
    )

    k8s = chosen_backend(args) == "k8s"
    as_json = args.output == "json"
    loaded = load(args)
    report = lint(loaded.spec, check_bound_ports=False)
    if report.errors or report.plan is None:
        err = console(stderr=True)
        print_findings(report.errors, err)
        err.print(f"[bold red]error[/]: {summary_line(report, loaded.source)}; nothing printed")
        return 2
    spec, plan = loaded.spec, report.plan
    if args.prometheus_rules:
        gbps = args.expected_gbps
        opt = RuleOptions(
            window=args.window,
            down_for=args.down_for,
            expected_throughput_bps=None if gbps is None else gbps * 1e9,
        )
        _emit(rule_groups(spec, opt), as_json)
    elif k8s:
        _emit(pod_monitor(spec), as_json)
    elif args.file_sd:
        print(json.dumps(file_sd(scrape_targets(spec, plan)), indent=2))
    else:
        cfg = scrape_config(spec, plan, interval=args.scrape_interval, rule_files=args.rule_file)
        _emit(cfg, as_json)
    return 0
