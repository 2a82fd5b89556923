"""One JSON object per line each way over a Unix socket: the server that answers such
requests (the fleet supervisor's control socket, a router worker's and its parent's
channel) and an asyncio client for it.

The socket is bound mode 0600 (only its owner may connect); a client gets
:data:`READ_TIMEOUT_S` to send its line of at most ``limit`` bytes. A request that is not
a JSON object is answered ``{"ok": false, "error": "malformed request"}``; a handler's
:class:`~pdctl.sdk.errors.PdctlError` is answered ``{"ok": false, "error": ...}``.
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
MAX_REPLY = 64 << 20
"""The longest reply :func:`ask` reads (a router worker's recent requests can be MiBs)."""


class LineSockError(PdctlError):
    """The other end could not be reached, did not answer in time or answered garbage."""


async def serve(path: Path, handler: Handler, limit: int = MAX_LINE) -> asyncio.AbstractServer:
    """Answer requests on a Unix socket at ``path`` (a stale file there is replaced)."""
    _remove(path)

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
            except (TimeoutError, ValueError):  # silent too long, or a line over the limit
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
    return await asyncio.start_unix_server(on_client, sock=sock, limit=limit)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def ask(path: str | Path, req: dict[str, Any], limit_s: float) -> dict[str, Any]:
    """Send one request to the server at ``path`` and return its reply (an object with
    ``"ok": true``); :class:`LineSockError` when it cannot be reached, is silent for
    ``limit_s`` seconds, answers garbage or refuses (its error is the message)."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(limit_s):
            reader, writer = await asyncio.open_unix_connection(str(path), limit=MAX_REPLY)
            writer.write(json.dumps(req).encode() + b"\n")
            await writer.drain()
            line = await reader.readline()
    except TimeoutError:
        raise LineSockError(f"{path} did not answer within {limit_s:g} s") from None
    except (OSError, ValueError) as e:
        raise LineSockError(f"cannot reach {path}: {e}") from None
    finally:
        if writer is not None:
            writer.close()
    try:
        reply = json.loads(line)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise LineSockError(f"{path} sent a malformed reply")
    if not reply.get("ok"):
        raise LineSockError(str(reply.get("error", "request refused")))
    return reply
