"""``pdctl schema``: the fleet spec's JSON schema (for editors and documentation)."""

from __future__ import annotations

import argparse

from pdctl.cli.common import print_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    del p


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk.spec import spec_json_schema

    print_json(spec_json_schema())
    return 0
