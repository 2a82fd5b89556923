"""What the OS says is listening, and in which process: the ``ss -ltnp`` view, read from
Linux's ``/proc/net/tcp``, ``/proc/net/tcp6`` and each process's ``/proc/PID/fd``.

The parsers are pure (text in, tuples out); :func:`listening` does the reading.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"
"""TCP_LISTEN in the ``st`` column (include/net/tcp_states.h)."""


@dataclass(frozen=True)
class Socket:
    """One listening TCP socket."""

    host: str
    port: int
    inode: int


@dataclass(frozen=True)
class OsListener:
    host: str
    port: int
    pid: int
    process: str
    fd: int


def _addr(hexaddr: str) -> str:
    """``/proc/net/tcp``'s address: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hexaddr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def parse_proc_net_tcp(text: str) -> list[Socket]:
    """The listening sockets of one ``/proc/net/tcp`` or ``tcp6`` table."""
    out: list[Socket] = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10 or cols[3] != LISTEN:
            continue
        host, _, port = cols[1].partition(":")
        try:
            out.append(Socket(_addr(host), int(port, 16), int(cols[9])))
        except ValueError:
            continue
    return out


def socket_inodes(fd_links: Mapping[int, str]) -> dict[int, int]:
    """inode → fd of the links of one ``/proc/PID/fd`` (``socket:[12345]``)."""
    out: dict[int, int] = {}
    for fd, target in fd_links.items():
        if target.startswith("socket:[") and target.endswith("]"):
            out[int(target[8:-1])] = fd
    return out


def attribute(
    sockets: Iterable[Socket], fds: Mapping[int, Mapping[int, str]], names: Mapping[int, str]
) -> list[OsListener]:
    """The listening sockets held by the processes ``fds`` (pid → fd links); a socket
    shared by several (inherited across fork) is given to the lowest pid."""
    by_inode: dict[int, tuple[int, int]] = {}
    for pid in sorted(fds):
        for inode, fd in socket_inodes(fds[pid]).items():
            by_inode.setdefault(inode, (pid, fd))
    out: list[OsListener] = []
    for s in sockets:
        if s.inode in by_inode:
            pid, fd = by_inode[s.inode]
            out.append(OsListener(s.host, s.port, pid, names.get(pid, "?"), fd))
    return sorted(out, key=lambda x: (x.pid, x.port))


def descendants(parents: Mapping[int, int], roots: Iterable[int]) -> set[int]:
    """``roots`` and every process below them (``parents``: pid → ppid)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    todo = [r for r in roots if r in parents]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, ()))
    return seen


def _ppid(stat: str) -> int:
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def process_parents(proc: Path = Path("/proc")) -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in os.listdir(proc):
        if entry.isdigit():
            try:
                out[int(entry)] = _ppid((proc / entry / "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue
    return out


def _links(pid: int, proc: Path) -> dict[int, str]:
    out: dict[int, str] = {}
    d = proc / str(pid) / "fd"
    try:
        entries = os.listdir(d)
    except OSError:
        return out
    for e in entries:
        try:
            out[int(e)] = os.readlink(d / e)
        except (OSError, ValueError):
            continue
    return out


def listening(pids: Iterable[int], proc: Path = Path("/proc")) -> list[OsListener]:
    """Every TCP socket (IPv4 and IPv6) the processes ``pids`` listen on."""
    sockets: list[Socket] = []
    for table in ("tcp", "tcp6"):
        try:
            sockets += parse_proc_net_tcp((proc / "net" / table).read_text())
        except OSError:
            continue
    fds: dict[int, dict[int, str]] = {}
    names: dict[int, str] = {}
    for pid in pids:
        fds[pid] = _links(pid, proc)
        try:
            names[pid] = (proc / str(pid) / "comm").read_text().strip()
        except OSError:
            names[pid] = "?"
    return attribute(sockets, fds, names)


def supported(proc: Path = Path("/proc")) -> bool:
    """Whether this machine has the Linux tables :func:`listening` reads."""
    return (proc / "net" / "tcp").is_file()
