"""How late an event loop wakes: a task sleeps ``period_s`` again and again and hands
each overshoot to a callback. A loop that wakes late serves everything late — a request
whose bytes wait in its socket is read only when the loop comes round — so this is the
part of an answer's time that no per-request timer started at the read can see."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable


class LoopLag:
    """Samples the running loop's lag while started (or ``async with``)."""

    def __init__(self, on_lag: Callable[[float], None], period_s: float = 0.01) -> None:
        self.on_lag, self.period_s = on_lag, period_s
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.period_s)
            self.on_lag(max(0.0, time.perf_counter() - t - self.period_s))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> LoopLag:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
