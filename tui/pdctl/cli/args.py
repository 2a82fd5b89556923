"""The one grammar of the ``pdctl`` command line: options every command shares, what each
command does with them, and how its output is printed.

Every command gets the same parent parser (``-f/--file``, ``--set``, ``--fleet``,
``--backend``, ``-o/--output`` and ``--json``), and the top-level parser gets it too, so
``pdctl -f SPEC COMMAND`` and ``pdctl COMMAND -f SPEC`` mean the same (docker compose
style). A command states in its ``GRAMMAR`` which of them it uses; one it cannot use is
refused with a message that says why and what to do instead. Nothing here imports a
``cmd_*`` module (those never import each other either) or anything heavy.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

FORMATS = ("table", "json", "yaml", "shell")
BACKENDS = ("local", "k8s", "ray")
BARE_FILE = "\0-f without a value"
"""What ``-f`` holds when no path follows it (``pdctl logs X -f``, the old follow flag)."""

_COMMON = ("file", "overrides", "fleet", "backend", "output", "json")


@dataclass(frozen=True)
class Grammar:
    """What one command does with the shared options.

    ``outputs``: the ``-o`` formats it prints (the first is its default). ``spec``,
    ``overrides`` and ``fleet``: None when the command uses ``-f``, ``--set`` and
    ``--fleet`` (on a spec ``--fleet NAME`` is ``--set fleet.name=NAME``), else why it
    cannot. ``backends``: the ``--backend`` values it runs on. ``out_path``: the command
    writes files to ``--out PATH`` and takes the old ``-o PATH`` as a deprecated alias.
    ``bare_file``: the command gives ``-f`` without a value its own (deprecated) meaning.
    """

    outputs: tuple[str, ...] = ("table", "json", "yaml")
    spec: str | None = None
    overrides: str | None = None
    fleet: str | None = None
    backends: tuple[str, ...] = BACKENDS
    backend_why: str = ""
    out_path: bool = False
    bare_file: bool = False


def without_spec(no_spec: str, no_fleet: str, where: str) -> Grammar:
    """The grammar of a command that reads no spec and belongs to no fleet, and runs on
    this machine (``where`` says why a --backend does not apply)."""
    return Grammar(
        spec=no_spec, overrides=no_spec, fleet=no_fleet, backends=("local",), backend_why=where
    )


class HelpFormatter(argparse.HelpFormatter):
    """Shows ``-f SPEC`` (its value may only be left out by old spellings)."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if action.const == BARE_FILE:
            return str(action.metavar)
        return super()._format_args(action, default_metavar)


def common_parent(prefix: str = "", grammar: Grammar | None = None) -> argparse.ArgumentParser:
    """The options every command accepts, before or after its name (``prefix`` keeps the
    top-level parser's values apart from the command's; :func:`merge` joins them). With
    the command's ``grammar`` the help says what the command does with each."""
    gr = grammar or Grammar(outputs=FORMATS)

    def unused(why: str | None, text: str) -> str:
        return f"not used by this command: {why}" if why else text

    formats = ", ".join(gr.outputs)
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("options of every command (also before the command's name)")
    g.add_argument(
        "-f",
        "--file",
        dest=f"{prefix}file",
        metavar="SPEC",
        nargs="?",
        const=BARE_FILE,
        default=None,
        help=unused(gr.spec, "fleet spec (TOML); default ./pdctl.toml"),
    )
    g.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=None,
        dest=f"{prefix}overrides",
        help=unused(
            gr.overrides,
            "override a spec field, e.g. --set fleet.mode=pull --set prefill.0.tp=2 "
            "(repeatable; beats PDCTL_* environment variables, which beat the file)",
        ),
    )
    g.add_argument(
        "--fleet",
        metavar="NAME",
        default=None,
        dest=f"{prefix}fleet",
        help=unused(
            gr.fleet,
            "the fleet: a running one by name (default: fleet.name of the spec, or the "
            "only one running); on a spec the same as --set fleet.name=NAME",
        ),
    )
    g.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        dest=f"{prefix}backend",
        help="where the fleet runs (default: backend.kind of the spec, else local)"
        + (f"; {gr.backend_why}" if gr.backend_why else ""),
    )
    g.add_argument(
        "-o",
        "--output",
        metavar="FORMAT",
        default=None,
        dest=f"{prefix}output",
        help=f"output format: {formats}"
        + (" (table: for people)" if "table" in gr.outputs else ""),
    )
    g.add_argument("--json", action="store_true", dest=f"{prefix}json", help="the same as -o json")
    return p


def merge(args: argparse.Namespace, error: Any) -> None:
    """Join the options given before the command with those after it: ``--set`` adds up
    (the later wins), any other option may be given on either side, or on both when the
    values agree. ``error(message)`` reports a conflict (and exits). A ``-f`` without a
    value after the command sets ``args.bare_file`` instead of naming a spec."""
    args.bare_file = getattr(args, "file", None) == BARE_FILE
    if args.bare_file:
        args.file = None
    if getattr(args, "top_file", None) == BARE_FILE:
        error("-f/--file before the command needs a spec path, e.g. pdctl -f pdctl.toml")
    for name in _COMMON:
        top = getattr(args, f"top_{name}", None)
        mine = getattr(args, name, None)
        if name == "overrides":
            value: Any = [*(top or []), *(mine or [])]
        elif name == "json":
            value = bool(top or mine)
        elif top is not None and mine is not None and top != mine:
            flag = {"file": "-f/--file", "output": "-o/--output"}.get(name, f"--{name}")
            error(f"two different {flag} given, before and after the command: {top} and {mine}")
        else:
            value = mine if mine is not None else top
        setattr(args, name, value)
        if hasattr(args, f"top_{name}"):
            delattr(args, f"top_{name}")


def apply_grammar(args: argparse.Namespace, command: str, g: Grammar, error: Any) -> None:
    """Check the shared options against what ``command`` does with them and settle
    ``args.output`` (a format of ``g.outputs``, None when not given) and ``args.json``
    (``args.json_switch``: whether ``--json`` itself was given, for old spellings)."""
    args.json_switch = args.json
    if args.bare_file and not g.bare_file:
        error("-f/--file needs a spec path, e.g. -f pdctl.toml")
    if args.file is not None and g.spec is not None:
        error(g.spec)
    if args.overrides and g.overrides is not None:
        error(g.overrides)
    if args.fleet is not None and g.fleet is not None:
        error(g.fleet)
    if args.backend is not None and args.backend not in g.backends:
        why = g.backend_why or f"it runs on {', '.join(g.backends)} only"
        error(f"--backend {args.backend} does not apply ({why}); drop --backend")
    out = args.output
    if g.out_path and out is not None and out not in FORMATS:
        deprecated(f"pdctl {command} -o PATH", f"pdctl {command} --out PATH", "-o names a format")
        args.out, out = out, None
    if args.json:
        if out not in (None, "json"):
            error(f"--json and -o {out} disagree; give one of them")
        out = "json"
    if out is not None and out not in g.outputs:
        error(f"-o {out} is not supported; {command} prints: {', '.join(g.outputs)}")
    args.output = out
    args.json = out == "json"


def spec_given(args: argparse.Namespace) -> bool:
    """Did the command line name or change a spec (-f, --set, --fleet, --backend)? Commands
    that can run without one (preflight, bench, profile) then read it."""
    return any(getattr(args, k, None) for k in ("file", "overrides", "fleet", "backend"))


def deprecated(old: str, new: str, why: str = "") -> None:
    """The one-line note an old spelling prints (to stderr, so output stays parseable)."""
    note = f"pdctl: `{old}` is deprecated; use `{new}`" + (f" ({why})" if why else "")
    print(note, file=sys.stderr, flush=True)


class DeprecatedOption(argparse.Action):
    """An old option name that stores into the new one's ``dest`` and prints a note
    (``nargs=0`` with ``const``: an old switch that stores ``const``)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kw: Any) -> None:
        self.new: str = kw.pop("new")
        super().__init__(option_strings, dest, **kw)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        deprecated(f"{parser.prog} {option_string}", f"{parser.prog} {self.new}")
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_old_name(p: argparse._ActionsContainer, old: str, new: str, dest: str, **kw: Any) -> None:
    """``old``, hidden from the help: stores into ``new``'s ``dest`` with a note."""
    p.add_argument(old, dest=dest, action=DeprecatedOption, new=new, help=argparse.SUPPRESS, **kw)


def add_ready_timeout(p: argparse.ArgumentParser, what: str, old: bool = False) -> None:
    """``--ready-timeout S``: how long a readiness wait lasts (``old``: ``--timeout`` is
    its deprecated alias)."""
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=180.0,
        metavar="S",
        help=f"seconds to wait until {what} ready (default 180)",
    )
    if old:
        add_old_name(p, "--timeout", "--ready-timeout", "ready_timeout", type=float)


def add_monitor_arguments(p: argparse._ActionsContainer) -> None:
    """How metrics are scraped and summarised (metrics, top, the deprecated status --once);
    ``--timeout`` is the deprecated alias of ``--scrape-timeout``."""
    p.add_argument(
        "--window",
        type=float,
        default=60.0,
        help="sliding window for rates and quantiles, seconds (default 60)",
    )
    p.add_argument(
        "--scrape-timeout",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds one /metrics scrape of one instance may take (default 2)",
    )
    add_old_name(p, "--timeout", "--scrape-timeout", "scrape_timeout", type=float)
    p.add_argument(
        "--expect-gbps",
        type=float,
        default=None,
        help="expected KV transfer throughput (e.g. from preflight), GB/s",
    )


def add_source_arguments(p: argparse._ActionsContainer) -> None:
    """Where metrics come from when not from a spec's fleet (metrics, top): the instances'
    own URLs, or the operator's Prometheus."""
    g = p.add_argument_group("sources without a spec")
    for role in ("prefill", "decode"):
        g.add_argument(
            f"--{role}",
            metavar="URL",
            nargs="+",
            action="extend",
            default=[],
            help=f"scrape these {role} instances (http://host:port), no spec needed",
        )
    g.add_argument(
        "--router",
        metavar="URL",
        default=None,
        help="the router (its /metrics and recent requests); with --prometheus, where the "
        "recent requests are read",
    )
    g.add_argument(
        "--prometheus",
        metavar="URL",
        default=None,
        help="read the fleet from this Prometheus (three instant queries per update) "
        "instead of scraping every instance",
    )
    g.add_argument(
        "--selector",
        metavar="MATCHERS",
        default="",
        help="with --prometheus: PromQL label matchers naming the fleet, e.g. "
        "'fleet=\"demo\"' (default: every target Prometheus has)",
    )
    g.add_argument(
        "--instance-label",
        default="instance",
        help="with --prometheus: the label naming an instance (default instance)",
    )
    g.add_argument(
        "--role-label",
        default="role",
        help="with --prometheus: the label holding prefill/decode/router (default role)",
    )

    k = p.add_argument_group("Kubernetes discovery (pods by labels, followed with list + watch)")
    k.add_argument(
        "--k8s-preset",
        choices=("llm-d", "kserve", "dynamo", "pdctl"),
        default=None,
        help="the labels llm-d's chart, KServe's LLMInferenceService, Dynamo's operator or "
        "pdctl's k8s backend put on prefill/decode pods",
    )
    k.add_argument(
        "--k8s-namespace",
        metavar="NS",
        default=None,
        help="the pods' namespace (default: the kubeconfig context's, or the pod's own)",
    )
    for role in ("prefill", "decode", "router"):
        k.add_argument(
            f"--k8s-{role}-selector",
            metavar="LABELS",
            default=None,
            help=f"label selector of the {role} pods, e.g. 'llm-d.ai/role={role}' "
            "(replaces the preset's for that role)",
        )
    k.add_argument(
        "--k8s-port",
        metavar="NAME|N",
        default=None,
        help="the engines' container port, by name or number (default: the preset's, "
        "else the container's --port, else its first port)",
    )
    k.add_argument("--k8s-kubeconfig", metavar="FILE", default=None, help="kubeconfig to use")
    k.add_argument("--k8s-context", metavar="NAME", default=None, help="kubeconfig context")


def k8s_source(args: argparse.Namespace) -> bool:
    """Whether the command line asks for Kubernetes discovery."""
    return any(
        getattr(args, f"k8s_{n}", None)
        for n in ("preset", "namespace", "prefill_selector", "decode_selector", "router_selector")
    )


def spec_free_source(args: argparse.Namespace) -> bool:
    """Whether the command line names its source itself (no spec is read)."""
    return bool(
        k8s_source(args)
        or getattr(args, "prometheus", None)
        or getattr(args, "prefill", None)
        or getattr(args, "decode", None)
        or (getattr(args, "router", None) and not getattr(args, "file", None))
    )


def add_ui_arguments(p: argparse.ArgumentParser) -> None:
    """Options of the terminal UI itself (top and demo)."""
    p.add_argument(
        "--readonly", action="store_true", help="disable every action that changes the fleet"
    )
    p.add_argument(
        "--theme",
        default=None,
        help="Textual theme (default 'pdctl': the terminal's own colours; NO_COLOR honoured)",
    )


def add_address_argument(p: argparse.ArgumentParser) -> None:
    """``--address`` of the ray backend (up, down, status)."""
    p.add_argument(
        "--address",
        default=None,
        metavar="HOST:PORT",
        help="ray backend: the Ray cluster to use (its GCS address, or 'auto'); sets "
        "backend.ray.address and implies --backend ray",
    )


def apply_address(args: argparse.Namespace) -> None:
    """``--address`` → ``--backend ray`` and ``backend.ray.address``."""
    from pdctl.sdk.errors import PdctlError

    if not getattr(args, "address", None):
        return
    if args.backend not in (None, "ray"):
        raise PdctlError(f"--address is for the ray backend, not --backend {args.backend}")
    args.backend = "ray"
    args.overrides = [*args.overrides, f"backend.ray.address={args.address}"]


# ---------------------------------------------------------------------------- output


def to_yaml(doc: Any) -> str:
    """The JSON document as block-style YAML, keys in order (the SDK's own writer: no
    PyYAML needed). Through JSON first, so both formats hold the same values."""
    from pdctl.sdk.observability import to_yaml as dump

    return dump(json.loads(json.dumps(doc)))


def human(args: argparse.Namespace) -> bool:
    """Does the command print for a person (no ``-o``, or ``-o table``)?"""
    return args.output in (None, "table")


def emit(args: argparse.Namespace, doc: Any) -> bool:
    """Print ``doc`` when ``-o`` asked for json or yaml; False when the caller prints its
    table (or its own format) instead."""
    if args.output == "json":
        json.dump(doc, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    elif args.output == "yaml":
        sys.stdout.write(to_yaml(doc))
    else:
        return False
    return True


def emit_record(args: argparse.Namespace, doc: Any) -> None:
    """One record of a stream: a JSON line (NDJSON) or one YAML document."""
    if args.output == "yaml":
        sys.stdout.write("---\n" + to_yaml(doc))
    else:
        sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
