"""Who is acting, for the journal's control actions."""

from __future__ import annotations

import getpass
import os
import socket
import sys


def actor(via: str | None = None) -> str:
    """``user@host via pdctl restart`` (``via``: what asked; default this command)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    via = via or " ".join(["pdctl", *sys.argv[1:2]])
    return f"{user}@{socket.gethostname()} via {via}"
