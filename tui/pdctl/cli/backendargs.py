"""What follows from ``--backend``, shared by config, up, down and status."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pdctl.cli.common import load

if TYPE_CHECKING:
    from rich.console import Console

    from pdctl.sdk.backends import Backend, BackendStatus


def chosen_backend(args: argparse.Namespace) -> str:
    """--backend, else the spec's backend.kind; 'local' when the spec cannot be read (the
    local path then reports that as it always has). ``--backend`` also sets the spec's
    (see :func:`pdctl.cli.common.spec_overrides`)."""
    from pdctl.sdk.errors import SpecError

    if args.backend:
        return str(args.backend)
    if getattr(args, "fleet", None):
        return "local"
    try:
        return load(args).spec.backend.kind
    except SpecError:
        return "local"


def open_chosen_backend(
    args: argparse.Namespace, *, ready_timeout: float = 180.0, grace: float = 10.0
) -> Backend:
    """The backend of a non-local ``--backend``/``backend.kind`` (``--fleet`` names it)."""
    from pdctl.sdk.backends import open_backend

    loaded = load(args)
    return open_backend(loaded.spec, source=loaded.source, ready_timeout=ready_timeout, grace=grace)


def print_backend_status(st: BackendStatus, out: Console) -> None:
    """The instance table, then why each instance that is not ready is not."""
    from rich.markup import escape

    from pdctl.cli.fleetview import status_table

    out.print(status_table(st.instances, title=f"fleet {st.fleet} — {st.backend} {st.where}"))
    for i in st.instances:
        if i.log_tail:
            out.print(f"[bold]{i.name}[/] {i.state}: {escape(i.log_tail[-1])}")
            out.print(f"  logs: {i.log}", markup=False, highlight=False)
