"""The worker's gated reservations, without a server: a protocol that answers the gates
long-poll, starts and batches as the server does, so the session's side is seen alone —
a node begins the moment its gate opens, its start is sent after, its outcome waits for
the start's answer, a refused start stops it and reports nothing, and a reservation
that is gone or lapses is dropped."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from test_worker_waiting import session_config

from cronwheel.client import ApiError, AsyncClient
from cronwheel.testing import wait_until_async
from cronwheel.worker.outbox import WorkerStats
from cronwheel.worker.protocol import (
    BatchOutcomes,
    Completion,
    Failure,
    GatesHeard,
    Heartbeat,
    Lease,
    Outcome,
    Started,
    TokenRef,
    WorkerProtocol,
)
from cronwheel.worker.session import WorkerSession
from cronwheel.worker.tasks import TaskContext, TaskRegistry


def gated(token: int, *, lapses_in: float = 30.0) -> Lease:
    now = datetime.now(UTC)
    return Lease(
        attempt_id=str(uuid.uuid4()),
        run_id=str(uuid.uuid4()),
        job_id=str(uuid.uuid4()),
        attempt=1,
        task="work",
        webhook=None,
        payload={"own": token},
        fencing_token=token,
        lease_expires_at=now + timedelta(seconds=lapses_in),
        deadline=now + timedelta(seconds=60),
        due_at=now,
        heartbeat_timeout=lapses_in,
        workflow_run_id=str(uuid.uuid4()),
        gated=True,
    )


class ServerLike(WorkerProtocol):
    """Gates opened by the test (``open``), starts answered as told, and every batch
    recorded."""

    def __init__(self, client: AsyncClient) -> None:
        super().__init__(client)
        self.heard: asyncio.Queue[GatesHeard] = asyncio.Queue()
        self.asked: list[list[int]] = []
        self.refuse: set[int] = set()
        self.errors: list[ApiError] = []  # raised by the next starts, one each
        self.answer_starts = asyncio.Event()
        self.answer_starts.set()
        self.starts: list[list[int]] = []
        self.completions: list[Completion] = []
        self.failures: list[Failure] = []
        self.beats: list[str] = []
        self.releases: list[int] = []

    def open(self, tokens: list[int], payload: dict[str, Any]) -> datetime:
        at = datetime.now(UTC)
        self.heard.put_nowait(GatesHeard(opened=[(tokens, payload, at)], gone=[]))
        return at

    async def gates(self, worker_id: str, tokens: Sequence[int], *, wait: float) -> GatesHeard:
        self.asked.append(list(tokens))
        try:
            async with asyncio.timeout(wait):
                return await self.heard.get()
        except TimeoutError:
            return GatesHeard(opened=[], gone=[])

    async def start(self, worker_id: str, tokens: Sequence[int]) -> Started:
        self.starts.append(list(tokens))
        await self.answer_starts.wait()
        if self.errors:
            raise self.errors.pop(0)
        return Started(
            started_at=datetime.now(UTC),
            started=[t for t in tokens if t not in self.refuse],
            not_yet=[],
            refused=[t for t in tokens if t in self.refuse],
        )

    async def batch(
        self,
        *,
        heartbeats: Sequence[Heartbeat | TokenRef] = (),
        completions: Sequence[Completion] = (),
        failures: Sequence[Failure] = (),
        releases: Sequence[TokenRef] = (),
    ) -> BatchOutcomes:
        self.completions += completions
        self.failures += failures
        self.beats += [h.attempt_id for h in heartbeats]
        self.releases += [r.fencing_token for r in releases]
        return BatchOutcomes(
            heartbeats=[Outcome(h.attempt_id, True) for h in heartbeats],
            completions=[Outcome(c.attempt_id, True) for c in completions],
            failures=[Outcome(f.attempt_id, True) for f in failures],
            releases=[Outcome(r.attempt_id, True) for r in releases],
        )


class Harness:
    def __init__(self, session: WorkerSession, server: ServerLike) -> None:
        self.session = session
        self.server = server
        self.begun: dict[int, dict[str, Any]] = {}  # token -> the payload it began with
        self.ended: set[int] = set()
        self.release: asyncio.Event | None = None  # set: handlers wait for it
        self.dropped: list[Lease] = []


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    registry = TaskRegistry()
    async with AsyncClient("http://127.0.0.1:9", api_key="cw_unused") as client:
        server = ServerLike(client)
        session = WorkerSession(
            session_config(10),
            registry,
            server,
            WorkerStats(),
            stop=asyncio.Event(),
            force=asyncio.Event(),
            drain=False,
        )
        h = Harness(session, server)

        @registry.task("work")
        async def work(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
            h.begun[ctx.fencing_token] = payload
            if h.release is not None:
                await h.release.wait()
            h.ended.add(ctx.fencing_token)
            return {"did": ctx.fencing_token}

        drop = session.gated.on_drop

        def dropped(lease: Lease, hand_back: bool) -> None:
            h.dropped.append(lease)
            drop(lease, hand_back)

        session.gated.on_drop = dropped
        session.gated.wait = 5.0
        tasks = [
            asyncio.create_task(session.gated.run(lambda: "worker-1")),
            asyncio.create_task(session.outbox.run()),
        ]
        try:
            yield h
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for held in session.held.values():
                if held.task is not None:
                    held.task.cancel()


async def until(check: Any, timeout: float = 5.0) -> None:
    await wait_until_async(check, timeout, interval=0.005)


async def test_a_node_begins_at_its_gate_with_the_payload_it_gives_then_starts(
    harness: Harness,
) -> None:
    server, session = harness.server, harness.session
    harness.release = asyncio.Event()
    for token in (1, 2):
        session.gated.add(gated(token))
    await until(lambda: server.asked and sorted(server.asked[-1]) == [1, 2])
    assert harness.begun == {}  # held, nothing runs before the gate
    server.answer_starts.clear()  # the starts are slow: the handlers begin regardless
    opened_at = server.open([1, 2], {"upstream": {"a": 1}})
    await until(lambda: len(harness.begun) == 2)
    assert harness.begun[1] == {"upstream": {"a": 1}}
    assert harness.begun[1] is not harness.begun[2]  # each its own copy
    assert server.starts == [[1, 2]]
    held = {h.lease.fencing_token: h for h in session.held.values()}
    assert held[1].lease.lease_expires_at == opened_at + timedelta(seconds=30)
    assert not held[1].lease.gated and held[1].unstarted
    # Not heartbeaten before its start is recorded (there is no attempt yet).
    await session._beat()
    assert server.beats == []
    # Its outcome waits for the start's answer.
    harness.release.set()
    await until(lambda: harness.ended == {1, 2})
    await asyncio.sleep(0.05)
    assert server.completions == []
    server.answer_starts.set()
    await until(lambda: len(server.completions) == 2)
    assert sorted(c.fencing_token for c in server.completions) == [1, 2]
    assert len(session.gated) == 0


async def test_a_refused_start_stops_the_handler_and_reports_nothing(harness: Harness) -> None:
    server, session = harness.server, harness.session
    harness.release = asyncio.Event()
    session.gated.add(gated(7))
    await until(lambda: server.asked)
    server.answer_starts.clear()
    server.refuse.add(7)
    server.open([7], {})
    await until(lambda: 7 in harness.begun)
    server.answer_starts.set()
    await until(lambda: not session.held)
    assert 7 not in harness.ended  # stopped: its run was cancelled, or lapsed
    await until(lambda: server.releases == [7])  # let go all the same
    assert server.completions == [] and server.failures == []


async def test_gone_and_lapsed_reservations_are_dropped(harness: Harness) -> None:
    server, session = harness.server, harness.session
    session.gated.add(gated(3))
    session.gated.add(gated(4, lapses_in=0.2))
    await until(lambda: server.asked)
    server.heard.put_nowait(GatesHeard(opened=[], gone=[3]))
    await until(lambda: [d.fencing_token for d in harness.dropped] == [3])
    # The other lapses on its own: the long-poll waits no longer than it holds.
    await until(lambda: len(harness.dropped) == 2, timeout=3.0)
    assert harness.dropped[1].fencing_token == 4
    assert len(session.gated) == 0 and harness.begun == {}
    # The one that lapsed here is handed back (its gate may have opened unheard); the
    # one the server said was gone is not.
    await until(lambda: server.releases == [4])


async def test_more_reservations_cut_a_long_poll_short_to_name_them(harness: Harness) -> None:
    server, session = harness.server, harness.session
    session.gated.add(gated(5))
    await until(lambda: server.asked == [[5]])
    session.gated.add(gated(6))
    await until(lambda: len(server.asked) >= 2 and sorted(server.asked[-1]) == [5, 6])


async def test_a_start_that_fails_is_tried_again_and_one_of_a_gone_worker_is_refused(
    harness: Harness,
) -> None:
    server, session = harness.server, harness.session
    server.errors = [ApiError(429, "rate_limited", "slow down"), ApiError(503, "x", "busy")]
    session.gated.backoff_max = 0.05
    session.gated.add(gated(11))
    await until(lambda: server.asked)
    server.open([11], {})
    await until(lambda: len(server.completions) == 1)
    assert server.starts == [[11], [11], [11]]
    # A worker the server no longer knows (410): its nodes are not its own to report.
    server.errors = [ApiError(410, "worker_deregistered", "gone")]
    harness.release = asyncio.Event()
    session.gated.add(gated(12))
    await until(lambda: 12 in {t for asked in server.asked for t in asked})
    server.open([12], {})
    await until(lambda: 12 in harness.begun)
    await until(lambda: not any(h.lease.fencing_token == 12 for h in session.held.values()))
    harness.release.set()
    await asyncio.sleep(0.05)
    assert [c.fencing_token for c in server.completions] == [11]


async def test_a_worker_takes_a_layer_a_share_at_a_time(harness: Harness) -> None:
    """Workers woken by a layer's arming share its nodes: one asks for at most 250
    gated reservations a lease, and again at once while it has room, until it holds
    what was there."""
    server, session = harness.server, harness.session
    layer = [gated(token) for token in range(1, 601)]
    asked: list[int] = []
    taken: list[int] = []

    async def lease(worker_id: str, **asking: Any) -> list[Lease]:
        asked.append(asking["gated"])
        share = layer[: asking["gated"]]
        del layer[: asking["gated"]]
        if share:
            taken.append(len(share))
        else:
            await asyncio.sleep(asking["wait"])
        return share

    server.lease = lease  # type: ignore[method-assign]
    session.worker_id, session.lease_ahead, session._gates_poll = "worker-1", 10.0, True
    loop = asyncio.create_task(session._lease_loop())
    try:
        await until(lambda: len(session.gated) == 600)
    finally:
        session.stop.set()
        await asyncio.gather(loop, return_exceptions=True)
    assert taken == [250, 250, 100]
    assert all(n <= 250 for n in asked)
