"""Bulk operations (``domain/bulk.py``): accepting one, and its steps.

A step is one transaction: it takes the next rows of the selection (at most ``STEP``;
for runs, those due soonest first), changes them through the same statements as the
single calls (cancel, redrive, the holds of pause and resume, trigger), and adds what
it did to the operation's counts, under the lease of the API node that claimed it: a
node that lost its lease changes nothing (``LeaseLostError``).

Accepting one refuses a tenant that has ``max_open`` open already; claiming, renewing,
failing and retention are ``store/sql/operations.py``.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.audit import Actor
from cronwheel.domain.bulk import (
    JOB_ACTIONS,
    LeaseLostError,
    Operation,
    OperationState,
    Selector,
)
from cronwheel.domain.errors import ValidationError
from cronwheel.domain.states import JobState, RunState
from cronwheel.ids import new_id
from cronwheel.store.notices import CHANNEL_OPERATIONS
from cronwheel.store.rows import event_row, job_from, operation_from
from cronwheel.store.schema import jobs, operations, runs
from cronwheel.store.sql.operations import OperationsMixin
from cronwheel.store.sql.pending import pending_admit, tenant_for_new_runs
from cronwheel.store.sql.redrive import OF_CANCELLED_JOB, RedriveMixin
from cronwheel.store.sql.triggers import TriggersMixin

__all__ = ["STEP", "BulkMixin"]

STEP = 1_000  # rows per step
_TRIGGER_STEP = 200  # a trigger writes a run and two events per job, one by one

# What a cancel takes: runs not started, and running ones not yet asked to stop.
_CANCELLABLE = sa.or_(
    runs.c.state.in_([RunState.SCHEDULED.value, RunState.DISPATCHED.value]),
    sa.and_(runs.c.state == RunState.RUNNING.value, runs.c.cancel_requested.is_(sa.false())),
)
_CANCEL_STATES = (RunState.SCHEDULED.value, RunState.DISPATCHED.value, RunState.RUNNING.value)


class BulkMixin(OperationsMixin, TriggersMixin, RedriveMixin):
    async def operations_create(
        self,
        tenant_id: uuid.UUID,
        *,
        action: str,
        selector: Selector,
        actor: Actor,
        reason: str | None = None,
        max_open: int | None = None,
        now: datetime | None = None,
    ) -> Operation:
        selector.check(action)
        if action == "cancel" and not set(selector.states) <= set(_CANCEL_STATES):
            raise ValidationError(
                f"a cancel takes runs that are {', '.join(_CANCEL_STATES)}",
                field="selector.states",
            )
        if action == "redrive" and not set(selector.states) <= {RunState.DEAD_LETTER.value}:
            raise ValidationError("a redrive takes DEAD_LETTER runs", field="selector.states")
        async with self._write() as conn:
            at = await self._now(conn, now)
            # The tenant's row stays locked (PostgreSQL: FOR NO KEY UPDATE) until the
            # commit: two requests of one tenant count its open operations in turn.
            await self._require_tenant(conn, tenant_id)
            if max_open is not None:
                await self._operations_admit(conn, tenant_id, max_open)
            row = (
                await conn.execute(
                    operations.insert()
                    .values(
                        id=new_id(),
                        tenant_id=tenant_id,
                        action=action,
                        selector=selector.to_json(),
                        reason=reason,
                        actor=actor.name,
                        request_id=actor.request_id,
                        state=OperationState.PENDING.value,
                        accepted_at=at,
                        skipped={},
                        details={},
                    )
                    .returning(*operations.c)
                )
            ).one()
            await self._audit(
                conn,
                actor,
                at=at,
                tenant_id=tenant_id,
                action=f"bulk.{action}",
                target_kind="operation",
                target_id=row.id,
                reason=reason,
                after={"selector": row.selector},
            )
            await self._notify(conn, CHANNEL_OPERATIONS, [str(row.id)])
        return operation_from(row)

    async def operations_step(
        self, operation_id: uuid.UUID, *, owner: str, ttl: float, now: datetime | None = None
    ) -> Operation:
        async with self._write() as conn:
            # A step's statements are planned for their own rows: a plan cached for any
            # values, made while the statistics still saw the tables before a burst of
            # new runs, cost a step of 1,000 runs 0.4 to 9 s instead of 0.07.
            await self.driver.plan_each(conn)
            at = await self._now(conn, now)
            row = (
                await conn.execute(
                    operations.select()
                    .where(
                        operations.c.id == operation_id,
                        operations.c.owner == owner,
                        operations.c.state == OperationState.RUNNING.value,
                    )
                    .with_for_update()
                )
            ).first()
            if row is None:
                raise LeaseLostError(f"operation {operation_id} is not this node's")
            tally = _Tally(row)
            if row.matched == 0 and not row.skipped:
                await self._skip_named(conn, row, tally)
            done = await self._step(conn, row, tally, at)
            values: dict[str, Any] = {
                "matched": tally.matched,
                "changed": tally.changed,
                "skipped": dict(tally.skipped),
                "details": dict(tally.details),
                "cursor": tally.cursor,
                "lease_expires_at": at + timedelta(seconds=ttl),
            }
            if done:
                values |= {"state": OperationState.DONE.value, "finished_at": at, "owner": None}
            updated = (
                await conn.execute(
                    operations.update()
                    .where(operations.c.id == operation_id)
                    .values(**values)
                    .returning(*operations.c)
                )
            ).one()
        return operation_from(updated)

    # -- the steps -------------------------------------------------------------------

    async def _step(self, conn: AsyncConnection, op: Any, tally: _Tally, at: datetime) -> bool:
        """One step of ``op``; True when nothing was left to do."""
        selector = _selector_of(op.selector)
        by, reason = op.actor, op.reason
        if op.action in JOB_ACTIONS:
            where = self._jobs_selected(op.tenant_id, selector, op.accepted_at)
            if op.action == "trigger":
                return await self._trigger_step(conn, op, where, tally, at)
            source, target = (
                (JobState.ACTIVE, JobState.PAUSED)
                if op.action == "pause"
                else (JobState.PAUSED, JobState.ACTIVE)
            )
            # A job changed since (paused, resumed, edited by someone else) is left as
            # it is: the selection is what matched when the operation was accepted.
            unchanged = (
                sa.select(jobs.c.id)
                .where(
                    *where,
                    jobs.c.state == source.value,
                    jobs.c.updated_at <= op.accepted_at,
                )
                .order_by(jobs.c.id)
                .limit(STEP)
            )
            ids = (await conn.execute(unchanged)).scalars().all()
            if not ids:
                return True
            moved = await self._jobs_move(conn, op.tenant_id, ids, source, target, at)
            kind = "job.paused" if op.action == "pause" else "job.resumed"
            events = [
                event_row(
                    at=at,
                    kind=kind,
                    tenant_id=op.tenant_id,
                    job_id=job_id,
                    actor=by,
                    reason=reason,
                    data={"operation": str(op.id)},
                )
                for job_id in moved
            ]
            events += await self._jobs_flip(
                conn, op.tenant_id, moved, pause=op.action == "pause", at=at, by=by
            )
            await self._insert_events(conn, events)
            tally.add(len(ids), len(moved), {f"no longer {source.value}": len(ids) - len(moved)})
            return False
        where = self._runs_selected(op.tenant_id, selector, op.accepted_at)
        if op.action == "cancel":
            ids = (
                (
                    await conn.execute(
                        sa.select(runs.c.id)
                        .where(*where, _CANCELLABLE)
                        .order_by(runs.c.fire_at, runs.c.id)
                        .limit(STEP)
                    )
                )
                .scalars()
                .all()
            )
            if not ids:
                return True
            chosen = self.driver.id_in(runs.c.id, list(ids))
            await self._lock_live_runs(conn, op.tenant_id, chosen)
            events = await self._cancel_runs(
                conn, op.tenant_id, chosen, at=at, actor=by, reason=reason or "cancelled in bulk"
            )
            await self._insert_events(conn, events)
            cancelled = sum(1 for e in events if e["kind"] == "run.transition")
            asked = len(events) - cancelled
            tally.add(len(ids), cancelled, {"finished meanwhile": len(ids) - len(events)})
            tally.details["asked_to_stop"] = tally.details.get("asked_to_stop", 0) + asked
            return False
        # redrive: dead letters, in id order (the order runs are locked in), from where
        # the last step left off: a run sent back that dies again is not taken twice.
        # The tenant first, as every path that adds runs locks it.
        max_pending = await tenant_for_new_runs(conn, op.tenant_id)
        if op.cursor is not None:
            where = [*where, runs.c.id > op.cursor]
        dead = (
            sa.select(runs.c.id)
            .where(*where, runs.c.state == RunState.DEAD_LETTER.value, ~OF_CANCELLED_JOB)
            .order_by(runs.c.id)
            .limit(STEP)
        )
        await self._lock_workflow_runs_of(conn, op.tenant_id, dead)
        locked = (await conn.execute(dead.add_columns(runs.c.state).with_for_update())).all()
        if not locked:
            return True
        sent = await self._redrive_locked(
            conn,
            op.tenant_id,
            {r.id: r.state for r in locked},
            at=at,
            by=by,
            reason=reason or "sent back in bulk",
            max_pending=max_pending,
        )
        tally.add(len(locked), len(sent), {"job cancelled": len(locked) - len(sent)})
        tally.cursor = locked[-1].id
        return False

    async def _trigger_step(
        self,
        conn: AsyncConnection,
        op: Any,
        where: list[sa.ColumnElement[bool]],
        tally: _Tally,
        at: datetime,
    ) -> bool:
        # Triggering leaves a job selectable: the step goes on from the last one.
        if op.cursor is not None:
            where = [*where, jobs.c.id > op.cursor]
        max_pending = await tenant_for_new_runs(conn, op.tenant_id)
        rows = (
            await conn.execute(
                sa.select(*jobs.c)
                .where(*where, jobs.c.state.in_([JobState.ACTIVE.value, JobState.PAUSED.value]))
                .order_by(jobs.c.id)
                .limit(_TRIGGER_STEP)
                .with_for_update()
            )
        ).all()
        if not rows:
            return True
        await pending_admit(conn, op.tenant_id, limit=max_pending, adding=len(rows))
        for row in rows:
            await self._trigger_run(
                conn,
                op.tenant_id,
                job_from(row),
                at=at,
                by=op.actor,
                reason=op.reason or "triggered in bulk",
            )
        tally.add(len(rows), len(rows), {})
        tally.cursor = rows[-1].id
        return False

    async def _skip_named(self, conn: AsyncConnection, op: Any, tally: _Tally) -> None:
        """Count, once, the ids the selector names that the operation cannot act on, with
        why: another tenant's are "not found", exactly as ids that exist nowhere."""
        selector = _selector_of(op.selector)
        if op.action in JOB_ACTIONS or selector.run_ids is None:
            named, table = selector.job_ids, jobs
        else:
            named, table = selector.run_ids, runs
        if named is None:
            return
        state: sa.ColumnElement[Any] = table.c.state
        if op.action == "redrive" and table is runs:
            # A dead letter of a cancelled job is not sent back: say so.
            state = sa.case((OF_CANCELLED_JOB, "job cancelled"), else_=runs.c.state)
        found = dict(
            (
                await conn.execute(
                    sa.select(table.c.id, state).where(
                        table.c.tenant_id == op.tenant_id,
                        self.driver.id_in(table.c.id, list(named)),
                    )
                )
            ).all()
        )
        eligible = _ELIGIBLE[op.action] if table is runs or op.action in JOB_ACTIONS else None
        why: Counter[str] = Counter()
        for ident in dict.fromkeys(named):  # an id named twice counts once
            now_in = found.get(ident)
            if now_in is None:
                why["not found"] += 1
            elif eligible is not None and now_in not in eligible:
                why[now_in.lower()] += 1
        tally.add(sum(why.values()), 0, dict(why))

    def _runs_selected(
        self, tenant_id: uuid.UUID, s: Selector, accepted_at: datetime
    ) -> list[sa.ColumnElement[bool]]:
        where = [runs.c.tenant_id == tenant_id, runs.c.created_at <= accepted_at]
        if s.job_ids is not None:
            where.append(self.driver.id_in(runs.c.job_id, list(s.job_ids)))
        if s.run_ids is not None:
            where.append(self.driver.id_in(runs.c.id, list(s.run_ids)))
        where += [self.driver.json_has(runs.c.tags, tag) for tag in s.tags_all]
        if s.tags_any:
            where.append(sa.or_(*(self.driver.json_has(runs.c.tags, t) for t in s.tags_any)))
        if s.pool is not None:
            where.append(runs.c.pool == s.pool)
        if s.name_prefix is not None:
            where.append(self.driver.starts_with(runs.c.job_name, s.name_prefix))
        if s.states:
            where.append(runs.c.state.in_(s.states))
        if s.due_after is not None:
            where.append(runs.c.due_at >= s.due_after)
        if s.due_before is not None:
            where.append(runs.c.due_at < s.due_before)
        return where

    def _jobs_selected(
        self, tenant_id: uuid.UUID, s: Selector, accepted_at: datetime
    ) -> list[sa.ColumnElement[bool]]:
        where = [jobs.c.tenant_id == tenant_id, jobs.c.created_at <= accepted_at]
        if s.job_ids is not None:
            where.append(self.driver.id_in(jobs.c.id, list(s.job_ids)))
        where += [self.driver.json_has(jobs.c.tags, tag) for tag in s.tags_all]
        if s.tags_any:
            where.append(sa.or_(*(self.driver.json_has(jobs.c.tags, t) for t in s.tags_any)))
        if s.pool is not None:
            where.append(jobs.c.template["pool"].as_string() == s.pool)
        if s.name_prefix is not None:
            where.append(self.driver.starts_with(jobs.c.name, s.name_prefix))
        if s.due_after is not None or s.due_before is not None:
            # A job's next run: its pending run (jobs.next_due_at is its first only).
            pending = [
                runs.c.tenant_id == tenant_id,
                runs.c.job_id == jobs.c.id,
                runs.c.state.in_([RunState.SCHEDULED.value, RunState.DISPATCHED.value]),
            ]
            if s.due_after is not None:
                pending.append(runs.c.due_at >= s.due_after)
            if s.due_before is not None:
                pending.append(runs.c.due_at < s.due_before)
            where.append(sa.select(runs.c.id).where(*pending).exists())
        return where


# The states each action acts on, for the ids a selector names.
_ELIGIBLE: dict[str, frozenset[str]] = {
    "cancel": frozenset(_CANCEL_STATES),
    "redrive": frozenset({RunState.DEAD_LETTER.value}),
    "pause": frozenset({JobState.ACTIVE.value}),
    "resume": frozenset({JobState.PAUSED.value}),
    "trigger": frozenset({JobState.ACTIVE.value, JobState.PAUSED.value}),
}


class _Tally:
    """An operation's counts, as a step adds to them."""

    def __init__(self, row: Any) -> None:
        self.matched: int = row.matched
        self.changed: int = row.changed
        self.skipped: Counter[str] = Counter(row.skipped or {})
        self.details: dict[str, int] = dict(row.details or {})
        self.cursor: uuid.UUID | None = row.cursor

    def add(self, matched: int, changed: int, skipped: dict[str, int]) -> None:
        self.matched += matched
        self.changed += changed
        self.skipped.update({why: n for why, n in skipped.items() if n})


def _selector_of(recorded: dict[str, Any]) -> Selector:
    """The selector an operation recorded (``Selector.to_json``)."""
    values: dict[str, Any] = dict(recorded)
    for name in ("job_ids", "run_ids"):
        if name in values:
            values[name] = tuple(uuid.UUID(i) for i in values[name])
    for name in ("tags_all", "tags_any", "states"):
        if name in values:
            values[name] = tuple(values[name])
    for name in ("due_after", "due_before"):
        if name in values:
            values[name] = datetime.fromisoformat(values[name])
    return Selector(**values)
