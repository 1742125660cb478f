"""The worker session's runs waiting for a slot (prefetch), without a server: leases
are handed to the session as its lease loop would, and what it reports is read from
its outbox (never flushed here)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronwheel.client import AsyncClient
from cronwheel.worker.held import Held
from cronwheel.worker.outbox import WorkerStats
from cronwheel.worker.protocol import Failure, Lease, TokenRef, WorkerProtocol
from cronwheel.worker.session import SessionConfig, WorkerSession
from cronwheel.worker.tasks import TaskContext, TaskRegistry


def lease(
    n: int, priority: int = 2, *, at: datetime | None = None, not_before: datetime | None = None
) -> Lease:
    """Attempt ``n`` (token ``n + 1``) leased ``at`` (now); a reservation when
    ``not_before`` is given."""
    now = at or datetime.now(UTC)
    return Lease(
        attempt_id=str(uuid.uuid4()),
        run_id=str(uuid.uuid4()),
        job_id=str(uuid.uuid4()),
        attempt=1,
        task="work",
        webhook=None,
        payload={"n": n},
        fencing_token=n + 1,
        lease_expires_at=now + timedelta(seconds=30),
        deadline=now + timedelta(seconds=60),
        due_at=now,
        heartbeat_timeout=30.0,
        priority=priority,
        not_before=not_before,
    )


def session_config(concurrency: int, prefetch: int | None = None) -> SessionConfig:
    """A worker's settings for a session that reaches no server."""
    return SessionConfig(
        pool="default",
        capabilities=(),
        tags=(),
        concurrency=concurrency,
        name=None,
        grace_period=1.0,
        lease_wait=1.0,
        flush_delay=0.01,
        flush_size=100,
        heartbeat_interval=None,
        backoff_max=1.0,
        prefetch=prefetch,
    )


class Harness:
    def __init__(self, session: WorkerSession, started: list[int], gate: asyncio.Event) -> None:
        self.session = session
        self.started = started
        self.gate = gate

    def waiting(self) -> list[Held]:
        return [h for _, _, h in sorted(self.session._waiting) if not h.reported]

    async def until_idle(self) -> None:
        async with asyncio.timeout(5):
            while True:
                tasks = [h.task for h in self.session.held.values() if h.task and not h.task.done()]
                if not tasks:
                    return
                await asyncio.wait(tasks)


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    registry = TaskRegistry()
    started: list[int] = []
    gate = asyncio.Event()

    @registry.task("work")
    async def work(ctx: TaskContext, payload: dict[str, Any]) -> None:
        started.append(int(payload["n"]))
        await gate.wait()

    config = session_config(concurrency=1, prefetch=4)
    # Nothing here reaches a server: the client is never called.
    async with AsyncClient("http://127.0.0.1:9", api_key="cw_unused") as client:
        session = WorkerSession(
            config,
            registry,
            WorkerProtocol(client),
            WorkerStats(),
            stop=asyncio.Event(),
            force=asyncio.Event(),
            drain=False,
        )
        yield Harness(session, started, gate)
        gate.set()
        for held in session.held.values():
            if held.task is not None:
                held.task.cancel()


async def test_waiting_runs_start_highest_class_first(harness: Harness) -> None:
    session = harness.session
    session._receive(lease(0))  # the one slot is free: it starts at once
    await asyncio.sleep(0)
    for n, priority in [(1, 3), (2, 2), (3, 0), (4, 2), (5, 1)]:
        session._receive(lease(n, priority))
    assert session.running == 1 and len(harness.waiting()) == 5
    assert harness.started == [0]
    harness.gate.set()
    await harness.until_idle()
    # P0, P1, then P2 in the order leased, then P3.
    assert harness.started == [0, 3, 5, 2, 4, 1]
    assert session.stats.leased == 6


async def test_the_runs_of_one_answer_take_the_free_slots_highest_class_first(
    harness: Harness,
) -> None:
    """A lease answer's runs are held together: the one free slot goes to its P0 run,
    whatever the answer's order."""
    session = harness.session
    session._receive(lease(1, 3), lease(2, 0), lease(3, 2))
    assert session.running == 1 and harness.started == []
    await asyncio.sleep(0)
    assert harness.started == [2]
    harness.gate.set()
    await harness.until_idle()
    assert harness.started == [2, 3, 1]
    assert session.stats.leased == 3 and session.stats.waited == 2


async def test_prefetch_follows_how_long_handlers_take(harness: Harness) -> None:
    session = harness.session  # one slot, prefetch at most 4
    assert session._prefetch() == 0  # no handler has ended: nothing held waiting
    harness.gate.set()
    session._receive(lease(0))
    await harness.until_idle()
    # A handler that returns at once: its slot finishes many runs in 0.1 s.
    assert session._duration is not None and session._duration < 0.02
    assert session._prefetch() == 4  # at most the configured prefetch
    session._ended(0.04)  # a slower one moves the mean towards it
    assert 0.0 < session._duration < 0.04
    for _ in range(50):
        session._ended(0.04)
    assert session._prefetch() == 4  # one slot, 0.04 s a run: 5 in 0.2 s, at most 4
    for _ in range(50):
        session._ended(0.08)
    assert session._prefetch() == 2  # 0.08 s a run: 2.5 in 0.2 s
    for _ in range(50):
        session._ended(0.5)  # half a second a run: none would start within 0.2 s
    assert session._prefetch() == 0


async def test_a_cancelled_waiting_run_never_starts(harness: Harness) -> None:
    session = harness.session
    session._receive(lease(0))
    await asyncio.sleep(0)
    first, second = lease(1), lease(2)
    session._receive(first)
    session._receive(second)
    # A heartbeat answer asks to cancel the first waiting run.
    session._cancel_requested(session.held[first.attempt_id])
    harness.gate.set()
    await harness.until_idle()
    assert harness.started == [0, 2]
    [failure] = session.outbox._failures
    assert isinstance(failure, Failure) and not failure.retryable
    assert failure.attempt_id == first.attempt_id


async def test_shutdown_hands_back_waiting_runs(harness: Harness) -> None:
    session = harness.session
    session._receive(lease(0))
    await asyncio.sleep(0)
    waiting = [lease(n) for n in (1, 2, 3)]
    for item in waiting:
        session._receive(item)
    session.stop.set()
    session._hand_back_waiting()
    harness.gate.set()
    await asyncio.sleep(0.01)
    assert harness.started == [0]  # none of them started after the stop
    released = session.outbox._releases
    assert all(isinstance(r, TokenRef) for r in released)
    assert sorted(r.attempt_id for r in released) == sorted(w.attempt_id for w in waiting)
    assert not harness.waiting()
