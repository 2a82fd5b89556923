"""``pdctl schema``: the fleet spec's JSON schema (for editors and documentation)."""

from __future__ import annotations

import argparse

from pdctl.cli.args import Grammar, emit

_SAME = "the schema is the same for every spec: drop -f/--set"
GRAMMAR = Grammar(
    outputs=("json", "yaml"),
    spec=_SAME,
    overrides=_SAME,
    fleet="the schema is the same for every fleet: drop --fleet",
    backends=(),
    backend_why="one schema covers every backend",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    del p


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.spec import spec_json_schema

    args.output = args.output or "json"
    emit(args, spec_json_schema())
    return 0
