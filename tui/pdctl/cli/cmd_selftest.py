"""``pdctl selftest --gpu``: the GPU smoke kit (docs/gpu-smoke.md).

Runs on one GPU machine, without network, in under 10 minutes: the inventory, the live
preflight, the NIXL probe VRAM → VRAM under both sync modes (checksums, the UCX lane)
and a 1P1D pair of pdctl's push connector on the GPU answering 20 requests. Writes
``selftest.json`` and ``selftest.txt`` to ``--out``. Exit codes: 0 every step passed, 1 a
step failed or was skipped, 2 bad options.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pdctl.cli.args import emit, without_spec
from pdctl.cli.common import console

GRAMMAR = without_spec(
    "the selftest takes no fleet spec: it starts its own pair",
    "the selftest runs outside any fleet: drop --fleet",
    "the selftest checks this machine",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu", action="store_true", help="the GPU smoke kit (the only kit so far; required)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("pdctl-selftest"),
        help="directory for selftest.json and selftest.txt (default ./pdctl-selftest)",
    )
    p.add_argument("--requests", type=int, default=20, help="completions through the pair (20)")
    p.add_argument("--device", type=int, default=0, help="the GPU the pair shares (0)")
    p.add_argument(
        "--model",
        type=Path,
        help="the tiny model's directory (default: built locally, as `pdctl demo` does)",
    )


def run(args: argparse.Namespace) -> int:
    from pdctl.sdk import selftest
    from pdctl.sdk.errors import PdctlError
    from pdctl.sdk.selftest import DEADLINE_S, GpuOptions, run_steps, write_report

    if not args.gpu:
        raise PdctlError("selftest: say which kit: pdctl selftest --gpu")
    if args.requests < 1:
        raise PdctlError(f"selftest: --requests {args.requests}: send at least 1")
    if args.model is None:
        from pdctl.sdk import ensure_tiny_model

        try:
            args.model = ensure_tiny_model()
        except PdctlError as e:
            raise PdctlError(f"selftest: no tiny model ({e}); pass --model DIR") from None
    opts = GpuOptions(model=args.model, requests=args.requests, device=args.device)
    out = console(stderr=args.output == "json")

    def progress(res: object) -> None:
        out.print(f"  {getattr(res, 'outcome', '?'):7s} {getattr(res, 'title', '')}", markup=False)

    report = run_steps("gpu", selftest.gpu_steps(opts), deadline_s=DEADLINE_S, on_step=progress)
    js, txt = write_report(report, args.out)
    if not emit(args, report.as_dict()):
        out.print(report.text(), end="", markup=False, highlight=False)
        out.print(f"report: {js} and {txt}")
    return 0 if report.ok else 1
