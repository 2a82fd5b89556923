"""The router's audit log (``router-audit.jsonl`` beside its spec in the fleet's run
directory; :mod:`pdctl.sdk.router.audit` writes it) read as fleet events: a refused key
or role is an ``auth-failure``, a control action the router carried out ``audited``,
each with the key's name as its actor (never the key: the log holds none)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdctl.sdk.events import kinds as K
from pdctl.sdk.events.journal import Journal
from pdctl.sdk.events.model import Event

FILE = "router-audit.jsonl"


def audit_trail(fleet_dir: Path) -> Journal:
    """The default audit log of a local fleet (``router.audit.path`` unset)."""
    return Journal(fleet_dir / "run" / FILE, old_name=f"{FILE}.1", convert=from_entry)


def from_entry(d: Any) -> Event | None:
    """One audit line as an event; None for anything that is not one."""
    if not isinstance(d, dict):
        return None
    ts, action, result = d.get("ts"), d.get("action"), d.get("result")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not isinstance(action, str):
        return None
    if not isinstance(result, int) or isinstance(result, bool):
        return None
    who, peer = _str(d.get("who")) or "-", _str(d.get("from")) or "-"
    detail = _dict(d.get("detail"))
    request = _dict(detail.get("request"))
    subject = _str(request.get("instance"))
    refused = result in (401, 403)
    if refused:
        reason = detail.get("reason", "?")
        message = f"{action} from {peer}: {result} ({reason})"
    else:
        asked = " ".join(f"{k}={v}" for k, v in sorted(request.items()))
        message = f"{action} {asked} from {peer}: {result}".replace("  ", " ")
    return Event(
        K.AUTH_FAILURE if refused else K.AUDITED,
        subject,
        message,
        at=float(ts),
        actor=f"{who} via the router" if who != "-" else "no key",
        key=f"audit:{ts}:{action}:{peer}:{result}",
        data={"result": result, "from": peer, "tenant": d.get("tenant")},
    )


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}
