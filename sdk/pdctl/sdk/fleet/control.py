"""The supervisor's control socket: other shells ask it to restart an instance or stop.

Protocol: one JSON object per line each way, over a Unix socket in the fleet's state
directory. Requests: ``{"cmd": "ping"}``, ``{"cmd": "restart", "name": N}``,
``{"cmd": "stop", "name": N}``, ``{"cmd": "down"}``, ``{"cmd": "suspect", "name": N,
"why": W}`` (the router saw N fail: the supervisor checks its health at once).
Replies: ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``.

The socket is created mode 0600 (only the fleet's owner may connect); a client gets
:data:`READ_TIMEOUT_S` to send its line of at most :data:`MAX_LINE` bytes.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

from pdctl.sdk import linesock
from pdctl.sdk.errors import PdctlError
from pdctl.sdk.linesock import MAX_LINE, READ_TIMEOUT_S, Handler

__all__ = ["MAX_LINE", "READ_TIMEOUT_S", "ControlError", "Handler", "request", "serve"]


class ControlError(PdctlError):
    """The supervisor could not be reached or refused the request."""


async def serve(path: Path, handler: Handler) -> asyncio.AbstractServer:
    return await linesock.serve(path, handler, MAX_LINE)


def request(path: str | Path, req: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Send one request and wait up to ``timeout`` seconds for the reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(path))
            s.sendall(json.dumps(req).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        except TimeoutError:
            raise ControlError(
                f"the fleet supervisor did not answer within {timeout:g} s"
            ) from None
        except OSError as e:
            raise ControlError(f"cannot reach the fleet supervisor at {path}: {e}") from None
    try:
        reply = json.loads(buf)
    except ValueError:
        raise ControlError("the fleet supervisor sent a malformed reply") from None
    if not isinstance(reply, dict):
        raise ControlError("the fleet supervisor sent a malformed reply")
    if not reply.get("ok"):
        raise ControlError(str(reply.get("error", "request refused")))
    return reply
