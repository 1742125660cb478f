"""Wake-up notifications: hints sent when runs become due soon or ready to lease."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from cronwheel.store import CHANNEL_RUNS_NEW, CHANNEL_RUNS_READY, Store, Subscription
from cronwheel.store.drivers.postgres_jobs import CommittedNotices
from cronwheel.testing import wait_until_async

from .helpers import T0, create_job, fire, make_tenant


async def _until_heard(sub: Subscription, act: Callable[[], Awaitable[object]]) -> list[str]:
    """Repeat ``act`` until ``sub`` hears something. On PostgreSQL the LISTEN connection
    comes up in the background, and a notification sent before it is rightly lost:
    notifications are hints, never needed for correctness."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while loop.time() < deadline:
        await act()
        payloads = await sub.wait(0.5)
        if payloads:
            return payloads
    pytest.fail("no notification arrived before the deadline")


async def test_runs_due_soon_are_announced(store: Store) -> None:
    tenant = await make_tenant(store)
    announced: dict[str, str] = {}

    async def create() -> None:
        _job, run = await create_job(store, tenant.id, due_at=T0, now=T0)
        epoch_ms = int(run.fire_at.timestamp() * 1000)
        announced[f"{run.shard}:{epoch_ms}:{run.id.hex}"] = run.id.hex

    sub = store.subscribe(CHANNEL_RUNS_NEW)
    try:
        payloads = await _until_heard(sub, create)
    finally:
        sub.close()
    assert set(payloads) <= set(announced)


async def test_fired_runs_announce_their_pool(store: Store) -> None:
    tenant = await make_tenant(store)

    async def create_and_fire() -> None:
        _job, run = await create_job(store, tenant.id, pool="reports")
        assert len(await fire(store, [run])) == 1

    sub = store.subscribe(CHANNEL_RUNS_READY)
    try:
        payloads = await _until_heard(sub, create_and_fire)
    finally:
        sub.close()
    assert set(payloads) == {"reports"}


async def test_notices_that_may_wait_go_with_the_next(pg_url: str) -> None:
    # PostgreSQL: notices that may wait are held (here far longer than the test lasts)
    # until one that may not comes, and then go with it, in one notification.
    dsn = pg_url.replace("postgresql+asyncpg://", "postgresql://", 1)
    channel = f"cw_test_{uuid.uuid4().hex[:8]}"
    sender, listener = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    heard: list[str] = []
    await listener.add_listener(channel, lambda _c, _pid, _ch, payload: heard.append(payload))
    notices = CommittedNotices(lambda: sender)
    try:
        notices.send(channel, ["a"], within=600)
        notices.send(channel, ["b"], within=600)
        notices.send(channel, ["c"])
        await wait_until_async(lambda: heard, 10, what="the notification")
        assert heard == ["a\nb\nc"]
        # Alone, one that may wait goes when its time is up; one held goes at close.
        notices.send(channel, ["d"], within=0.01)
        await wait_until_async(lambda: len(heard) == 2, 10, what="the waiting notice")
        notices.send(channel, ["e"], within=600)
        await notices.close()
        await wait_until_async(lambda: len(heard) == 3, 10, what="the notice sent at close")
        assert heard == ["a\nb\nc", "d", "e"]
    finally:
        await sender.close()
        await listener.close()
