"""An async handler's deadline (``worker/held.py``): past it the handler is cancelled
and the attempt fails with DeadlineExceeded; a cancel of the session's own, or a
TimeoutError of the handler's, stays what it is."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronwheel.worker.held import DeadlineExceeded, Held
from cronwheel.worker.protocol import Lease
from cronwheel.worker.tasks import TASK_LOGGER, TaskContext


def held(seconds: float) -> Held:
    """An attempt whose handler may run ``seconds``, async."""
    now = datetime.now(UTC)
    lease = Lease.from_json(  # as a lease answer carries it
        {
            "attempt_id": str(uuid.uuid4()),
            "run_id": str(uuid.uuid4()),
            "task": "work",
            "fencing_token": 1,
            "lease_expires_at": (now + timedelta(seconds=30)).isoformat(),
            "deadline": (now + timedelta(seconds=seconds)).isoformat(),
            "heartbeat_timeout": 30.0,
        }
    )
    log = logging.LoggerAdapter(logging.getLogger(TASK_LOGGER), {})
    return Held(lease=lease, ctx=TaskContext.of(lease, log), is_async=True)


async def sleeps(ctx: Any, payload: Any) -> None:
    await asyncio.sleep(10)


async def test_a_handler_past_its_deadline_is_cancelled_and_says_so() -> None:
    with pytest.raises(DeadlineExceeded) as raised:
        await held(0.05).call(sleeps, None)  # type: ignore[arg-type]
    assert raised.value.seconds == pytest.approx(0.05, abs=0.01)
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_handler_within_its_deadline_returns_its_result_and_leaves_no_timer() -> None:
    async def quick(ctx: Any, payload: Any) -> int:
        return 7

    loop = asyncio.get_running_loop()
    assert await held(0.05).call(quick, None) == 7  # type: ignore[arg-type]
    await asyncio.sleep(0.1)  # past the deadline: a timer left behind would cancel us now
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
    assert loop.is_running()


async def test_the_handlers_own_timeout_error_is_not_the_deadline() -> None:
    async def times_out(ctx: Any, payload: Any) -> None:
        raise TimeoutError("the handler's own")

    with pytest.raises(TimeoutError, match="the handler's own") as raised:
        await held(10).call(times_out, None)  # type: ignore[arg-type]
    assert not isinstance(raised.value, DeadlineExceeded)


async def test_a_cancel_from_outside_stays_a_cancel() -> None:
    task = asyncio.ensure_future(held(10).call(sleeps, None))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_deadline_turned_into_the_handlers_own_timeout_error_is_still_the_deadline() -> (
    None
):
    async def converts(ctx: Any, payload: Any) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise TimeoutError("a client library's own") from None

    with pytest.raises(DeadlineExceeded):
        await held(0.02).call(converts, None)  # type: ignore[arg-type]
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_handler_that_swallows_its_deadline_returns_and_leaves_no_cancel_behind() -> None:
    async def swallows(ctx: Any, payload: Any) -> str:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)
        return "kept going"

    assert await held(0.02).call(swallows, None) == "kept going"  # type: ignore[arg-type]
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_no_time_left_stops_the_handler_at_its_first_pause() -> None:
    async def pauses(ctx: Any, payload: Any) -> int:
        await asyncio.sleep(0)
        return 1

    with pytest.raises(DeadlineExceeded):
        await held(-1).call(pauses, None)  # type: ignore[arg-type]
