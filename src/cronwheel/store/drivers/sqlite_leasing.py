"""The SQLite driver's statements for workers, in SQLAlchemy Core: a few statements
per batch (one UPDATE of the runs, one INSERT of attempts, one of events), never one
per run.

Leasing picks the candidates and starts them (DISPATCHED -> RUNNING, a new attempt and
a new, strictly larger fencing token each); a worker leasing *ahead* also gets runs
dispatched ahead of their instant as reservations: the run stays DISPATCHED, held for
the worker under the attempt id and token it will start with (``attempts_start``).
Results are validated by fencing token inside the UPDATE that applies them: a stale
token matches no row, so it changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.model import AttemptOutcome, LeasedAttempt, ReservationsStarted, Worker
from cronwheel.domain.states import FINISH, START, AttemptState, RunState
from cronwheel.domain.workflow import UPSTREAM_DONE
from cronwheel.ids import new_id
from cronwheel.store.driver import (
    Driver,
    Outcomes,
    WorkerGone,
)
from cronwheel.store.rows import event_row
from cronwheel.store.schema import (
    NO_RESERVATION,
    UtcDateTime,
    attempts,
    pools,
    runs,
    tenants,
    workers,
)
from cronwheel.store.sql.progress import progress_deadline, progress_rows
from cronwheel.store.sql.statements import (
    attempts_end,
    attempts_live,
    jobs_finish_one_off,
    may,
    update_each,
)
from cronwheel.store.values import CompleteItem, GateOpened, Grant, HeartbeatItem, ReadyQueue

__all__ = ["CoreLeasing"]


def _due(r: Any, until: datetime, opened: Mapping[int, GateOpened]) -> bool:
    """A reservation read by a start may start: its gate is ``opened``, or (reserved
    ahead of an instant) its instant is by ``until``."""
    if r.state == RunState.PENDING.value:
        return r.reserved_token in opened
    return bool(r.fire_at <= until)


def _queue(gated: bool) -> list[sa.ColumnElement[bool]]:
    """The ready queue's predicate (its index's), or the gated queue's."""
    if gated:  # schema.GATED, the gated index's predicate
        return [
            runs.c.state == RunState.PENDING.value,
            runs.c.gated_at.is_not(None),
            runs.c.reserved_token.is_(None),
        ]
    return [may(START), runs.c.reserved_token.is_(None)]  # reserved: not in the queue


class CoreLeasing(Driver):
    """The workers' statements of a driver that speaks SQLAlchemy Core only."""

    # -- leasing -------------------------------------------------------------------

    def _takeable(
        self,
        worker: Worker,
        webhooks_only: bool,
        horizon: datetime,
        later: datetime | None,
        gated: bool = False,
    ) -> list[sa.ColumnElement[bool]]:
        """The ready runs of the worker's pool it can take (of its tenant, if it has
        one). fire_at is the run's not-before: dispatched ahead, it waits in the ready
        queue until then, or (within ``ahead`` of it) is reserved; with ``later``, only
        runs due after it are taken. ``gated``: of the gated queue instead."""
        where = [
            *(_queue(gated)),
            runs.c.pool == worker.pool,
            self.json_subset(runs.c.requires, worker.capabilities),
            self.json_subset(runs.c.route_tags, worker.tags),
        ]
        if not gated:
            where.append(runs.c.fire_at <= horizon)
        if later is not None and not gated:
            where.append(runs.c.fire_at > later)
        if worker.tenant_id is not None:
            where.append(runs.c.tenant_id == worker.tenant_id)
        if webhooks_only:  # a run has a task or a webhook, never both
            where.append(runs.c.task.is_(None))
        if worker.tasks is not None:  # a webhook run has no task: its capability decides
            where.append(sa.or_(runs.c.task.is_(None), runs.c.task.in_(worker.tasks)))
        return where

    async def ready_queue(
        self,
        conn: AsyncConnection,
        *,
        worker: Worker,
        max: int,
        webhooks_only: bool,
        ahead: float,
        now: datetime | None,
        later: bool = False,
        gated: bool = False,
    ) -> ReadyQueue:
        at = await self.instant(conn, now)
        takeable = self._takeable(
            worker, webhooks_only, at + timedelta(seconds=ahead), at if later else None, gated
        )
        # The tenants waiting, one probe of the ready index each (a loose scan).
        waiting: list[uuid.UUID] = []
        if worker.tenant_id is not None:
            waiting.append(worker.tenant_id)
        else:
            after: uuid.UUID | None = None
            while True:
                probe = sa.select(sa.func.min(runs.c.tenant_id)).where(
                    runs.c.pool == worker.pool, *_queue(gated)
                )
                if after is not None:
                    probe = probe.where(runs.c.tenant_id > after)
                after = (await conn.execute(probe)).scalar()
                if after is None:
                    break
                waiting.append(after)
        supply: dict[uuid.UUID, dict[int, int]] = {}
        for tenant_id in waiting:
            head = (
                sa.select(runs.c.priority)
                .where(*takeable, runs.c.tenant_id == tenant_id)
                .order_by(runs.c.priority, runs.c.fire_at)
                .limit(max)
                .subquery()
            )
            counts = await conn.execute(
                sa.select(head.c.priority, sa.func.count()).group_by(head.c.priority)
            )
            classes = {priority: n for priority, n in counts}
            if classes:
                supply[tenant_id] = classes
        limits: dict[uuid.UUID, dict[str, Any]] = {}
        names: dict[uuid.UUID, str] = {}
        if supply:
            rows = await conn.execute(
                sa.select(tenants.c.id, tenants.c.name, tenants.c.limits).where(
                    tenants.c.id.in_(list(supply))
                )
            )
            for tenant_id, name, tenant_limits in rows:
                limits[tenant_id], names[tenant_id] = dict(tenant_limits), name
            supply = {t: c for t, c in supply.items() if t in limits}
        share = (
            await conn.execute(
                sa.select(pools.c.p0_reserved_share).where(pools.c.name == worker.pool)
            )
        ).scalar()
        return ReadyQueue(at, share, supply, limits, names)

    async def attempts_lease(
        self,
        conn: AsyncConnection,
        *,
        worker: Worker,
        grants: Sequence[Grant],
        webhooks_only: bool,
        ahead: float,
        now: datetime | None,
        later: bool = False,
        gated: bool = False,
    ) -> tuple[list[LeasedAttempt], dict[tuple[uuid.UUID, int], int]]:
        at = await self.instant(conn, now)
        # First, in the same write transaction: a deregistered worker leases nothing.
        # (Writes are serialised here, so a deregistration is wholly before or after.)
        seen = await conn.execute(
            workers.update()
            .where(workers.c.id == worker.id, workers.c.deregistered_at.is_(None))
            .values(last_seen_at=at)
        )
        if not seen.rowcount:
            raise WorkerGone(worker.id)
        takeable = self._takeable(
            worker, webhooks_only, at + timedelta(seconds=ahead), at if later else None, gated
        )
        picked: list[Any] = []
        got: dict[tuple[uuid.UUID, int], int] = {}
        for grant in grants:
            rows = (
                await conn.execute(
                    sa.select(*_LEASED_COLUMNS)
                    .where(
                        *takeable,
                        runs.c.tenant_id == grant.tenant_id,
                        runs.c.priority == grant.priority,
                    )
                    .order_by(runs.c.fire_at)
                    .limit(grant.count)
                )
            ).all()
            picked += rows
            if rows:
                got[(grant.tenant_id, grant.priority)] = len(rows)
        picked.sort(key=lambda r: (r.priority, r.fire_at))
        if gated:
            return await self._reserve(conn, picked, worker_id=worker.id, gated_at=at), got
        due = [r for r in picked if r.fire_at <= at]
        ahead_of_now = [r for r in picked if r.fire_at > at]
        leased = await self._begin_attempts(
            conn,
            due,
            worker_id=worker.id,
            at=at,
            attempt_ids=[new_id() for _ in due],
            tokens=await self.fencing_tokens(conn, len(due)) if due else [],
        )
        leased += await self._reserve(conn, ahead_of_now, worker_id=worker.id)
        ordered = sorted(leased, key=lambda a: (a.not_before is not None, a.not_before or at))
        return ordered, got

    async def _reserve(
        self,
        conn: AsyncConnection,
        rows: Sequence[Any],
        *,
        worker_id: uuid.UUID,
        gated_at: datetime | None = None,
    ) -> list[LeasedAttempt]:
        """Reserve ``rows`` (DISPATCHED, locked, due later) for the worker; with
        ``gated_at``, nodes of the gated queue, reserved at that instant ahead of their
        gate (the reservation lapses after their heartbeat timeout unless it opens)."""
        if not rows:
            return []
        tokens = await self.fencing_tokens(conn, len(rows))
        reserved = [
            LeasedAttempt(
                attempt_id=new_id(),
                run_id=r.id,
                tenant_id=r.tenant_id,
                job_id=r.job_id,
                number=r.attempt + 1,
                task=r.task,
                webhook=r.webhook,
                payload=r.payload,
                fencing_token=token,
                lease_expires_at=begins + timedelta(seconds=r.heartbeat_timeout),
                deadline=begins + timedelta(seconds=r.timeout),
                due_at=r.due_at if gated_at is None else gated_at,
                heartbeat_timeout=r.heartbeat_timeout,
                not_before=None if gated_at is not None else r.fire_at,
                progress_timeout=r.progress_timeout,
                priority=r.priority,
                workflow_run_id=r.workflow_run_id,
                gated=gated_at is not None,
            )
            for r, token in zip(rows, tokens, strict=True)
            for begins in (r.fire_at if gated_at is None else gated_at,)
        ]
        await update_each(
            conn,
            runs,
            [
                {
                    "id": a.run_id,
                    "reserved_by": worker_id,
                    "reserved_attempt": a.attempt_id,
                    "reserved_token": a.fencing_token,
                    "reserved_until": a.lease_expires_at,
                    "wait_reason": None,
                }
                for a in reserved
            ],
        )
        return reserved

    async def _begin_attempts(
        self,
        conn: AsyncConnection,
        rows: Sequence[Any],
        *,
        worker_id: uuid.UUID,
        at: datetime,
        attempt_ids: Sequence[uuid.UUID],
        tokens: Sequence[int],
        answer: bool = True,
    ) -> list[LeasedAttempt]:
        """Start ``rows`` (DISPATCHED, locked, due; as read before this): each becomes
        RUNNING with a new attempt (of ``attempt_ids`` and ``tokens``, in order), its
        reservation, if any, used up. Returns the attempts as a lease answers them
        (none unless ``answer``: a start answers with tokens only, and its rows need
        not carry what a handler is given)."""
        if not rows:
            return []
        await conn.execute(
            runs.update()
            .where(self.id_in(runs.c.id, [r.id for r in rows]))
            .values(
                state=RunState.RUNNING.value,
                attempt=runs.c.attempt + 1,
                started_at=sa.func.coalesce(runs.c.started_at, at),
                wait_reason=None,
                **NO_RESERVATION,
            )
        )
        leased: list[LeasedAttempt] = []
        attempt_rows: list[dict[str, Any]] = []
        event_rows: list[dict[str, Any]] = []
        for r, attempt_id, token in zip(rows, attempt_ids, tokens, strict=True):
            number = r.attempt + 1
            lease = at + timedelta(seconds=r.heartbeat_timeout)
            deadline = at + timedelta(seconds=r.timeout)
            attempt_rows.append(
                {
                    "id": attempt_id,
                    "tenant_id": r.tenant_id,
                    "run_id": r.id,
                    "number": number,
                    "worker_id": worker_id,
                    "fencing_token": token,
                    "state": AttemptState.RUNNING.value,
                    "lease_expires_at": lease,
                    "deadline": deadline,
                    "started_at": at,
                    "progress_deadline": progress_deadline(at, r.progress_timeout),
                }
            )
            event_rows.append(
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=r.tenant_id,
                    job_id=r.job_id,
                    run_id=r.id,
                    attempt_id=attempt_id,
                    from_state=START.source.value,
                    to_state=RunState.RUNNING.value,
                    actor=f"worker:{worker_id}",
                    data={"attempt": number, "fencing_token": token},
                )
            )
            if not answer:
                continue
            leased.append(
                LeasedAttempt(
                    attempt_id=attempt_id,
                    run_id=r.id,
                    tenant_id=r.tenant_id,
                    job_id=r.job_id,
                    number=number,
                    task=r.task,
                    webhook=r.webhook,
                    payload=r.payload,
                    fencing_token=token,
                    lease_expires_at=lease,
                    deadline=deadline,
                    due_at=r.due_at,
                    heartbeat_timeout=r.heartbeat_timeout,
                    progress_timeout=r.progress_timeout,
                    priority=r.priority,
                    workflow_run_id=r.workflow_run_id,
                )
            )
        await conn.execute(attempts.insert(), attempt_rows)
        await self.events_insert(conn, event_rows)
        return leased

    async def attempts_start(
        self,
        conn: AsyncConnection,
        *,
        worker_id: uuid.UUID,
        tokens: Sequence[int],
        tenant_id: uuid.UUID | None,
        now: datetime | None,
        ahead: float,
        opened: Sequence[GateOpened] = (),
    ) -> ReservationsStarted:
        at = await self.instant(conn, now)
        until = at + timedelta(seconds=ahead)
        live = (
            sa.select(workers.c.id)
            .where(workers.c.id == worker_id, workers.c.deregistered_at.is_(None))
            .with_for_update(read=True)
        )
        if (await conn.execute(live)).first() is None:
            raise WorkerGone(worker_id)
        stmt = (
            sa.select(
                *_STARTED_COLUMNS,
                runs.c.priority,
                runs.c.reserved_attempt,
                runs.c.reserved_token,
                runs.c.state,
            )
            .where(
                runs.c.reserved_token.in_(list(tokens)),
                runs.c.state.in_([START.source.value, RunState.PENDING.value]),
                runs.c.reserved_by == worker_id,
            )
            .with_for_update()
        )
        if tenant_id is not None:
            stmt = stmt.where(runs.c.tenant_id == tenant_id)
        rows = (await conn.execute(stmt)).all()
        gates = {t: g for g in opened for t in g.fencing_tokens}
        # Due: reserved ahead of an instant within ``ahead``, or of a gate that opened.
        due = [r for r in rows if _due(r, until, gates)]
        # Each begins at the later of now and its instant, or at its gate's opening: one
        # write per beginning.
        begin = {
            r.id: gates[r.reserved_token].opened_at
            if r.state == RunState.PENDING.value
            else max(at, r.fire_at)
            for r in due
        }
        by_start: dict[datetime, list[Any]] = {}
        for r in due:
            by_start.setdefault(begin[r.id], []).append(r)
        await self._ready_at_gates(
            conn, [(r, gates[r.reserved_token]) for r in due if r.state == RunState.PENDING.value]
        )
        for begins, group in sorted(by_start.items()):
            await self._begin_attempts(
                conn,
                group,
                worker_id=worker_id,
                at=begins,
                attempt_ids=[r.reserved_attempt for r in group],
                tokens=[r.reserved_token for r in group],
                answer=False,
            )
        found = {r.reserved_token for r in rows}
        return ReservationsStarted(
            started_at=min(by_start) if by_start else None,
            started=[r.reserved_token for r in due],
            not_yet=[r.reserved_token for r in rows if not _due(r, until, gates)],
            refused=[t for t in tokens if t not in found],
            first_tries=[
                (
                    begin[r.id] if r.state == RunState.PENDING.value else r.due_at,
                    begin[r.id],
                    r.tenant_id,
                    r.priority,
                )
                for r in due
                if r.attempt == 0
            ],
        )

    async def _ready_at_gates(
        self, conn: AsyncConnection, rows: Sequence[tuple[Any, GateOpened]]
    ) -> None:
        """Nodes whose gate opened while reserved, about to start: made ready as of
        their gate's opening (DISPATCHED, due then, with the payload it gave, the READY
        transition dated then), as the opening itself left them PENDING."""
        if not rows:
            return
        # One UPDATE per opening: a layer's nodes share theirs.
        by_gate: dict[int, tuple[GateOpened, list[uuid.UUID]]] = {}
        for r, gate in rows:
            by_gate.setdefault(id(gate), (gate, []))[1].append(r.id)
        for gate, ids in by_gate.values():
            await conn.execute(
                runs.update()
                .where(self.id_in(runs.c.id, ids))
                .values(
                    state=START.source.value,
                    fire_at=gate.opened_at,
                    dispatched_at=gate.opened_at,
                    payload=gate.payload,
                    reason=None,
                )
            )
        await self.events_insert(
            conn,
            [
                event_row(
                    at=gate.opened_at,
                    kind="run.transition",
                    tenant_id=r.tenant_id,
                    job_id=r.job_id,
                    run_id=r.id,
                    from_state=RunState.PENDING.value,
                    to_state=START.source.value,
                    reason=UPSTREAM_DONE,
                )
                for r, gate in rows
            ],
        )

    # -- heartbeats and results ----------------------------------------------------

    async def attempts_heartbeat(
        self,
        conn: AsyncConnection,
        *,
        items: Sequence[HeartbeatItem],
        tenant_id: uuid.UUID | None,
        now: datetime | None,
    ) -> Outcomes:
        at = await self.instant(conn, now)
        live = (
            await conn.execute(
                sa.select(
                    attempts.c.id,
                    attempts.c.fencing_token,
                    runs.c.heartbeat_timeout,
                    runs.c.progress_timeout,
                    runs.c.cancel_requested,
                    runs.c.state,
                )
                .join(runs, runs.c.id == attempts.c.run_id)
                .where(attempts_live(items, tenant_id))
            )
        ).all()
        ok: Outcomes = {}
        # (attempt, token) -> the run's progress timeout, for the beats applied
        beaten: dict[tuple[uuid.UUID, int], float | None] = {}
        # One UPDATE per distinct heartbeat timeout: almost always just one.
        by_timeout: dict[float, list[uuid.UUID]] = {}
        for r in live:
            by_timeout.setdefault(r.heartbeat_timeout, []).append(r.id)
        for timeout, ids in by_timeout.items():
            lease = at + timedelta(seconds=timeout)
            updated = await conn.execute(
                attempts.update()
                .where(
                    self.id_in(attempts.c.id, ids),
                    attempts.c.state == AttemptState.RUNNING.value,
                )
                .values(lease_expires_at=lease, heartbeat_at=at)
                .returning(attempts.c.id)
            )
            done = {u.id for u in updated}
            for r in live:
                if r.id in done:
                    beaten[r.id, r.fencing_token] = r.progress_timeout
                    ok[r.id, r.fencing_token] = AttemptOutcome(
                        r.id,
                        True,
                        lease_expires_at=lease,
                        cancel_requested=bool(r.cancel_requested),
                        run_state=RunState(r.state),
                    )
        await update_each(conn, attempts, progress_rows(items, beaten, at))
        return ok

    async def attempts_complete(
        self,
        conn: AsyncConnection,
        *,
        items: Sequence[CompleteItem],
        tenant_id: uuid.UUID | None,
        now: datetime | None,
    ) -> Outcomes:
        at = await self.instant(conn, now)
        ended, keys = await attempts_end(conn, items, AttemptState.SUCCEEDED, at, tenant_id)
        if not ended:
            return {}
        done = (
            await conn.execute(
                runs.update()
                .where(
                    self.id_in(runs.c.id, list(ended.values())),
                    may(FINISH),
                )
                .values(
                    state=sa.case(
                        (runs.c.cancel_requested, RunState.CANCELLED.value),
                        else_=RunState.SUCCESS.value,
                    ),
                    finished_at=at,
                    reason=sa.case(
                        (runs.c.cancel_requested, "cancelled while running"), else_=None
                    ),
                )
                .returning(
                    runs.c.id,
                    runs.c.tenant_id,
                    runs.c.job_id,
                    runs.c.state,
                    runs.c.task,
                    runs.c.workflow_run_id,
                )
            )
        ).all()
        began = {
            r.id: r.started_at
            for r in await conn.execute(
                sa.select(attempts.c.id, attempts.c.started_at).where(
                    self.id_in(attempts.c.id, list(ended))
                )
            )
        }
        results = [
            {"id": i.attempt_id, "result": i.result}
            for i in items
            if i.result is not None and (i.attempt_id, i.fencing_token) in keys
        ]
        await update_each(conn, attempts, results)
        await update_each(
            conn, runs, [{"id": ended[r["id"]], "result": r["result"]} for r in results]
        )
        attempt_of = {run_id: attempt_id for attempt_id, run_id in ended.items()}
        await self.events_insert(
            conn,
            [
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=r.tenant_id,
                    job_id=r.job_id,
                    run_id=r.id,
                    attempt_id=attempt_of[r.id],
                    from_state=FINISH.source.value,
                    to_state=r.state,
                    reason="cancelled while running" if r.state == "CANCELLED" else None,
                )
                for r in done
            ],
        )
        await jobs_finish_one_off(conn, self, [r.job_id for r in done], at)
        by_run = {r.id: r for r in done}
        outcomes: Outcomes = {}
        for key in keys:
            run = by_run.get(ended[key[0]])
            outcomes[key] = AttemptOutcome(
                key[0],
                True,
                run_state=None if run is None else RunState(run.state),
                tenant_id=None if run is None else run.tenant_id,
                task=None if run is None else run.task,
                ran=None if run is None else (at - began[key[0]]).total_seconds(),
                workflow_run_id=None if run is None else run.workflow_run_id,
            )
        return outcomes


# A run's own due instant, for its worker and the start-lateness metric: a workflow's
# node run is due when it became ready (its fire_at; its due_at is its workflow run's).
_OWN_DUE = sa.type_coerce(
    sa.case((runs.c.node == "", runs.c.due_at), else_=runs.c.fire_at), UtcDateTime
).label("due_at")
_LEASED_COLUMNS = (
    runs.c.id,
    runs.c.tenant_id,
    runs.c.job_id,
    runs.c.attempt,
    runs.c.task,
    runs.c.webhook,
    runs.c.payload,
    runs.c.timeout,
    runs.c.heartbeat_timeout,
    runs.c.progress_timeout,
    _OWN_DUE,
    runs.c.priority,
    runs.c.fire_at,
    runs.c.workflow_run_id,
)
# What starting a reservation reads of its run: no payload, task or webhook (the worker
# has them from its lease).
_STARTED_COLUMNS = (
    runs.c.id,
    runs.c.tenant_id,
    runs.c.job_id,
    runs.c.attempt,
    runs.c.timeout,
    runs.c.heartbeat_timeout,
    runs.c.progress_timeout,
    _OWN_DUE,
    runs.c.fire_at,
)
