"""The worker's reservations, without a server: a protocol whose ``start`` answers as
the server does (started ahead within ``start_ahead_max``, refused when cancelled),
recording when each start went out and when each run began here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from test_worker_waiting import lease, session_config

from cronwheel.client import AsyncClient
from cronwheel.worker.outbox import WorkerStats
from cronwheel.worker.protocol import BatchOutcomes, Lease, Outcome, Started, WorkerProtocol
from cronwheel.worker.session import WorkerSession
from cronwheel.worker.tasks import TaskContext, TaskRegistry

# How early a callback timer may fire on the event loop's own clock (its resolution).
TIMER_SLACK = 0.002


class ServerLike(WorkerProtocol):
    """``start`` as the server answers it: a token starts when its instant is at most
    ``start_ahead_max`` away (by this host's clock, which is the server's here), is
    ``not_yet`` when further, and is refused once cancelled."""

    def __init__(self, client: AsyncClient, ahead: float) -> None:
        super().__init__(client)
        self.ahead = ahead
        self.instants: dict[int, datetime] = {}
        self.cancelled: set[int] = set()
        self.sent: list[tuple[float, list[int]]] = []  # (monotonic time, tokens)

    async def start(self, worker_id: str, tokens: Sequence[int]) -> Started:
        self.sent.append((time.monotonic(), list(tokens)))
        await asyncio.sleep(0)  # the request is out: other starts go meanwhile
        now = datetime.now(UTC)
        started = [
            t
            for t in tokens
            if t not in self.cancelled and self.instants[t] <= now + timedelta(seconds=self.ahead)
        ]
        later = [t for t in tokens if t not in self.cancelled and t not in started]
        refused = [t for t in tokens if t in self.cancelled]
        begins = [max(now, self.instants[t]) for t in started]
        return Started(
            started_at=min(begins) if begins else None,
            started=started,
            not_yet=later,
            refused=refused,
        )


def reservation(token: int, instant: datetime) -> Lease:
    return lease(token - 1, at=instant, not_before=instant)


class Harness:
    """A worker session (one slot per run) whose reservations loop runs against
    :class:`ServerLike`; its handler notes when each run began."""

    def __init__(self, session: WorkerSession, server: ServerLike) -> None:
        self.session = session
        self.server = server
        self.reservations = session.reservations
        self.begun: list[tuple[float, str]] = []  # (monotonic time, attempt id)
        self.dropped: list[Lease] = []
        self.changed = asyncio.Event()
        self.most_running = 0  # the most handlers running at once
        self.hold: asyncio.Event | None = None  # set: handlers wait for it

    def reserve(self, tokens: Sequence[int], in_seconds: float) -> float:
        """Reservations due together ``in_seconds`` from now; their instant on the
        monotonic clock."""
        instant = datetime.now(UTC) + timedelta(seconds=in_seconds)
        local = time.monotonic() + in_seconds
        for token in tokens:
            self.server.instants[token] = instant
            self.reservations.add(reservation(token, instant))
        return local

    async def until(self, done: Callable[[], bool]) -> None:
        """Until ``done()``: looked at whenever a run begins or is dropped, what the
        session holds changes, or 50 ms passed."""
        async with asyncio.timeout(5):
            while not done():
                self.changed.clear()
                self.session._held_changed.clear()
                waits = [
                    asyncio.ensure_future(self.changed.wait()),
                    asyncio.ensure_future(self.session._held_changed.wait()),
                ]
                # (Also looked at now and then: a release changes neither.)
                await asyncio.wait(waits, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
                for w in waits:
                    w.cancel()


async def _running(ahead: float, concurrency: int = 3000) -> AsyncIterator[Harness]:
    registry = TaskRegistry()
    config = session_config(concurrency)
    # Nothing here reaches a server: only ``start`` is called, and answered here.
    async with AsyncClient("http://127.0.0.1:9", api_key="cw_unused") as client:
        server = ServerLike(client, ahead)
        session = WorkerSession(
            config,
            registry,
            server,
            WorkerStats(),
            stop=asyncio.Event(),
            force=asyncio.Event(),
            drain=False,
        )
        harness = Harness(session, server)

        @registry.task("work")
        async def work(ctx: TaskContext, payload: dict[str, Any]) -> None:
            harness.begun.append((time.monotonic(), ctx.attempt_id))
            harness.most_running = max(harness.most_running, session.running)
            harness.changed.set()
            if harness.hold is not None:
                await harness.hold.wait()

        drop = session.reservations.on_drop

        def dropped(lease: Lease) -> None:
            harness.dropped.append(lease)
            harness.changed.set()
            drop(lease)

        session.reservations.on_drop = dropped
        session.reservations.start_ahead_max = ahead
        loop = asyncio.create_task(session.reservations.run(lambda: "worker-1"))
        try:
            yield harness
        finally:
            loop.cancel()
            with pytest.raises(asyncio.CancelledError):
                await loop
            for held in session.held.values():
                if held.task is not None:
                    held.task.cancel()


@pytest.fixture
async def ahead() -> AsyncIterator[Harness]:
    async for harness in _running(ahead=1.0):
        yield harness


@pytest.fixture
async def at_instant() -> AsyncIterator[Harness]:
    async for harness in _running(ahead=0.0):
        yield harness


@pytest.fixture
async def two_slots() -> AsyncIterator[Harness]:
    async for harness in _running(ahead=1.0, concurrency=2):
        yield harness


@pytest.fixture
async def one_slot() -> AsyncIterator[Harness]:
    async for harness in _running(ahead=1.0, concurrency=1):
        yield harness


@pytest.fixture
async def four_slots() -> AsyncIterator[Harness]:
    async for harness in _running(ahead=1.0, concurrency=4):
        yield harness


async def test_a_start_goes_out_ahead_and_the_run_begins_at_its_instant(
    ahead: Harness,
) -> None:
    # Starts are taken to cost 0.1 s: the start goes out about 0.2 s ahead.
    ahead.reservations._round_trip = 0.1
    instant = ahead.reserve([1], 0.5)
    assert len(ahead.reservations) == 1
    await ahead.until(lambda: len(ahead.begun) == 1)

    [(sent, tokens)] = ahead.server.sent
    assert tokens == [1]
    assert sent <= instant - 0.1  # well before the instant: no round trip left then
    [(began, attempt_id)] = ahead.begun
    assert began >= instant - TIMER_SLACK  # never before its instant
    # The attempt begins at its instant: its lease and deadline count from there.
    attempt = ahead.session.held[attempt_id].lease
    assert attempt.not_before is None
    assert attempt.lease_expires_at == ahead.server.instants[1] + timedelta(seconds=30)
    assert attempt.deadline == ahead.server.instants[1] + timedelta(seconds=60)
    assert len(ahead.reservations) == 0


async def test_a_timer_that_fires_early_does_not_begin_the_run_before_its_instant(
    ahead: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event loop's timers may fire a little early (uvloop's count whole
    milliseconds): the run still begins at its instant, not when the timer fired."""
    loop = asyncio.get_running_loop()
    call_later = loop.call_later

    def early(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        return call_later(max(0.0, delay - 0.05), callback, *args)  # 50 ms early

    monkeypatch.setattr(loop, "call_later", early)
    instant = ahead.reserve([1], 0.3)
    await ahead.until(lambda: len(ahead.begun) == 1)
    [(began, _)] = ahead.begun
    assert began >= instant


async def test_an_armed_run_holds_its_slot_and_a_stop_hands_it_back(ahead: Harness) -> None:
    ahead.reservations._round_trip = 0.3  # the start goes out 0.6 s ahead
    ahead.reserve([1], 0.8)
    await ahead.until(lambda: len(ahead.session.held) == 1)
    # Started on the server and held here (heartbeaten from now on), not begun: it
    # still holds its slot.
    [held] = ahead.session.held.values()
    assert ahead.begun == [] and held.task is None and len(ahead.reservations) == 1
    await ahead.session._hand_back_reservations()
    assert len(ahead.reservations) == 0
    assert ahead.session.outbox._releases == [held.ref]  # released, not counted a try
    await asyncio.sleep(1.0)
    assert ahead.begun == []  # handed back: it never begins here


async def test_a_cancel_learnt_before_the_instant_keeps_an_armed_run_from_beginning(
    ahead: Harness,
) -> None:
    ahead.reservations._round_trip = 0.3
    ahead.reserve([1, 2], 0.8)
    await ahead.until(lambda: len(ahead.session.held) == 2)
    victim, control = sorted(ahead.session.held.values(), key=lambda h: h.lease.fencing_token)
    ahead.session._cancel_requested(victim)  # as a heartbeat answer would tell it
    await ahead.until(lambda: len(ahead.begun) == 1)
    assert [attempt for _, attempt in ahead.begun] == [control.lease.attempt_id]
    [failure] = ahead.session.outbox._failures
    assert failure.attempt_id == victim.lease.attempt_id and not failure.retryable
    assert ahead.session.outbox._releases == []


async def test_without_start_ahead_a_start_goes_out_at_the_instant(at_instant: Harness) -> None:
    instant = at_instant.reserve([1], 0.2)
    await at_instant.until(lambda: len(at_instant.begun) == 1)
    [(sent, tokens)] = at_instant.server.sent
    assert tokens == [1] and sent >= instant - TIMER_SLACK


async def test_a_burst_goes_out_in_batches_and_a_refused_run_is_dropped(ahead: Harness) -> None:
    ahead.server.cancelled.add(7)
    instant = ahead.reserve(range(2500), 0.8)
    await ahead.until(lambda: len(ahead.begun) + len(ahead.dropped) == 2500)

    # Batches of at most 1,000, all out before the instant; every token once.
    assert [len(tokens) for _, tokens in ahead.server.sent] == [1000, 1000, 500]
    assert all(sent < instant for sent, _ in ahead.server.sent)
    assert sorted(t for _, tokens in ahead.server.sent for t in tokens) == list(range(2500))
    assert [lease.fencing_token for lease in ahead.dropped] == [7]
    assert len(ahead.begun) == 2499
    assert min(began for began, _ in ahead.begun) >= instant - TIMER_SLACK


async def test_reservations_beyond_the_slots_begin_as_the_slots_free_up(
    two_slots: Harness,
) -> None:
    two_slots.reservations._round_trip = 0.05
    instant = two_slots.reserve(range(1, 51), 0.4)
    await two_slots.until(lambda: len(two_slots.begun) == 50)
    # Fifty reservations on two slots: every one begins, at its instant or after,
    # two at a time, and none is handed back.
    assert min(began for began, _ in two_slots.begun) >= instant - TIMER_SLACK
    assert two_slots.most_running <= 2
    assert two_slots.session.outbox._releases == []
    assert two_slots.session._reserved_waiting == 0


async def test_started_reservations_the_slots_cannot_begin_in_time_are_handed_back(
    one_slot: Harness,
) -> None:
    one_slot.hold = asyncio.Event()  # the first handler never ends
    one_slot.reservations._round_trip = 0.05
    one_slot.reserve(range(1, 6), 0.2)
    await one_slot.until(lambda: len(one_slot.begun) == 1)
    waiting = [h for _, _, h in one_slot.session._waiting]
    assert len(waiting) == 4 and all(h.reserved and h.task is None for h in waiting)
    # Half a second on, the slot has begun nothing more: the four are released
    # (not counted as tries) for a worker with a free slot.
    await one_slot.until(lambda: len(one_slot.session.outbox._releases) == 4)
    assert sorted(r.attempt_id for r in one_slot.session.outbox._releases) == sorted(
        h.lease.attempt_id for h in waiting
    )
    assert one_slot.session._waiting == [] and one_slot.session._reserved_waiting == 0
    assert len(one_slot.begun) == 1
    one_slot.hold.set()


async def test_how_many_reservations_a_worker_holds_beyond_its_slots(
    four_slots: Harness,
) -> None:
    session = four_slots.session
    # The handlers' duration unknown: up to the configured most (10,000).
    assert session._reserve_extra() == 10_000
    # Known: what the slots begin in two seconds (4 slots, 0.5 s each: 16).
    session._ended(0.5)
    assert session._reserve_extra() == 16
    # Beyond that allowance each reservation holds a slot.
    four_slots.reserve(range(1, 21), 5.0)
    assert session._reserved_over(session._reserve_extra()) == 4
    # A pool keeping slots for P0 gets none beyond the slots.
    session.protocol.p0_reserved_slots = 1
    assert session._reserve_extra() == 0


async def test_heartbeats_go_in_batches_the_server_accepts(ahead: Harness) -> None:
    session = ahead.session
    sizes: list[int] = []

    async def batch(*, heartbeats: Sequence[Any] = (), **_: Any) -> BatchOutcomes:
        sizes.append(len(heartbeats))
        return BatchOutcomes(heartbeats=[Outcome(h.attempt_id, True) for h in heartbeats])

    session.protocol.batch = batch  # type: ignore[method-assign]
    for n in range(2500):
        session._hold(lease(n))
    await session._beat()
    assert sizes == [1000, 1000, 500]
