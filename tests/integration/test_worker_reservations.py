"""The worker SDK with reservations: a scheduler node dispatches runs ahead of their
instant (``dispatch_lead``), the worker leases them ahead (``lease_ahead``), holds them
and starts each at its instant — never before, never a cancelled one — and hands back
what it still holds when it stops. The real API on a free port over the real store (both
backends), with a real scheduler node beside it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_worker_sdk import Env, RecordingTransport, open_env, within

from cronwheel.client import Call
from cronwheel.domain.model import Run
from cronwheel.scheduler import SchedulerNode
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.testing import wait_until_async
from cronwheel.worker import TaskContext, Worker

LEAD = 10.0  # dispatch_lead and lease_ahead_max
# How far the handler's own clock may trail the database's (both read the same host
# clock here; the margin only absorbs the database's rounding and reading order).
CLOCK_TOLERANCE = timedelta(seconds=0.2)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path,
        admin_key="test-admin-key-0123456789",
        lease_wait_max=10.0,
        heartbeat_interval=5.0,
        dispatch_lead=LEAD,
        dispatch_lead_burst=1,  # every run, even one due alone, is dispatched ahead
        lease_ahead_max=LEAD,
    )


@pytest.fixture
async def scheduler(store: Store, settings: Settings) -> AsyncIterator[SchedulerNode]:
    """A scheduler node owning every shard, dispatching ``dispatch_lead`` ahead."""
    node = SchedulerNode(store, settings, node_id=f"node-{uuid.uuid4().hex[:6]}")
    stop = asyncio.Event()
    task = asyncio.create_task(node.run(stop))
    try:
        yield node
    finally:
        stop.set()
        await within(task)


@pytest.fixture
async def env(settings: Settings, store: Store, scheduler: SchedulerNode) -> AsyncIterator[Env]:
    async with open_env(settings, store) as opened:
        yield opened


class AnswerRecorder(RecordingTransport):
    """The real transport, remembering each request (as its base does) and the JSON
    answers to lease, start and batch calls."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[tuple[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        path = request.url.path
        if response.status_code != 200 or not (
            path.endswith(("/lease", "/start")) or path == "/v1/attempts/batch"
        ):
            return response
        content = await response.aread()
        self.answers.append((path, json.loads(content)))
        self._sent.set()
        return httpx.Response(
            response.status_code, headers=response.headers, content=content, request=request
        )

    def requested(self, suffix: str) -> list[Any]:
        return [body for path, body in self.requests if path.endswith(suffix)]

    def reserved(self) -> dict[str, dict[str, Any]]:
        """Every reservation leased, by run id."""
        return {
            item["run_id"]: item
            for path, body in self.answers
            if path.endswith("/lease")
            for item in body["attempts"]
            if item["not_before"] is not None
        }

    def start_answers(self) -> list[dict[str, Any]]:
        """Every answer to a start request, its shape checked: the tokens started (at
        ``started_at``), due later, and refused."""
        answers = [body for path, body in self.answers if path.endswith("/start")]
        for answer in answers:
            assert set(answer) == {"started_at", "started", "not_yet", "refused", "now"}, answer
            assert (answer["started_at"] is None) == (answer["started"] == []), answer
        return answers

    def started(self) -> list[int]:
        """Every token answered ``started``, as often as it was."""
        return [t for answer in self.start_answers() for t in answer["started"]]

    def refused(self) -> list[int]:
        """Every token answered ``refused``, as often as it was."""
        return [t for answer in self.start_answers() for t in answer["refused"]]

    def started_at(self) -> dict[int, datetime]:
        """When each started token started, as its answer said."""
        return {
            t: datetime.fromisoformat(answer["started_at"])
            for answer in self.start_answers()
            for t in answer["started"]
        }

    def start_tokens(self) -> list[int]:
        """Every token the worker asked to start, in request order; each request's body
        is the token list alone."""
        bodies = self.requested("/start")
        assert all(set(body) == {"fencing_tokens"} for body in bodies), bodies
        return [t for body in bodies for t in body["fencing_tokens"]]

    def release_outcomes(self) -> list[dict[str, Any]]:
        return [
            o
            for path, body in self.answers
            if path == "/v1/attempts/batch"
            for o in body["releases"]
        ]


@dataclass(frozen=True)
class HandlerCall:
    """One handler call, as the handler saw it."""

    run_id: str
    attempt_id: str
    at: datetime  # the handler's own clock when it was called


def reserving_worker(env: Env, **kwargs: Any) -> tuple[Worker, AnswerRecorder]:
    transport = AnswerRecorder()
    env.transports.append(transport)
    kwargs.setdefault("lease_wait", 1.0)
    worker = Worker(env.url, api_key=env.worker_key, transport=transport, **kwargs)
    return worker, transport


def recording_handler(worker: Worker, calls: list[HandlerCall]) -> None:
    @worker.task("timed")
    async def timed(ctx: TaskContext, payload: dict[str, Any]) -> int:
        calls.append(HandlerCall(ctx.run_id, ctx.attempt_id, datetime.now(UTC)))
        return int(payload["i"])


async def start_worker(
    worker: Worker, transport: AnswerRecorder
) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """Run ``worker`` until the returned event is set; return once it is leasing."""
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run_async(stop))
    await transport.until(lambda: bool(transport.requested("/lease")))
    return stop, running


async def create_runs(env: Env, dues: list[datetime]) -> list[str]:
    """One job of task ``timed`` per instant, in one request; their first runs' ids."""
    specs = [
        {
            "name": f"timed-{i}-{uuid.uuid4().hex[:6]}",
            "schedule": {"at": due.isoformat()},
            "task": "timed",
            "payload": {"i": i},
        }
        for i, due in enumerate(dues)
    ]
    out = await env.operator.send(Call("POST", "/v1/jobs/batch", json={"jobs": specs}))
    return [str(job["first_run_id"]) for job in out["items"]]


async def tenant_of(env: Env, run_id: str) -> uuid.UUID:
    return uuid.UUID((await env.run(run_id))["tenant_id"])


async def runs_of(env: Env, run_ids: list[str]) -> list[Run]:
    """The runs as the store has them (the database's own instants)."""
    tid = await tenant_of(env, run_ids[0])
    return [await env.store.runs_get(tid, uuid.UUID(run_id)) for run_id in run_ids]


async def all_in(env: Env, run_ids: list[str], state: str) -> bool:
    return all(run.state == state for run in await runs_of(env, run_ids))


# -- tests -----------------------------------------------------------------------------


async def test_reserved_runs_start_at_their_instants_and_run_once(env: Env) -> None:
    n = 20
    calls: list[HandlerCall] = []
    worker, transport = reserving_worker(env, concurrency=n)
    recording_handler(worker, calls)
    stop, running = await start_worker(worker, transport)

    base = await env.store.db_now() + timedelta(seconds=2)
    run_ids = await create_runs(env, [base + timedelta(milliseconds=50 * i) for i in range(n)])
    await wait_until_async(lambda: all_in(env, run_ids, "SUCCESS"), 20)
    stop.set()
    await within(running)

    # Each handler ran exactly once.
    assert sorted(c.run_id for c in calls) == sorted(run_ids)
    by_run = {c.run_id: c for c in calls}
    reserved = transport.reserved()
    assert set(reserved) == set(run_ids)  # every run came as a reservation
    tid = await tenant_of(env, run_ids[0])
    for i, run in enumerate(await runs_of(env, run_ids)):
        assert (run.state, run.result, run.attempt) == ("SUCCESS", i, 1)
        assert run.started_at is not None and run.started_at >= run.due_at  # never early
        [attempt] = await env.store.attempts_list(tid, run_id=run.id)
        assert attempt.state == "SUCCEEDED" and attempt.started_at >= run.due_at
        assert attempt.started_at == run.started_at
        # The attempt is the reservation's own, started under its token.
        leased = reserved[str(run.id)]
        assert datetime.fromisoformat(leased["not_before"]) == run.due_at
        assert (str(attempt.id), attempt.fencing_token) == (
            leased["attempt_id"],
            leased["fencing_token"],
        )
        call = by_run[str(run.id)]
        assert call.attempt_id == str(attempt.id)
        assert call.at >= run.due_at - CLOCK_TOLERANCE, (call.at, run.due_at)

    # Started through ``start``, by token: each exactly once, none refused; anything
    # not started at first was only early.
    tokens = sorted(r["fencing_token"] for r in reserved.values())
    assert sorted(transport.started()) == tokens
    assert transport.refused() == []
    assert set(transport.start_tokens()) == set(tokens)
    not_yet = {t for answer in transport.start_answers() for t in answer["not_yet"]}
    assert not_yet <= set(tokens)
    # Each attempt began when its answer said: at the later of the answer's instant and
    # its own (a start takes the reservations due shortly after the first with it).
    started_at = transport.started_at()
    for run in await runs_of(env, run_ids):
        [attempt] = await env.store.attempts_list(tid, run_id=run.id)
        assert attempt.started_at == max(started_at[attempt.fencing_token], run.due_at)
    assert all(body["ahead"] == LEAD for body in transport.requested("/lease"))
    assert (worker.stats.succeeded, worker.stats.rejected, worker.stats.released) == (n, 0, 0)


async def test_a_run_cancelled_while_reserved_never_reaches_the_handler(env: Env) -> None:
    calls: list[HandlerCall] = []
    # One slot per run: no lease is in flight while both are held.
    worker, transport = reserving_worker(env, concurrency=2)
    recording_handler(worker, calls)
    stop, running = await start_worker(worker, transport)

    due = await env.store.db_now() + timedelta(seconds=2)
    victim, control = await create_runs(env, [due, due])
    await transport.until(lambda: set(transport.reserved()) == {victim, control})
    cancelled = await env.operator.runs.cancel(victim, reason="not needed")
    assert cancelled["state"] == "CANCELLED"
    victim_token = transport.reserved()[victim]["fencing_token"]
    control_token = transport.reserved()[control]["fencing_token"]

    await wait_until_async(lambda: all_in(env, [control], "SUCCESS"), 20)
    await transport.until(lambda: victim_token in transport.refused())
    stop.set()
    await within(running)

    assert [c.run_id for c in calls] == [control]
    # The victim's start was refused, once, and it never started; the control started.
    assert transport.refused() == [victim_token]
    assert transport.started() == [control_token]
    assert transport.start_tokens().count(victim_token) == 1  # dropped, never retried
    tid = await tenant_of(env, victim)
    run = await env.store.runs_get(tid, uuid.UUID(victim))
    assert (run.state, run.attempt, run.started_at) == ("CANCELLED", 0, None)
    assert await env.store.attempts_list(tid, run_id=run.id) == []
    assert (worker.stats.leased, worker.stats.succeeded) == (1, 1)


async def test_a_worker_stopping_hands_its_reservations_back(env: Env) -> None:
    n = 3
    first_calls: list[HandlerCall] = []
    # One slot per run: once all are reserved no lease request is in flight, so no
    # abandoned long-poll can take the runs back as the worker stops.
    first, first_transport = reserving_worker(env, concurrency=n, grace_period=5)
    recording_handler(first, first_calls)
    stop, running = await start_worker(first, first_transport)

    due = await env.store.db_now() + timedelta(seconds=3)
    run_ids = await create_runs(env, [due] * n)
    await first_transport.until(lambda: set(first_transport.reserved()) == set(run_ids))
    stop.set()
    await within(running)

    # Stopped before the instant: nothing was started, everything handed back.
    assert first_calls == [] and first_transport.requested("/start") == []
    held = {r["attempt_id"] for r in first_transport.reserved().values()}
    released = first_transport.release_outcomes()
    assert {o["attempt_id"] for o in released} == held
    assert all((o["ok"], o["run_state"]) == (True, "DISPATCHED") for o in released)
    assert first.stats.released == n
    tid = await tenant_of(env, run_ids[0])
    for run in await runs_of(env, run_ids):
        assert (run.state, run.attempt, run.started_at) == ("DISPATCHED", 0, None)
        assert await env.store.attempts_list(tid, run_id=run.id) == []

    # Free at once: another worker reserves them and runs each once, at its instant.
    second_calls: list[HandlerCall] = []
    second, second_transport = reserving_worker(env, concurrency=n)
    recording_handler(second, second_calls)
    stop, running = await start_worker(second, second_transport)
    await wait_until_async(lambda: all_in(env, run_ids, "SUCCESS"), 20)
    stop.set()
    await within(running)

    assert sorted(c.run_id for c in second_calls) == sorted(run_ids)
    assert set(second_transport.reserved()) == set(run_ids)
    for run in await runs_of(env, run_ids):
        assert run.started_at is not None and run.started_at >= run.due_at
        [attempt] = await env.store.attempts_list(tid, run_id=run.id)
        assert (attempt.number, attempt.state) == (1, "SUCCEEDED")  # the hand-back was free
        assert str(attempt.id) not in held
        assert attempt.worker_id == uuid.UUID(str(second.worker_id))
