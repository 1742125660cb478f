"""Firing due runs: one batch dispatched by the driver's ``runs_fire``, and the first
tries of recurring jobs' runs fired by their jobs' policies in the same transaction.

A recurring job keeps exactly one run ahead of it. When that run fires, the same
transaction applies the job's overlap and catch-up policies (``timing.catchup``) and
creates the next occurrence, so a crash can neither lose nor double one: the new row is
written with the fired one, and ``UNIQUE(tenant_id, job_id, due_at)`` makes writing it
twice a no-op. Everything is batched: a few statements per batch, whatever its size."""

from __future__ import annotations

import functools
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.errors import describe_error
from cronwheel.domain.model import FiredRun
from cronwheel.domain.spec import CronSchedule, IntervalSchedule
from cronwheel.domain.states import FIRE, SKIP, JobState, RunState
from cronwheel.domain.workflow import WORKFLOW_POOL
from cronwheel.ids import new_id
from cronwheel.store.driver import FireCandidate, PlannedRun
from cronwheel.store.notices import (
    ANNOUNCE_HORIZON,
    CHANNEL_RUNS_NEW,
    CHANNEL_RUNS_READY,
    announce,
    ready_notices,
)
from cronwheel.store.rows import event_row
from cronwheel.store.schema import (
    NO_RESERVATION,
    PARKED_FIRE_AT,
    runs,
)
from cronwheel.store.sql import dag
from cronwheel.store.sql.quarantine import Poison, QuarantineMixin
from cronwheel.store.sql.statements import update_each
from cronwheel.timing.catchup import MISFIRE_GRACE, FirePlan, plan_fire
from cronwheel.timing.spread import spread_instant

__all__ = ["WAIT_RETRY", "FiringMixin"]


# A run whose job guards against overlap is fired no earlier than this before its
# instant: a scheduler's reckoning of the database's clock may run that much ahead.
_OVERLAP_JUDGED = timedelta(milliseconds=50)
# A run queued behind a running one (overlap=queue_one) looks again this often.
WAIT_RETRY = timedelta(seconds=1)


_ACTIVE = (RunState.DISPATCHED.value, RunState.RUNNING.value)
# How long firing waits for each run still going that overlap=cancel_previous cancels
# (``FiringMixin._previous_held``) before leaving its successor for the next poll.
_PREVIOUS_WAIT = "200ms"


@functools.lru_cache(maxsize=4096)
def _parsed(items: tuple[tuple[str, Any], ...]) -> CronSchedule | IntervalSchedule:
    """Jobs share schedules: validate each distinct one once."""
    data = dict(items)
    if "cron" in data:
        return CronSchedule.model_validate(data)
    return IntervalSchedule.model_validate(data)


def _spread_at(job_id: uuid.UUID, spread: float) -> Callable[[datetime], datetime]:
    return functools.partial(spread_instant, job_id, spread=spread)


class FiringMixin(QuarantineMixin):
    async def _fire_scheduled(
        self,
        conn: AsyncConnection,
        candidates: Sequence[FireCandidate],
        *,
        at: datetime,
        node_id: str,
    ) -> list[FiredRun]:
        """Fire ``candidates`` — SCHEDULED first tries of recurring jobs, already checked
        due (or within the lead) and on a shard ``node_id`` holds — by their jobs'
        policies. A run whose job guards against overlap is fired at its instant, not
        ahead: whether an earlier run still goes is known only then."""
        candidates = [
            r
            for r in candidates
            if r.fire_at <= at + _OVERLAP_JUDGED or r.schedule.get("overlap", "allow") == "allow"
        ]
        schedules = {r.job_id: r.schedule for r in candidates}
        guarded = [j for j, s in schedules.items() if s.get("overlap", "allow") != "allow"]
        busy, waiting = await self._overlap_state(conn, candidates, guarded)
        held_back = await self._previous_held(conn, candidates, busy)
        candidates = [r for r in candidates if r.job_id not in held_back]

        plans: dict[uuid.UUID, FirePlan] = {}
        stray: dict[uuid.UUID, str] = {}
        poison: dict[uuid.UUID, Poison] = {}
        same: dict[tuple[Any, ...], FirePlan] = {}
        for run in sorted(candidates, key=lambda r: r.due_at):
            if run.job_state != JobState.ACTIVE.value:
                # Paused or cancelled while this run was being created beside a fired
                # one: settle it now, or it would come back at every poll.
                stray[run.id] = run.job_state
                continue
            is_busy = bool(busy.get(run.job_id, set()) - {run.id})
            is_waiting = bool(waiting.get(run.job_id, set()) - {run.id})
            try:
                items = tuple(sorted(run.schedule.items()))
                # At the top of the hour thousands of jobs share a schedule and an
                # instant: their plans are the same, so each distinct one is computed
                # once a batch (plans are immutable; the runs they create get their
                # own ids later).
                # A spread job's plan reads its own spread instants once it is missed:
                # then it has its own key. Fired on time, it is the plan of any job of
                # that schedule and instant fired on time with a spread.
                spread_at = _spread_at(run.job_id, run.spread) if run.spread else None
                shared: uuid.UUID | str | None = None
                if spread_at is not None:
                    on_time = at - spread_at(run.due_at) <= MISFIRE_GRACE
                    shared = "on time" if on_time else run.job_id
                key = (items, run.due_at, is_busy, is_waiting, shared)
                plan = same.get(key)
                if plan is None:
                    plan = same[key] = plan_fire(
                        _parsed(items),
                        due_at=run.due_at,
                        now=at,
                        busy=is_busy,
                        waiting=is_waiting,
                        spread_at=spread_at,
                    )
            except Exception as exc:  # the job's own schedule: this run alone is poison
                poison[run.id] = Poison("fire", describe_error(exc))
                continue
            plans[run.id] = plan
        by_id = {r.id: r for r in candidates}
        await self._quarantine(conn, poison, at=at, actor=node_id)
        await self._settle_strays(conn, stray, by_id, at=at, node_id=node_id)
        fired = await self._apply_fates(conn, plans, by_id, at=at, node_id=node_id)
        await self._create_planned(conn, plans, by_id, at=at, node_id=node_id)
        await self._cancel_previous(conn, plans, by_id, busy, at=at, node_id=node_id)
        return fired

    async def _settle_strays(
        self,
        conn: AsyncConnection,
        stray: dict[uuid.UUID, str],
        by_id: dict[uuid.UUID, FireCandidate],
        *,
        at: datetime,
        node_id: str,
    ) -> None:
        """Runs of jobs no longer active: parked when the job is paused, cancelled
        otherwise."""
        parked = [i for i, state in stray.items() if state == JobState.PAUSED.value]
        ended = [i for i, state in stray.items() if state != JobState.PAUSED.value]
        if parked:
            await conn.execute(
                runs.update()
                .where(self.driver.id_in(runs.c.id, parked))
                .values(fire_at=PARKED_FIRE_AT, reason="job paused")
            )
        if ended:
            await conn.execute(
                runs.update()
                .where(self.driver.id_in(runs.c.id, ended))
                .values(state=RunState.CANCELLED.value, finished_at=at, reason="job cancelled")
            )
            await self._insert_events(
                conn,
                [
                    event_row(
                        at=at,
                        kind="run.transition",
                        tenant_id=by_id[i].tenant_id,
                        job_id=by_id[i].job_id,
                        run_id=i,
                        from_state=RunState.SCHEDULED.value,
                        to_state=RunState.CANCELLED.value,
                        actor=node_id,
                        reason="job cancelled",
                    )
                    for i in ended
                ],
            )

    async def _overlap_state(
        self, conn: AsyncConnection, candidates: Sequence[Any], guarded: list[uuid.UUID]
    ) -> tuple[dict[uuid.UUID, set[uuid.UUID]], dict[uuid.UUID, set[uuid.UUID]]]:
        """Per guarded job: its runs DISPATCHED or RUNNING, and its runs waiting behind
        them (SCHEDULED, already due, that fired once and were told to wait)."""
        busy: dict[uuid.UUID, set[uuid.UUID]] = defaultdict(set)
        waiting: dict[uuid.UUID, set[uuid.UUID]] = defaultdict(set)
        if not guarded:
            return busy, waiting
        tenants = list({r.tenant_id for r in candidates})
        rows = await conn.execute(
            sa.select(runs.c.id, runs.c.job_id, runs.c.state).where(
                self.driver.id_in(runs.c.tenant_id, tenants),
                self.driver.id_in(runs.c.job_id, guarded),
                sa.or_(
                    runs.c.state.in_(_ACTIVE),
                    sa.and_(
                        runs.c.state == RunState.SCHEDULED.value,
                        runs.c.overlap_queued.is_(True),
                    ),
                ),
            )
        )
        for r in rows:
            (busy if r.state in _ACTIVE else waiting)[r.job_id].add(r.id)
        return busy, waiting

    async def _previous_held(
        self,
        conn: AsyncConnection,
        candidates: Sequence[FireCandidate],
        busy: dict[uuid.UUID, set[uuid.UUID]],
    ) -> set[uuid.UUID]:
        """overlap=cancel_previous: the runs still going of a job whose run fires are
        cancelled in the same transaction (``_cancel_previous``). They are locked now,
        before anything is written, in the order every path takes runs
        (``_lock_live_runs``), each waited for a moment only (``_PREVIOUS_WAIT``): the
        candidate's own run, newer than they are, is held already, and waiting for an
        older one could close a cycle with a path that holds it and waits for the
        candidate (a cancel of the job). What holds them otherwise (a lease, a worker's
        result, a workflow run advancing) lets go within that moment. Returns the jobs
        whose runs still going could not be taken then: their candidates are left for
        the next poll."""
        if self.driver.dialect == "sqlite":  # one writer: nothing to wait for
            return set()
        # By tenant, each job's runs still going (the candidate's own left out).
        previous: dict[uuid.UUID, dict[uuid.UUID, set[uuid.UUID]]] = defaultdict(dict)
        for r in candidates:
            going = busy.get(r.job_id, set()) - {r.id}
            if r.schedule.get("overlap") == "cancel_previous" and going:
                previous[r.tenant_id][r.job_id] = going
        held_back: set[uuid.UUID] = set()
        for tenant_id, of_jobs in previous.items():
            ids = sorted(set().union(*of_jobs.values()))
            chosen = self.driver.id_in(runs.c.id, ids)
            savepoint = await conn.begin_nested()
            try:
                await conn.execute(sa.text(f"SET LOCAL lock_timeout = '{_PREVIOUS_WAIT}'"))
                await self._lock_live_runs(conn, tenant_id, chosen, retake=False)
                await conn.execute(sa.text("SET LOCAL lock_timeout = DEFAULT"))
            except DBAPIError as exc:
                if not self.driver.lock_not_available(exc):
                    raise
                await savepoint.rollback()  # what it took, and the setting
                held_back.update(of_jobs)
                continue
            await savepoint.commit()
        return held_back

    async def _apply_fates(
        self,
        conn: AsyncConnection,
        plans: dict[uuid.UUID, FirePlan],
        by_id: dict[uuid.UUID, FireCandidate],
        *,
        at: datetime,
        node_id: str,
    ) -> list[FiredRun]:
        dispatch = [i for i, p in plans.items() if p.fate == "DISPATCHED"]
        skip = [i for i, p in plans.items() if p.fate == "SKIPPED"]
        wait = [i for i, p in plans.items() if p.fate == "WAIT"]
        events: list[dict[str, Any]] = []
        if dispatch:
            await conn.execute(
                runs.update()
                .where(self.driver.id_in(runs.c.id, dispatch))
                .values(
                    state=RunState.DISPATCHED.value,
                    dispatched_at=at,
                    overlap_queued=False,
                    **NO_RESERVATION,
                )
            )
            await update_each(
                conn,
                runs,
                [{"id": i, "reason": plans[i].reason} for i in dispatch if plans[i].reason],
            )
        if skip:
            await conn.execute(
                runs.update()
                .where(self.driver.id_in(runs.c.id, skip))
                .values(state=RunState.SKIPPED.value, finished_at=at, overlap_queued=False)
            )
            await update_each(conn, runs, [{"id": i, "reason": plans[i].reason} for i in skip])
        if wait:
            await update_each(
                conn,
                runs,
                [
                    {
                        "id": i,
                        "reason": plans[i].reason,
                        "fire_at": at + WAIT_RETRY,
                        "overlap_queued": True,
                    }
                    for i in wait
                ],
            )
        # The rows were locked as candidates under FIRE's precondition (SKIP's is the same).
        for ids, move, target in (
            (dispatch, FIRE, RunState.DISPATCHED),
            (skip, SKIP, RunState.SKIPPED),
        ):
            events += [
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=by_id[i].tenant_id,
                    job_id=by_id[i].job_id,
                    run_id=i,
                    from_state=move.source.value,
                    to_state=target.value,
                    actor=node_id,
                    reason=plans[i].reason,
                )
                for i in ids
            ]
        await self._insert_events(conn, events)
        if dispatch:
            await self._notify(
                conn,
                CHANNEL_RUNS_READY,
                ready_notices(((by_id[i].pool, by_id[i].fire_at) for i in dispatch), at),
            )
        return [
            FiredRun(
                id=i,
                tenant_id=by_id[i].tenant_id,
                pool=by_id[i].pool,
                fire_at=by_id[i].fire_at,
                dispatched_at=at,
                priority=by_id[i].priority,
            )
            for i in dispatch
        ]

    async def _create_planned(
        self,
        conn: AsyncConnection,
        plans: dict[uuid.UUID, FirePlan],
        by_id: dict[uuid.UUID, FireCandidate],
        *,
        at: datetime,
        node_id: str,
    ) -> None:
        """Write the next occurrences and the replayed or skipped ones; each at most once."""
        planned: list[PlannedRun] = []
        for run_id, plan in plans.items():
            run = by_id[run_id]
            cron = "cron" in run.schedule
            for p in plan.created:
                planned.append(
                    PlannedRun(
                        source=run_id,
                        id=new_id(),
                        due_at=p.due_at,
                        due_local=p.due_local if cron else None,
                        state=p.state,
                        origin=p.origin,
                        reason=p.reason,
                    )
                )
        created = await self.driver.runs_insert_planned(
            conn, planned=planned, sources=by_id, at=at, node_id=node_id
        )
        notices: list[str] = []
        ready: set[str] = set()
        workflows: list[uuid.UUID] = []
        for r in created:
            if r.state == RunState.DISPATCHED.value and r.pool == WORKFLOW_POOL:
                workflows.append(r.id)
            elif r.state == RunState.DISPATCHED.value:
                ready.add(r.pool)
            if r.state == RunState.SCHEDULED.value and r.fire_at < at + ANNOUNCE_HORIZON:
                notices.append(announce(r.id, r.shard, r.fire_at))
        if notices:
            await self._notify(conn, CHANNEL_RUNS_NEW, notices)
        if ready:
            await self._notify(conn, CHANNEL_RUNS_READY, sorted(ready))
        await dag.start(self, conn, workflows, at=at, actor=node_id)

    async def _cancel_previous(
        self,
        conn: AsyncConnection,
        plans: dict[uuid.UUID, FirePlan],
        by_id: dict[uuid.UUID, FireCandidate],
        busy: dict[uuid.UUID, set[uuid.UUID]],
        *,
        at: datetime,
        node_id: str,
    ) -> None:
        """overlap=cancel_previous: the runs still going are cancelled (cooperatively
        when running) in favour of the one that fired."""
        by_tenant: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
        for run_id, plan in plans.items():
            if plan.cancel_previous:
                run = by_id[run_id]
                by_tenant[run.tenant_id] += sorted(busy.get(run.job_id, set()) - {run_id})
        for tenant_id, ids in by_tenant.items():
            if ids:
                events = await self._cancel_runs(
                    conn,
                    tenant_id,
                    self.driver.id_in(runs.c.id, ids),
                    at=at,
                    actor=node_id,
                    reason="a newer run started (overlap=cancel_previous)",
                )
                await self._insert_events(conn, events)

    async def runs_fire(
        self,
        *,
        run_ids: Sequence[uuid.UUID],
        node_id: str,
        now: datetime | None = None,
        lead: float = 0.0,
        epochs: Mapping[int, int] | None = None,
    ) -> list[FiredRun]:
        if not run_ids:
            return []
        async with self._write() as conn:
            fired = await self.driver.runs_fire(
                conn, run_ids=run_ids, node_id=node_id, at=now, lead=lead, epochs=epochs
            )
            if len(fired) < len(run_ids):
                # The rest: first tries of recurring jobs' scheduled runs (their policies
                # apply), or runs no longer firable (cancelled, not ours, not yet due),
                # at the instant the others were fired.
                at = fired[0].dispatched_at if fired else await self._now(conn, now)
                candidates = await self.driver.runs_fire_candidates(
                    conn, run_ids=run_ids, node_id=node_id, at=at, lead=lead, epochs=epochs
                )
                if candidates:
                    fired += await self._fire_scheduled(conn, candidates, at=at, node_id=node_id)
            workflows = [f for f in fired if f.pool == WORKFLOW_POOL]
            if workflows:  # no worker takes a workflow run: it starts its nodes now
                await dag.start(
                    self,
                    conn,
                    [f.id for f in workflows],
                    at=min(f.dispatched_at for f in workflows),
                    actor=node_id,
                )
        return fired
