"""The legs' timeout (:class:`pdctl.sdk.router.deadline.Within`) behaves as
:func:`asyncio.timeout`: its own expiry is a TimeoutError, anyone else's cancellation stays
a cancellation, and nothing is left armed after the block."""

from __future__ import annotations

import asyncio

import pytest

from pdctl.sdk.router.deadline import Within


async def test_expiry_inside_the_block_is_a_timeout_error():
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TimeoutError):
        async with Within(0.05):
            await asyncio.sleep(5)
    assert loop.time() - t0 < 1.0
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0  # the cancellation it made is taken back


async def test_a_block_done_in_time_and_no_limit_leave_nothing_armed():
    async with Within(0.05):
        await asyncio.sleep(0)
    async with Within(None):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # a timer left armed would cancel this sleep


async def test_a_cancellation_from_elsewhere_stays_a_cancellation():
    started = asyncio.Event()

    async def leg() -> None:
        async with Within(5.0):
            started.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(leg())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_error_inside_the_block_passes_through():
    with pytest.raises(ValueError, match="x"):
        async with Within(5.0):
            raise ValueError("x")


async def test_the_kept_loop_finds_the_running_task_as_asyncio_does():
    from pdctl.sdk.router.running import current_task

    assert current_task() is asyncio.current_task()
    inner = asyncio.create_task(asyncio.sleep(0, result=None))

    async def which() -> bool:
        return current_task() is asyncio.current_task()

    assert await asyncio.create_task(which())
    await inner


def test_the_kept_loop_is_looked_up_again_on_a_new_loop_and_outside_one_is_an_error():
    from pdctl.sdk.router.running import current_task

    async def which() -> bool:
        return current_task() is asyncio.current_task()

    for _ in range(2):  # a loop that ran before is not this one
        assert asyncio.run(which())
    with pytest.raises(RuntimeError):
        current_task()
