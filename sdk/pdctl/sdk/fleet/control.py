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
import contextlib
import json
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pdctl.sdk.errors import PdctlError

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
READ_TIMEOUT_S = 10.0
MAX_LINE = 64 * 1024


class ControlError(PdctlError):
    """The supervisor could not be reached or refused the request."""


async def serve(path: Path, handler: Handler) -> asyncio.AbstractServer:
    _remove(path)

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
            except (TimeoutError, ValueError):  # silent too long, or a line over MAX_LINE
                return
            try:
                req = json.loads(line)
                if not isinstance(req, dict):
                    raise ValueError("not an object")
            except ValueError:
                reply: dict[str, Any] = {"ok": False, "error": "malformed request"}
            else:
                try:
                    reply = await handler(req)
                except PdctlError as e:
                    reply = {"ok": False, "error": str(e)}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # bound 0600 from the start: no window where others may connect
    try:
        sock.bind(str(path))
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old)
    return await asyncio.start_unix_server(on_client, sock=sock, limit=MAX_LINE)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


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
