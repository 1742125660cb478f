"""Overrides against a running system: a real scheduler node dispatching a recurring
job's runs ahead of their instants (``dispatch_lead`` 10 s), real Python workers
reserving them ahead, and the API on a free port, on both backends.

What the store tests (tests/store/test_overrides.py) show one call at a time, shown
here while the node and the workers go on: an override made while a run is held in the
node's window, dispatched ahead or reserved reaches the handler; the next occurrences
take the job's ``future`` overrides until they are removed; and overrides made and
removed while the scheduler fires an every-second job and a worker leases its runs lose
neither a run nor an override — each run's fields are its base with the overrides its
``override_ids`` name, applied in the merge order, and the handler gets exactly those.

No outcome here is decided by timing: every wait is for an outcome, with a deadline,
and the margins before the instants only keep the scenario the one described."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

# The reservations' scheduler node (dispatch_lead 10 s) and API, reused as they are.
from test_worker_reservations import env as env
from test_worker_reservations import reserving_worker, start_worker
from test_worker_reservations import scheduler as scheduler
from test_worker_reservations import settings as settings
from test_worker_sdk import Env, within

from cronwheel import ApiError
from cronwheel.client import Call
from cronwheel.domain.model import Run
from cronwheel.domain.overrides import RunFields, applied, merge_order
from cronwheel.domain.states import RunState
from cronwheel.scheduler import SchedulerNode
from cronwheel.store import RunFilter
from cronwheel.testing import wait_until_async
from cronwheel.worker import TaskContext, Worker

TASK = "overridden"
PAYLOAD = {"v": 1, "keep": {"a": 1}}
TEMPLATE = RunFields(payload=PAYLOAD, timeout=3600.0, priority=2, pool="default")
_UNSTARTED = (RunState.SCHEDULED, RunState.DISPATCHED)


@dataclass(frozen=True)
class Handled:
    """One handler call, as the handler saw it."""

    attempt_id: str
    payload: dict[str, Any]
    deadline: datetime
    pool: str  # the pool of the worker that ran it


def recording(worker: Worker, pool: str, seen: dict[str, list[Handled]]) -> None:
    @worker.task(TASK)
    async def handle(ctx: TaskContext, payload: dict[str, Any]) -> None:
        seen.setdefault(ctx.run_id, []).append(Handled(ctx.attempt_id, payload, ctx.deadline, pool))


async def post(env: Env, path: str, body: dict[str, Any]) -> dict[str, Any]:
    made: dict[str, Any] = await env.operator.send(Call("POST", path, json=body))
    return made


async def delete(env: Env, path: str) -> dict[str, Any]:
    gone: dict[str, Any] = await env.operator.send(Call("DELETE", path))
    return gone


async def job_runs(env: Env, job: dict[str, Any]) -> list[Run]:
    """Every run of ``job``, by due instant."""
    page = await env.store.runs_list(
        uuid.UUID(job["tenant_id"]), filter=RunFilter(job_id=uuid.UUID(job["id"])), limit=1000
    )
    assert page.next_cursor is None
    return sorted(page.items, key=lambda r: r.due_at)


def unstarted(run: Run) -> bool:
    return run.state in _UNSTARTED and run.attempt == 0


async def made_as_recorded(env: Env, run: Run) -> None:
    """The run's fields are its base with the overrides its ``override_ids`` name applied
    in the merge order; a run no override reached is its job's template (untouched
    here)."""
    fields = RunFields(payload=run.payload, timeout=run.timeout, priority=run.priority,
                       pool=run.pool)  # fmt: skip
    if not run.override_ids:
        assert run.base is None
        assert fields == TEMPLATE, run
        return
    assert run.base is not None
    assert RunFields.from_json(run.base) == TEMPLATE
    made = [await env.store.overrides_get(run.tenant_id, i) for i in run.override_ids]
    assert [o.id for o in merge_order(made)] == run.override_ids
    assert fields == applied(TEMPLATE, made), run


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 60) -> None:
    await wait_until_async(check, timeout, what=what, interval=0.05)


# -- overrides reach runs a node holds and a worker reserved ------------------------------


async def test_overrides_reach_runs_held_in_a_window_or_reserved_and_their_handlers(
    env: Env, scheduler: SchedulerNode
) -> None:
    seen: dict[str, list[Handled]] = {}
    worker, transport = reserving_worker(env, concurrency=16)
    recording(worker, "default", seen)
    alt, alt_transport = reserving_worker(env, concurrency=4, pool="alt")
    recording(alt, "alt", seen)
    stop, running = await start_worker(worker, transport)
    alt_stop, alt_running = await start_worker(alt, alt_transport)

    # Every 2 s from 10 s on: the first runs are dispatched ahead at once and reserved;
    # the newest is held, SCHEDULED, in the node's window.
    start = (await env.store.db_now()).replace(microsecond=0) + timedelta(seconds=10)
    job = await env.job(TASK, schedule={"interval": 2, "start": start.isoformat()}, payload=PAYLOAD)
    first = job["first_run_id"]
    jobs_path = f"/v1/jobs/{job['id']}/overrides"
    await transport.until(lambda: first in transport.reserved())
    voided = transport.reserved()[first]["fencing_token"]

    async def one_held() -> bool:
        return any(
            r.state == RunState.SCHEDULED and r.id in scheduler.window._held
            for r in await job_runs(env, job)
        )

    await until(one_held, "a run of the job held in the node's window")
    [held] = [r for r in await job_runs(env, job) if r.state == RunState.SCHEDULED]

    # Made in the reverse of the merge order: next (the reserved first run), run (the
    # held one, to another pool), then future.
    following = await post(
        env, jobs_path, {"scope": "next", "payload": {"scope": "next", "keep": {"n": 1}},
                         "priority": 0}
    )  # fmt: skip
    assert following["run_id"] == first  # 10 s before its instant
    own = await post(
        env,
        f"/v1/runs/{held.id}/overrides",
        {"payload": {"scope": "run"}, "timeout": 77, "pool": "alt"},
    )
    futures = await post(
        env, jobs_path, {"scope": "future", "payload": {"f": 1, "keep": {"a": None}}}
    )
    assert first in futures["runs"] and str(held.id) in futures["runs"]

    # The worker holding the first run's old payload is refused at its instant; the
    # run goes out again with the new one.
    await transport.until(lambda: voided in transport.refused())

    # The handlers of two runs made after the future override took it: then it goes.
    async def two_made_after() -> bool:
        return (
            sum(r.due_at > held.due_at and str(r.id) in seen for r in await job_runs(env, job)) >= 2
        )

    await until(two_made_after, "two runs made after the future override handled")
    started_with = {r.id for r in await job_runs(env, job) if not unstarted(r)}
    removed = await delete(env, f"{jobs_path}/{futures['id']}")
    assert removed["status"] == "removed"
    after = [r for r in await job_runs(env, job) if unstarted(r)]
    assert after  # dispatched ahead or held: the runs it is taken off
    last = after[-1].due_at

    async def one_made_after_removal() -> bool:
        done = [r for r in await job_runs(env, job) if str(r.id) in seen]
        return all(str(r.id) in seen for r in after) and any(r.due_at > last for r in done)

    await until(one_made_after_removal, "the runs after the removal handled")
    stop.set()
    alt_stop.set()
    await within(running)
    await within(alt_running)

    by_id = {str(r.id): r for r in await job_runs(env, job)}
    base_f = {"v": 1, "keep": {}, "f": 1}
    for run_id, calls in seen.items():
        run = by_id[run_id]
        [call] = calls  # each run handled once
        assert call.payload == run.payload, run
        await made_as_recorded(env, run)
        [attempt] = await env.store.attempts_list(run.tenant_id, run_id=run.id)
        assert str(attempt.id) == call.attempt_id
        assert (
            call.deadline == attempt.deadline == attempt.started_at + timedelta(seconds=run.timeout)
        )
        if run_id == first:
            assert (call.payload, run.priority, call.pool) == (
                {**base_f, "keep": {"n": 1}, "scope": "next"},
                0,
                "default",
            )
            assert run.override_ids == [uuid.UUID(futures["id"]), uuid.UUID(following["id"])]
        elif run.id == held.id:
            assert (call.payload, run.timeout, call.pool) == ({**base_f, "scope": "run"}, 77, "alt")
            assert run.override_ids == [uuid.UUID(futures["id"]), uuid.UUID(own["id"])]
        elif run.id in started_with:
            assert (call.payload, run.override_ids) == (base_f, [uuid.UUID(futures["id"])])
        elif run.id in {r.id for r in after} or run.due_at > last:
            assert (call.payload, run.override_ids) == (PAYLOAD, [])
    assert {first, str(held.id)} <= set(seen)
    assert all(str(r.id) in seen for r in after)
    listed = await env.operator.send(Call("GET", jobs_path, params={"ended": "true"}))
    assert {o["id"]: o["status"] for o in listed["items"]} == {
        following["id"]: "consumed",
        own["id"]: "consumed",
        futures["id"]: "removed",
    }


# -- overrides racing with firing and leasing ---------------------------------------------


async def test_overrides_racing_with_firing_and_leasing_lose_nothing(
    env: Env, scheduler: SchedulerNode
) -> None:
    """An every-second job, fired ahead by the node and reserved by the worker, while
    three operators make and remove overrides of every scope as fast as they are
    answered. After each future override is made every run not started has it, after it
    is removed none has; in the end every run is what its override ids say, its handler
    got exactly that, the job's chain of occurrences is whole and every override bound
    to a run is on it."""
    seen: dict[str, list[Handled]] = {}
    worker, transport = reserving_worker(env, concurrency=40)
    recording(worker, "default", seen)
    stop, running = await start_worker(worker, transport)
    job = await env.job(TASK, schedule={"interval": 1}, payload=PAYLOAD)
    jobs_path = f"/v1/jobs/{job['id']}/overrides"
    # The run and next overrides made: by whom, and the run each is on.
    bound: dict[str, tuple[int, str]] = {}

    async def on_unstarted(override_id: str, wanted: bool) -> None:
        for run in await job_runs(env, job):
            if unstarted(run):
                assert (uuid.UUID(override_id) in run.override_ids) == wanted, (run, override_id)

    async def operator(k: int) -> None:
        rnd = random.Random(k)
        i = 0
        # A dozen changes each, and on until a dozen runs were handled meanwhile.
        while i < 12 or len(seen) < 12:
            i += 1
            # Twenty bound to runs each at most: with the futures (one each at a
            # time) the job stays below its limit of active overrides (100).
            mine = sum(1 for made_by in bound.values() if made_by[0] == k)
            step = rnd.choice(("future", "next", "run") if mine < 20 else ("future",))
            if step == "future":
                made = await post(
                    env, jobs_path,
                    {"scope": "future", "payload": {f"f{k}": i, "keep": {"a": i}},
                     "priority": rnd.randrange(4)},
                )  # fmt: skip
                await on_unstarted(made["id"], True)
                await asyncio.sleep(rnd.random() / 2)
                await delete(env, f"{jobs_path}/{made['id']}")
                await on_unstarted(made["id"], False)
            elif step == "next":
                made = await post(
                    env, jobs_path, {"scope": "next", "payload": {f"n{k}": i}, "timeout": 60 + i}
                )
                bound[made["id"]] = (k, made["run_id"])
            else:
                waiting = [r for r in await job_runs(env, job) if unstarted(r)]
                target = rnd.choice(waiting)
                try:
                    made = await post(
                        env, f"/v1/runs/{target.id}/overrides",
                        {"payload": {f"r{k}": i, "keep": None}, "priority": rnd.randrange(4)},
                    )  # fmt: skip
                except ApiError as exc:
                    # It started between the read and the request: refused, nothing made.
                    assert exc.status == 409, exc
                    assert not unstarted(await env.store.runs_get(target.tenant_id, target.id))
                    continue
                bound[made["id"]] = (k, str(target.id))

    await asyncio.gather(*(operator(k) for k in range(3)))
    cutoff = await env.store.db_now()

    async def all_done() -> bool:
        return all(
            r.state == RunState.SUCCESS for r in await job_runs(env, job) if r.due_at <= cutoff
        )

    await until(all_done, "every run due by the end handled")
    stop.set()
    await within(running)

    runs = await job_runs(env, job)
    # The chain is whole: one occurrence a second, each fired, one ahead.
    dues = [r.due_at for r in runs]
    assert dues == [dues[0] + timedelta(seconds=i) for i in range(len(dues))]
    assert [r.state for r in runs].count(RunState.SCHEDULED) <= 1
    assert all(r.state != RunState.SCHEDULED for r in runs[:-1])
    handled = [r for r in runs if r.state == RunState.SUCCESS]
    assert len(handled) >= 10
    for run in runs:
        await made_as_recorded(env, run)
    for run in handled:
        [call] = seen[str(run.id)]
        assert call.payload == run.payload, run
    assert set(seen) <= {str(r.id) for r in runs}
    # Every run and next override is on its run, whatever the run went through.
    by_id = {str(r.id): r for r in runs}
    for override_id, (_k, run_id) in bound.items():
        assert uuid.UUID(override_id) in by_id[run_id].override_ids, (override_id, run_id)
    # No future override is left on.
    listed = await env.operator.send(Call("GET", jobs_path))
    assert all(o["scope"] != "future" for o in listed["items"])
