"""The expiry sweep: attempts whose lease ran out (the worker stopped heartbeating)
end LOST, those past their deadline end TIMED_OUT, and their runs go the way of any
failed try (``retries.py``); reservations not started by their expiry are voided.

The scheduler node that owns shard 0 runs it every ``expire_interval``. Most of the
time nothing has expired, and one read without a transaction says so. When a sweep
fails on a row it cannot attribute, the node splits it by
:meth:`ExpiryMixin.attempts_expire_candidates` and quarantines the row
(``scheduler/isolation.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.states import AttemptState, RunState
from cronwheel.store.notices import CHANNEL_RUNS_READY
from cronwheel.store.schema import NO_RESERVATION, attempts, runs
from cronwheel.store.sql import gates
from cronwheel.store.sql.observed import count_expiries
from cronwheel.store.sql.progress import progress_overdue, stalled
from cronwheel.store.sql.retries import Ended, RetriesMixin

__all__ = ["ExpiryMixin"]

_PAST_DEADLINE = "the attempt ran past the job's timeout"
_LEASE_EXPIRED = "the worker stopped heartbeating: lease expired"
_GATE_LAPSED = "upstream nodes done; its gate opened for a worker that did not start it"


class ExpiryMixin(RetriesMixin):
    async def attempts_expire_candidates(
        self, *, now: datetime | None = None, limit: int = 1000
    ) -> list[tuple[uuid.UUID, uuid.UUID]]:
        async with self._read() as conn:
            probe = await self._statement_now(conn, now)
            rows = (
                await conn.execute(
                    sa.select(attempts.c.id, attempts.c.run_id)
                    .where(_expired(probe))
                    .order_by(attempts.c.id)
                    .limit(limit)
                )
            ).all()
        return [(r.id, r.run_id) for r in rows]

    async def attempts_expire(
        self,
        *,
        now: datetime | None = None,
        limit: int = 1000,
        attempt_ids: Sequence[uuid.UUID] | None = None,
    ) -> int:
        if attempt_ids is not None:
            if not attempt_ids:
                return 0
            async with self._write() as conn:
                at = await self._now(conn, now)
                return await self._expire(
                    conn, at, limit, self.driver.id_in(attempts.c.id, attempt_ids)
                )
        # Most of the time nothing has expired: one read says so, without a transaction.
        async with self._read() as conn:
            probe = await self._statement_now(conn, now)
            due, lapsed = (
                await conn.execute(
                    sa.select(
                        sa.exists().where(_expired(probe)),
                        sa.exists().where(
                            runs.c.reserved_token.is_not(None), runs.c.reserved_until < probe
                        ),
                    )
                )
            ).one()
        freed = 0
        if lapsed:
            # A transaction of its own: what it holds (runs taken in no set order) is
            # let go before the expiry below waits on runs in id order, as a cancel
            # does: holding the one while waiting for the other could deadlock.
            async with self._write() as conn:
                freed = await self._lapse_reservations(conn, await self._now(conn, now))
        if not due:
            return freed
        async with self._write() as conn:
            at = await self._now(conn, now)
            return freed + await self._expire(conn, at, limit, sa.true())

    async def _expire(
        self, conn: AsyncConnection, at: datetime, limit: int, only: sa.ColumnElement[bool]
    ) -> int:
        """End up to ``limit`` expired attempts among ``only``; returns how many.

        Their runs are locked first, in id order, then the attempts, as a worker's
        batch of results takes them: taking an attempt first, the sweep could hold it
        while waiting for its run, held by a late result for it waiting for the
        attempt. Both are passed over when another transaction holds them, never waited
        for: the next sweep ends what is still expired then."""
        found = (
            sa.select(attempts.c.run_id).where(_expired(at), only).limit(limit).scalar_subquery()
        )
        run_ids = (
            (
                await conn.execute(
                    sa.select(runs.c.id)
                    .where(runs.c.id.in_(found))
                    .order_by(runs.c.id)
                    .with_for_update(skip_locked=True)
                )
            )
            .scalars()
            .all()
        )
        if not run_ids:
            return 0
        rows = (
            await conn.execute(
                sa.select(
                    attempts.c.id,
                    attempts.c.run_id,
                    attempts.c.lease_expires_at,
                    attempts.c.deadline,
                    attempts.c.started_at,
                    attempts.c.progress_deadline,
                    attempts.c.progress_at,
                )
                .where(_expired(at), only, self.driver.id_in(attempts.c.run_id, list(run_ids)))
                .order_by(attempts.c.id)
                .with_for_update(skip_locked=True)
            )
        ).all()
        if not rows:
            return 0
        ended: list[Ended] = []
        for r in rows:
            if r.deadline < at:
                state, error = AttemptState.TIMED_OUT, _PAST_DEADLINE
            elif (no_progress := stalled(r, at)) is not None:
                state, error = AttemptState.TIMED_OUT, no_progress
            else:
                state, error = AttemptState.LOST, _LEASE_EXPIRED
            ended.append(Ended(r.id, r.run_id, state, error, True))
        count_expiries(e.state for e in ended)
        # One UPDATE per distinct (state, error): a handful at most.
        for state, error in dict.fromkeys((e.state, e.error) for e in ended):
            ids = [e.attempt_id for e in ended if (e.state, e.error) == (state, error)]
            await conn.execute(
                attempts.update()
                .where(
                    self.driver.id_in(attempts.c.id, ids),
                    attempts.c.state == AttemptState.RUNNING.value,
                )
                .values(state=state.value, finished_at=at, error=error)
            )
        await self._after_failures(conn, ended, at, actor="scheduler")
        return len(ended)

    async def _lapse_reservations(self, conn: AsyncConnection, at: datetime) -> int:
        """Void reservations not started by their expiry: the runs still DISPATCHED are
        back in the ready queue (another worker takes them), and the odd one that ended
        while reserved no longer sits in the reservation index. A run another
        transaction holds (its worker starting it, a cancel) is passed over, never waited
        for: the next sweep voids it if it is still due to be.

        A gated reservation (a PENDING node) that lapsed before its gate opened leaves
        the node as it was, for any worker to reserve; one that lapsed after (its
        holder never started it) leaves it ready: DISPATCHED, due since the opening."""
        lapsing = sa.and_(runs.c.reserved_token.is_not(None), runs.c.reserved_until < at)
        # Gated ones (PENDING nodes): their workflow runs first, as their gates' opening
        # takes them; those another transaction holds wait for the next sweep.
        nodes = await gates.lock_nodes(self.driver, conn, lapsing, skip_locked=True)
        opened_nodes = await gates.opened_of(self.driver, conn, nodes)
        ended = gates.lapsed(nodes, opened_nodes, at)
        opened = await gates.release(
            self, conn, ended, at=at, actor="scheduler", reason=_GATE_LAPSED
        )
        released = len(ended)
        lapsed = (
            sa.select(runs.c.id)
            .where(lapsing, runs.c.state != RunState.PENDING.value)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        rows = (
            await conn.execute(
                runs.update()
                .where(runs.c.id.in_(lapsed))
                .values(**NO_RESERVATION)
                .returning(runs.c.pool, runs.c.state)
            )
        ).all()
        ready = sorted({r.pool for r in rows if r.state == RunState.DISPATCHED.value} | set(opened))
        if ready:
            await self._notify(conn, CHANNEL_RUNS_READY, ready)
        return len(rows) + released


def _expired(at: Any) -> sa.ColumnElement[bool]:
    """A live attempt whose lease, deadline or progress deadline passed before ``at``."""
    return sa.and_(
        attempts.c.state == AttemptState.RUNNING.value,
        sa.or_(
            attempts.c.lease_expires_at < at,
            attempts.c.deadline < at,
            progress_overdue(at),
        ),
    )
