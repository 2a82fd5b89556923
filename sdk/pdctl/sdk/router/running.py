"""The task running now, without :func:`asyncio.current_task`'s system call; and
:func:`run`, the loop the router's processes run on.

On Python 3.11 every look-up of the running loop (``asyncio.current_task()``,
``asyncio.get_running_loop()``, ``asyncio.create_task``) asks the kernel for the process
id, so that a child made by ``fork`` never sees its parent's loop: on the router's hot
path, a few per request, that system call was some 8% of its CPU at 64 clients. Here the
loop is looked up once per thread and kept; a task found running on it is the running
task (a loop runs in the thread that runs it), and a loop that no longer runs a task
here is looked up again. A child made by ``fork`` forgets the kept loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _Kept(threading.local):
    loop: asyncio.AbstractEventLoop | None = None


_kept = _Kept()


def _forget() -> None:
    _kept.loop = None


os.register_at_fork(after_in_child=_forget)


def current_task() -> asyncio.Task[Any] | None:
    """:func:`asyncio.current_task` (RuntimeError outside a running loop, as there)."""
    loop = _kept.loop
    if loop is not None:
        task = asyncio.current_task(loop)
        if task is not None:
            return task
    loop = _kept.loop = asyncio.get_running_loop()
    return asyncio.current_task(loop)


def run(main: Coroutine[Any, Any, T]) -> T:
    """``main`` run to its end on uvloop where it is installed, else on asyncio's loop
    (the router, its worker pool and the overload benchmark's clients)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main)
    return uvloop.run(main)
