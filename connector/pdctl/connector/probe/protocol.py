"""The push protocol's two notifications (pure).

* Registration, target → initiator: ``PUSH_REG:`` + a payload naming the target's
  request id, engine id, TP size and destination block ids (vLLM encodes the payload
  with msgpack; the probe uses JSON so it needs nothing beyond NIXL and numpy).
* Completion, attached to each WRITE: ``"<target request id>:<initiator TP size>"``;
  the target waits for one per initiator rank.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

REG_PREFIX = b"PUSH_REG:"
_SUFFIX = re.compile(r"-[0-9a-f]{8}$", re.IGNORECASE)


class ProtocolError(ValueError):
    """A notification that does not parse; the message quotes it."""


@dataclass(frozen=True)
class Registration:
    request_id: str
    engine_id: str
    tp_size: int
    block_ids: tuple[int, ...]
    verify: bool = False
    """Ask the initiator to report a checksum of the source bytes (probe only)."""


def base_request_id(request_id: str) -> str:
    """The id without the random ``-xxxxxxxx`` suffix each engine appends."""
    return _SUFFIX.sub("", request_id)


def encode_registration(reg: Registration) -> bytes:
    body = {
        "request_id": reg.request_id,
        "engine_id": reg.engine_id,
        "tp_size": reg.tp_size,
        "block_ids": list(reg.block_ids),
        "verify": reg.verify,
    }
    return REG_PREFIX + json.dumps(body, separators=(",", ":")).encode()


def is_registration(msg: bytes) -> bool:
    return msg.startswith(REG_PREFIX)


def decode_registration(msg: bytes) -> Registration:
    if not is_registration(msg):
        raise ProtocolError(f"not a registration: {_show(msg)}")
    try:
        body = json.loads(msg[len(REG_PREFIX) :])
    except ValueError:
        raise ProtocolError(f"registration payload is not JSON: {_show(msg)}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"registration payload is not an object: {_show(msg)}")
    rid, engine, tp, blocks = (
        body.get(k) for k in ("request_id", "engine_id", "tp_size", "block_ids")
    )
    if not isinstance(rid, str) or not rid:
        raise ProtocolError(f"registration without request_id: {_show(msg)}")
    if not isinstance(engine, str) or not isinstance(tp, int) or tp < 1:
        raise ProtocolError(f"registration {rid!r}: bad engine_id or tp_size: {_show(msg)}")
    if not isinstance(blocks, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in blocks
    ):
        raise ProtocolError(f"registration {rid!r}: block_ids must be non-negative integers")
    return Registration(rid, engine, tp, tuple(blocks), bool(body.get("verify", False)))


def completion_notif(request_id: str, tp_size: int) -> bytes:
    return f"{request_id}:{tp_size}".encode()


def parse_completion(msg: bytes) -> tuple[str, int]:
    """``(request id, initiator TP size)`` of a WRITE's completion notification."""
    try:
        text = msg.decode()
    except UnicodeDecodeError:
        raise ProtocolError(f"completion notification is not UTF-8: {_show(msg)}") from None
    rid, sep, tp = text.rpartition(":")
    if not sep or not rid or not tp.isdigit() or int(tp) < 1:
        raise ProtocolError(
            f"completion notification is not '<request id>:<tp size>': {_show(msg)}"
        )
    return rid, int(tp)


def _show(msg: bytes, limit: int = 80) -> str:
    return repr(msg[:limit]) + ("..." if len(msg) > limit else "")
