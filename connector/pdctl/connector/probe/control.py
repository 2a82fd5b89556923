"""The probe's out-of-band channel: JSON lines over one TCP connection, every read with a
timeout. It carries agent metadata, pool addresses and the workload schedule; the KV
bytes and the push protocol's notifications go through NIXL."""

from __future__ import annotations

import base64
import contextlib
import json
import select
import socket
from typing import Any


class ProbeError(RuntimeError):
    """The probe cannot go on; the message says what happened and what to do."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise ProbeError("control channel: expected base64 text")
    return base64.b64decode(text)


class Control:
    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self._buf = b""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, msg: dict[str, Any]) -> None:
        try:
            self.sock.sendall(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        except OSError as e:
            raise ProbeError(f"control channel to {self.peer} broke: {e}") from None

    def recv(self, timeout_s: float, expect: str | None = None) -> dict[str, Any]:
        """The next message, waiting at most ``timeout_s``."""
        msg = self.poll(timeout_s)
        if msg is None:
            what = f"a {expect!r} message" if expect else "a message"
            raise ProbeError(f"no {what} from {self.peer} within {timeout_s:g} s (--timeout)")
        if expect and msg.get("type") != expect:
            detail = msg.get("error") or msg
            raise ProbeError(f"{self.peer}: expected {expect!r}, got {detail}")
        return msg

    def poll(self, timeout_s: float = 0.0) -> dict[str, Any] | None:
        """A complete message if one arrives within ``timeout_s``, else None."""
        while b"\n" not in self._buf:
            ready, _, _ = select.select([self.sock], [], [], timeout_s)
            if not ready:
                return None
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError as e:
                raise ProbeError(f"control channel to {self.peer} broke: {e}") from None
            if not chunk:
                raise ProbeError(f"{self.peer} closed the control channel")
            self._buf += chunk
            timeout_s = 0.0 if b"\n" in self._buf else timeout_s
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except ValueError:
            raise ProbeError(f"{self.peer} sent a malformed control message") from None
        if not isinstance(msg, dict):
            raise ProbeError(f"{self.peer} sent a malformed control message")
        return msg

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def parse_hostport(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = default_host, text
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ProbeError(f"expected HOST:PORT or PORT, got {text!r}")
    return host.strip("[]") or default_host, int(port)
