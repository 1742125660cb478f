"""Attempts, one execution try each: leasing a batch of ready runs and starting
reservations (the driver's hot statements), heartbeats and results, releases, and
reading them (the expiry sweep is in ``expiry.py``, what a failed try leads to in
``retries.py``). Results are validated by fencing token inside the statement that
applies them: a stale token matches no row, so it changes nothing.

A worker leasing *ahead* also gets runs dispatched ahead of their instant, as
reservations: the run stays DISPATCHED, held for the worker under the attempt id and
token it will start with, and starts only when the worker confirms at its instant
(:meth:`AttemptsMixin.attempts_start_many`). A cancel or pause before that wins, so
handing work out early never takes control away from the user; the instant itself
costs the worker one small request instead of a lease.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Hashable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.errors import (
    StaleFencingTokenError,
)
from cronwheel.domain.model import (
    Attempt,
    AttemptOutcome,
    CancelRequest,
    LeasedAttempt,
    ReservationsStarted,
    Worker,
)
from cronwheel.domain.states import RELEASE, AttemptState, RunState
from cronwheel.metrics import RUNS_THROTTLED
from cronwheel.store.driver import WorkerGone
from cronwheel.store.notices import CHANNEL_RUNS_READY
from cronwheel.store.rows import (
    attempt_from,
    event_row,
)
from cronwheel.store.schema import NO_RESERVATION, attempt_tombstones, attempts, runs, workers
from cronwheel.store.sql import dag, gates
from cronwheel.store.sql.admission import LeasePlan, gated_grants, plan_lease, settle_lease
from cronwheel.store.sql.observed import Execution, observe_executions
from cronwheel.store.sql.retries import Ended, RetriesMixin
from cronwheel.store.sql.statements import attempts_end, may, update_each
from cronwheel.store.sql.workers import WorkersMixin
from cronwheel.store.values import (
    Admitted,
    CompleteItem,
    FailItem,
    GatedHeld,
    GateOpened,
    Gates,
    HeartbeatItem,
    LeaseShare,
)

__all__ = ["AttemptsMixin"]

_Report = TypeVar("_Report", CompleteItem, FailItem)
_HANDED_BACK = "upstream nodes done; its gate opened for a worker that handed it back"


class AttemptsMixin(WorkersMixin, RetriesMixin):
    async def _resolve(
        self,
        conn: AsyncConnection,
        items: Sequence[HeartbeatItem | CompleteItem | FailItem],
        ok: dict[tuple[uuid.UUID, int], AttemptOutcome],
        tenant_id: uuid.UUID | None,
    ) -> list[AttemptOutcome]:
        """One outcome per item, in order. ``ok`` is keyed by (attempt id, live token), so
        an item naming a live attempt with a wrong token is refused on its own. A refused
        item is ``not_found`` when no such attempt is visible (unknown, or another
        tenant's), else ``stale_fencing_token``: one query, and only when something was
        refused."""
        refused = [i.attempt_id for i in items if (i.attempt_id, i.fencing_token) not in ok]
        known: set[uuid.UUID] = set()
        if refused:
            # A tombstone is an attempt deleted with its job or tenant: stale, not unknown.
            for table in (attempts, attempt_tombstones):
                stmt = sa.select(table.c.id).where(self.driver.id_in(table.c.id, refused))
                if tenant_id is not None:
                    stmt = stmt.where(table.c.tenant_id == tenant_id)
                known |= {r.id for r in await conn.execute(stmt)}
        return [
            ok.get((i.attempt_id, i.fencing_token))
            or AttemptOutcome(
                i.attempt_id,
                False,
                "stale_fencing_token" if i.attempt_id in known else "not_found",
            )
            for i in items
        ]

    async def attempts_heartbeat_many(
        self,
        *,
        items: Sequence[HeartbeatItem],
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> list[AttemptOutcome]:
        if not items:
            return []
        async with self._write() as conn:
            ok = await self.driver.attempts_heartbeat(
                conn, items=items, tenant_id=tenant_id, now=now
            )
            return await self._resolve(conn, items, ok, tenant_id)

    async def attempts_complete_many(
        self,
        *,
        items: Sequence[CompleteItem],
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> list[AttemptOutcome]:
        if not items:
            return []
        firsts = _first_reports(items)
        async with self._write() as conn:
            done = await self.driver.attempts_complete(
                conn, items=firsts, tenant_id=tenant_id, now=now
            )
            workflows = {o.workflow_run_id for o in done.values() if o.workflow_run_id}
            if workflows:  # their DAGs move on in this transaction
                at = await self._now(conn, now)
                await dag.advance(self, conn, workflows, at=at, actor="worker")
            await observe_executions(conn, _executions(done.values()), outcome="succeeded")
            resolved = await self._resolve(conn, items, done, tenant_id)
            return _repeats_refused(items, firsts, resolved)

    async def attempts_fail_many(
        self,
        *,
        items: Sequence[FailItem],
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> list[AttemptOutcome]:
        if not items:
            return []
        firsts = _first_reports(items)
        async with self._write() as conn:
            at = await self._now(conn, now)
            ended, keys = await attempts_end(conn, firsts, AttemptState.FAILED, at, tenant_id)
            late = await self._timed_out(conn, list(ended), at)
            failures = [
                Ended(
                    i.attempt_id,
                    ended[i.attempt_id],
                    AttemptState.TIMED_OUT if i.attempt_id in late else AttemptState.FAILED,
                    i.error[:10_000],
                    i.retryable,
                    i.retry_after,
                )
                for i in firsts
                if (i.attempt_id, i.fencing_token) in keys
            ]
            await update_each(
                conn, attempts, [{"id": f.attempt_id, "error": f.error} for f in failures]
            )
            state_of = await self._after_failures(conn, failures, at, actor="worker")
            await self._observe_failed(conn, list(ended), at)
            resolved = await self._resolve(
                conn,
                items,
                {k: AttemptOutcome(k[0], True, run_state=state_of.get(ended[k[0]])) for k in keys},
                tenant_id,
            )
            return _repeats_refused(items, firsts, resolved)

    async def _observe_failed(
        self, conn: AsyncConnection, attempt_ids: list[uuid.UUID], at: datetime
    ) -> None:
        """The execution durations of attempts their workers reported failed."""
        if not attempt_ids:
            return
        rows = await conn.execute(
            sa.select(runs.c.tenant_id, runs.c.task, attempts.c.started_at)
            .select_from(attempts.join(runs, runs.c.id == attempts.c.run_id))
            .where(self.driver.id_in(attempts.c.id, attempt_ids))
        )
        executions = [(r.tenant_id, r.task, (at - r.started_at).total_seconds()) for r in rows]
        await observe_executions(conn, executions, outcome="failed")

    async def attempts_release_many(
        self,
        *,
        items: Sequence[HeartbeatItem],
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> list[AttemptOutcome]:
        if not items:
            return []
        async with self._write() as conn:
            at = await self._now(conn, now)
            return await self._release(
                conn, items, tenant_id, at, reason="released by a worker shutting down"
            )

    async def attempts_release_by_worker(
        self,
        *,
        worker_id: uuid.UUID,
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> list[AttemptOutcome]:
        async with self._write() as conn:
            at = await self._now(conn, now)
            held = sa.select(attempts.c.id, attempts.c.fencing_token).where(
                attempts.c.worker_id == worker_id,
                attempts.c.state == AttemptState.RUNNING.value,
            )
            if tenant_id is not None:
                held = held.where(attempts.c.tenant_id == tenant_id)
            items = [HeartbeatItem(r.id, r.fencing_token) for r in await conn.execute(held)]
            items += await self._reservations_of(conn, worker_id, tenant_id)
            if not items:
                return []
            outcomes = await self._release(
                conn,
                items,
                tenant_id,
                at,
                reason="released: worker deregistered",
                actor=f"worker:{worker_id}",
            )
        # An attempt that ended between the SELECT and the release is not this call's.
        return [o for o in outcomes if o.ok]

    async def _release(
        self,
        conn: AsyncConnection,
        items: Sequence[HeartbeatItem],
        tenant_id: uuid.UUID | None,
        at: datetime,
        *,
        reason: str,
        actor: str | None = None,
    ) -> list[AttemptOutcome]:
        ended, keys = await attempts_end(conn, items, AttemptState.RELEASED, at, tenant_id)
        if ended:
            back = (
                await conn.execute(
                    runs.update()
                    .where(
                        self.driver.id_in(runs.c.id, list(ended.values())),
                        may(RELEASE),
                    )
                    .values(state=RunState.DISPATCHED.value, attempt=runs.c.attempt - 1)
                    .returning(runs.c.id, runs.c.tenant_id, runs.c.job_id, runs.c.pool)
                )
            ).all()
            attempt_of = {run_id: attempt_id for attempt_id, run_id in ended.items()}
            await self._insert_events(
                conn,
                [
                    event_row(
                        at=at,
                        kind="run.transition",
                        tenant_id=r.tenant_id,
                        job_id=r.job_id,
                        run_id=r.id,
                        attempt_id=attempt_of[r.id],
                        from_state=RELEASE.source.value,
                        to_state=RunState.DISPATCHED.value,
                        actor=actor,
                        reason=reason,
                    )
                    for r in back
                ],
            )
            if back:
                await self._notify(conn, CHANNEL_RUNS_READY, sorted({r.pool for r in back}))
        released = {k: AttemptOutcome(k[0], True, run_state=RunState.DISPATCHED) for k in keys}
        rest = [i for i in items if (i.attempt_id, i.fencing_token) not in keys]
        if rest:  # reservations that never started: handed back as they are
            released.update(await self._unreserve(conn, rest, tenant_id, at=at, actor=actor))
        return await self._resolve(conn, items, released, tenant_id)

    async def attempts_cancel_requested(
        self, *, worker_id: uuid.UUID, tenant_id: uuid.UUID | None = None
    ) -> list[CancelRequest]:
        # The worker's live attempts by their partial index (a few, its slots' worth),
        # each run by its key.
        stmt = (
            sa.select(attempts.c.id, attempts.c.run_id, attempts.c.fencing_token)
            .join(
                runs,
                sa.and_(runs.c.tenant_id == attempts.c.tenant_id, runs.c.id == attempts.c.run_id),
            )
            .where(
                attempts.c.worker_id == worker_id,
                attempts.c.state == AttemptState.RUNNING.value,
                runs.c.cancel_requested.is_(sa.true()),
            )
            .order_by(attempts.c.fencing_token)
        )
        if tenant_id is not None:
            stmt = stmt.where(attempts.c.tenant_id == tenant_id)
        async with self._read() as conn:
            rows = (await conn.execute(stmt)).all()
        return [CancelRequest(r.id, r.run_id, r.fencing_token) for r in rows]

    async def attempts_gates(
        self,
        *,
        worker_id: uuid.UUID,
        tokens: Sequence[int],
        tenant_id: uuid.UUID | None = None,
        held: Sequence[GatedHeld] | None = None,
    ) -> Gates:
        if not tokens:
            return Gates()
        async with self._read() as conn:
            if held is not None:
                return Gates(opened=await self._gates_opened(conn, held), held=list(held))
            rows = await self._gated_held(conn, worker_id, tokens, tenant_id)
            opened = await self._gates_opened(conn, rows)
        return Gates(
            opened=opened,
            gone=sorted(set(tokens) - {n.reserved_token for n in rows}),
            held=[GatedHeld(n.reserved_token, n.id, n.workflow_run_id) for n in rows],
        )

    async def _gates_opened(self, conn: AsyncConnection, held: Sequence[Any]) -> list[GateOpened]:
        """Of the gated reservations ``held``, those whose gate opened, by opening."""
        found = await gates.opened_of(self.driver, conn, held)
        together: dict[gates.Opened, list[int]] = {}
        for n in held:
            if n.id in found:
                together.setdefault(found[n.id], []).append(n.reserved_token)
        return [GateOpened(tokens, gate.payload, gate.at) for gate, tokens in together.items()]

    async def _gated_held(
        self,
        conn: AsyncConnection,
        worker_id: uuid.UUID,
        tokens: Sequence[int],
        tenant_id: uuid.UUID | None,
    ) -> list[Any]:
        """The worker's gated reservations among ``tokens`` (nodes still PENDING under
        them), by the reservation index (IS TRUE: the state must not point the planner
        at another index)."""
        stmt = sa.select(
            runs.c.id, runs.c.workflow_run_id, runs.c.reserved_token, runs.c.heartbeat_timeout
        ).where(
            self.driver.id_in(runs.c.reserved_token, list(tokens)),
            runs.c.reserved_token.is_not(None),
            sa.and_(runs.c.reserved_by == worker_id, runs.c.state == RunState.PENDING.value).is_(
                sa.true()
            ),
        )
        if tenant_id is not None:
            stmt = stmt.where(runs.c.tenant_id == tenant_id)
        return list((await conn.execute(stmt)).all())

    async def attempts_get_live(
        self,
        *,
        attempt_id: uuid.UUID,
        fencing_token: int,
        tenant_id: uuid.UUID | None = None,
    ) -> Attempt:
        async with self._read() as conn:
            probe = await self._statement_now(conn, None)
            stmt = sa.select(
                *attempts.c, (attempts.c.lease_expires_at > probe).label("unexpired")
            ).where(attempts.c.id == attempt_id)
            if tenant_id is not None:
                stmt = stmt.where(attempts.c.tenant_id == tenant_id)
            row = (await conn.execute(stmt)).first()
            if row is None and await self._buried(conn, attempt_id, tenant_id):
                raise StaleFencingTokenError(
                    "stale fencing token: this attempt's run was deleted (with its job or "
                    "tenant); nothing was changed",
                    field="fencing_token",
                )
        if row is None:
            raise self._not_found("attempt", attempt_id)
        # A lease that ran out is no longer the worker's, even before the sweep ends it.
        if (
            row.fencing_token != fencing_token
            or row.state != AttemptState.RUNNING.value
            or not row.unexpired
        ):
            raise StaleFencingTokenError(
                "stale fencing token: this attempt's lease is no longer yours; nothing was changed",
                field="fencing_token",
            )
        return attempt_from(cast("sa.Row[Any]", row))

    async def _buried(
        self, conn: AsyncConnection, attempt_id: uuid.UUID, tenant_id: uuid.UUID | None
    ) -> bool:
        """Whether the attempt was deleted with its job or tenant (see ``deletion.py``)."""
        stmt = sa.select(attempt_tombstones.c.id).where(attempt_tombstones.c.id == attempt_id)
        if tenant_id is not None:
            stmt = stmt.where(attempt_tombstones.c.tenant_id == tenant_id)
        return (await conn.execute(stmt)).first() is not None

    async def _timed_out(
        self, conn: AsyncConnection, attempt_ids: list[uuid.UUID], at: datetime
    ) -> set[uuid.UUID]:
        """Failed attempts whose deadline (or progress deadline) had passed are
        TIMED_OUT, as the expiry sweep would have found them: a worker enforcing the
        timeout reports it only a moment after the deadline, and which comes first must
        not change the record."""
        if not attempt_ids:
            return set()
        rows = await conn.execute(
            attempts.update()
            .where(
                self.driver.id_in(attempts.c.id, attempt_ids),
                sa.or_(attempts.c.deadline <= at, attempts.c.progress_deadline <= at),
            )
            .values(state=AttemptState.TIMED_OUT.value)
            .returning(attempts.c.id)
        )
        return {r.id for r in rows}

    async def attempts_list(self, tenant_id: uuid.UUID, *, run_id: uuid.UUID) -> list[Attempt]:
        async with self._read() as conn:
            rows = (
                await conn.execute(
                    sa.select(*attempts.c, workers.c.name.label("worker_name"))
                    .select_from(attempts.outerjoin(workers, workers.c.id == attempts.c.worker_id))
                    .where(attempts.c.tenant_id == tenant_id, attempts.c.run_id == run_id)
                    .order_by(attempts.c.number)
                )
            ).all()
        return [
            dataclasses.replace(attempt_from(cast("Row[Any]", r)), worker_name=r.worker_name)
            for r in rows
        ]

    async def attempts_get(self, attempt_id: uuid.UUID) -> Attempt:
        async with self._read() as conn:
            row = (await conn.execute(attempts.select().where(attempts.c.id == attempt_id))).first()
        if row is None:
            raise self._not_found("attempt", attempt_id)
        return attempt_from(row)

    async def attempts_lease_admitted(
        self,
        *,
        worker: Worker,
        max: int,
        webhooks_only: bool = False,
        ahead: float = 0.0,
        now: datetime | None = None,
        p0_share: float = 0.0,
        reserve: int = 0,
        share: LeaseShare | None = None,
        gated: int = 0,
    ) -> Admitted:
        if max < 1:
            return Admitted([], {})
        view = _view(worker, webhooks_only, ahead)
        async with self._write() as conn:
            try:
                leased, plan, got, names = await self._lease_round(
                    conn,
                    worker,
                    max,
                    webhooks_only,
                    ahead,
                    now,
                    p0_share,
                    later=False,
                    share=share,
                    view=view,
                )
                took = len(leased)
                held, retry_in = dict(plan.held), plan.retry_in(got)
                # Beyond the slots: runs not due yet, reserved — only when the slots'
                # share did not already take all there was, and reached runs not due.
                if (
                    reserve > 0
                    and ahead > 0
                    and len(leased) >= max
                    and any(a.not_before is not None for a in leased)
                ):
                    more, extra, got, also = await self._lease_round(
                        conn, worker, reserve, webhooks_only, ahead, now, p0_share, later=True
                    )
                    leased += more
                    held.update(extra.held)
                    names.update(also)
                    waits = [w for w in (retry_in, extra.retry_in(got)) if w is not None]
                    retry_in = min(waits) if waits else None
                # Beyond those: nodes whose upstream nodes are under way, held gated.
                if gated > 0:
                    leased += await self._lease_gated(conn, worker, gated, webhooks_only, now)
            except WorkerGone as gone:
                raise await self._worker_gone(conn, gone.worker_id) from None
        if share is not None:  # committed: the runs are the cohort's
            share.took(took, view=view)
        for tenant_id, limit in held.items():
            RUNS_THROTTLED.labels(tenant=names[tenant_id], limit=limit).inc()
        return Admitted(leased, held, retry_in, plan.reserve)

    async def _lease_gated(
        self,
        conn: AsyncConnection,
        worker: Worker,
        budget: int,
        webhooks_only: bool,
        now: datetime | None,
    ) -> list[LeasedAttempt]:
        """Reserve up to ``budget`` nodes of the gated queue for the worker, as
        :func:`gated_grants` gives them."""
        queue = await self.driver.ready_queue(
            conn,
            worker=worker,
            max=budget,
            webhooks_only=webhooks_only,
            ahead=0.0,
            now=now,
            gated=True,
        )
        grants = gated_grants(queue, budget)
        if not grants:
            return []
        leased, _ = await self.driver.attempts_lease(
            conn,
            worker=worker,
            grants=grants,
            webhooks_only=webhooks_only,
            ahead=0.0,
            now=now,
            gated=True,
        )
        return leased

    async def _lease_round(
        self,
        conn: AsyncConnection,
        worker: Worker,
        budget: int,
        webhooks_only: bool,
        ahead: float,
        now: datetime | None,
        p0_share: float,
        *,
        later: bool = False,
        share: LeaseShare | None = None,
        view: Hashable = None,
    ) -> tuple[
        list[LeasedAttempt], LeasePlan, dict[tuple[uuid.UUID, int], int], dict[uuid.UUID, str]
    ]:
        """Read the ready queue, let admission decide, take what it granted and write
        its decisions back: ``(attempts, the plan, how many runs each grant gave, the
        waiting tenants' names)``."""
        queue = await self.driver.ready_queue(
            conn,
            worker=worker,
            # In a cohort, one run more: whether the first read found all there was.
            max=budget if share is None else budget + 1,
            webhooks_only=webhooks_only,
            ahead=ahead,
            now=now,
            later=later,
        )
        plan = await plan_lease(
            self.driver,
            conn,
            worker=worker,
            budget=budget,
            queue=queue,
            default_share=p0_share,
            cohort=share,
            view=view,
        )
        leased, got = await self.driver.attempts_lease(
            conn,
            worker=worker,
            grants=plan.grants,
            webhooks_only=webhooks_only,
            ahead=ahead,
            now=now,
            later=later,
        )
        await settle_lease(self.driver, conn, plan, pool=worker.pool, got=got)
        return leased, plan, got, dict(queue.names)

    async def attempts_start_many(
        self,
        *,
        worker_id: uuid.UUID,
        tokens: Sequence[int],
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
        ahead: float = 0.0,
    ) -> ReservationsStarted:
        if not tokens:
            return ReservationsStarted(started_at=None)
        async with self._write() as conn:
            try:
                done = await self.driver.attempts_start(
                    conn,
                    worker_id=worker_id,
                    tokens=tokens,
                    tenant_id=tenant_id,
                    now=now,
                    ahead=ahead,
                )
                # Gated reservations are answered not yet by that: started once their
                # gate opened, looked for only then (not on every start of a burst).
                if done.not_yet:
                    done = await self._start_opened(
                        conn, done, worker_id=worker_id, tenant_id=tenant_id, now=now
                    )
            except WorkerGone as gone:
                raise await self._worker_gone(conn, gone.worker_id) from None
        return done

    async def _start_opened(
        self,
        conn: AsyncConnection,
        done: ReservationsStarted,
        *,
        worker_id: uuid.UUID,
        tenant_id: uuid.UUID | None,
        now: datetime | None,
    ) -> ReservationsStarted:
        """``done`` with the gated reservations among its ``not_yet`` started: those
        whose gate opened, with the payload it gave, no later than the node's heartbeat
        timeout after the opening (by then its attempt's lease, reckoned from the
        opening, would have run out: refused)."""
        held = await self._gated_held(conn, worker_id, done.not_yet, tenant_id)
        if not held:
            return done
        at = await self._now(conn, now)
        beats = {n.reserved_token: n.heartbeat_timeout for n in held}
        late: list[int] = []
        opened: list[GateOpened] = []
        for gate in await self._gates_opened(conn, held):
            allowed = timedelta(seconds=min(beats[t] for t in gate.fencing_tokens))
            if gate.opened_at + allowed > at:
                opened.append(gate)
            else:
                late += gate.fencing_tokens
        again = ReservationsStarted(started_at=None)
        if opened:
            again = await self.driver.attempts_start(
                conn,
                worker_id=worker_id,
                tokens=[t for g in opened for t in g.fencing_tokens],
                tenant_id=tenant_id,
                now=now,
                ahead=0.0,
                opened=opened,
            )
        # Those opened (started now, or answered again) and those too late; the others'
        # gates are shut: not yet.
        handled = {t for g in opened for t in g.fencing_tokens} | set(late)
        begins = [t for t in (done.started_at, again.started_at) if t is not None]
        return ReservationsStarted(
            started_at=min(begins) if begins else None,
            started=[*done.started, *again.started],
            not_yet=[t for t in done.not_yet if t not in handled] + again.not_yet,
            refused=[*done.refused, *again.refused, *late],
            first_tries=[*done.first_tries, *again.first_tries],
        )

    async def _unreserve(
        self,
        conn: AsyncConnection,
        items: Sequence[HeartbeatItem],
        tenant_id: uuid.UUID | None,
        *,
        at: datetime,
        actor: str | None,
    ) -> dict[tuple[uuid.UUID, int], AttemptOutcome]:
        """Release the reservations among ``items``: the runs are free for any worker at
        once. A gated reservation's node stays PENDING for any worker to reserve, or, its
        gate open, is made ready. Reservations of runs first, in id order, as every path
        locking many runs takes them; then gated ones, their workflow runs before them."""
        tokens = [i.fencing_token for i in items]
        wanted = {(i.attempt_id, i.fencing_token) for i in items}
        mine = self.driver.id_in(runs.c.reserved_token, tokens)
        if tenant_id is not None:
            mine = sa.and_(mine, runs.c.tenant_id == tenant_id)
        stmt = (
            sa.select(runs.c.id, runs.c.pool, runs.c.reserved_attempt, runs.c.reserved_token)
            .where(mine, runs.c.state == RunState.DISPATCHED.value)
            .order_by(runs.c.id)
            .with_for_update()
        )
        dispatched = [
            r for r in await conn.execute(stmt) if (r.reserved_attempt, r.reserved_token) in wanted
        ]
        if dispatched:
            await conn.execute(
                runs.update()
                .where(self.driver.id_in(runs.c.id, [r.id for r in dispatched]))
                .values(**NO_RESERVATION)
            )
        gated = [
            n
            for n in await gates.lock_nodes(self.driver, conn, mine)
            if (n.reserved_attempt, n.reserved_token) in wanted
        ]
        opened = await gates.release(self, conn, gated, at=at, actor=actor, reason=_HANDED_BACK)
        ready = {r.pool for r in dispatched} | set(opened)
        if ready:
            await self._notify(conn, CHANNEL_RUNS_READY, sorted(ready))
        states = {r.reserved_token: RunState.DISPATCHED for r in dispatched}
        states |= {n.reserved_token: RunState.PENDING for n in gated}
        return {
            (r.reserved_attempt, r.reserved_token): AttemptOutcome(
                r.reserved_attempt, True, run_state=states[r.reserved_token]
            )
            for r in [*dispatched, *gated]
        }

    async def _reservations_of(
        self, conn: AsyncConnection, worker_id: uuid.UUID, tenant_id: uuid.UUID | None
    ) -> list[HeartbeatItem]:
        stmt = sa.select(runs.c.reserved_attempt, runs.c.reserved_token).where(
            runs.c.reserved_token.is_not(None),
            runs.c.state.in_([RunState.DISPATCHED.value, RunState.PENDING.value]),
            runs.c.reserved_by == worker_id,
        )
        if tenant_id is not None:
            stmt = stmt.where(runs.c.tenant_id == tenant_id)
        rows = await conn.execute(stmt)
        return [HeartbeatItem(r.reserved_attempt, r.reserved_token) for r in rows]


def _first_reports(items: Sequence[_Report]) -> list[_Report]:
    """Each attempt's first outcome of a batch: the one applied. A later one for the
    same attempt is a second report of an outcome, refused as a repetition is."""
    seen: set[uuid.UUID] = set()
    firsts: list[_Report] = []
    for item in items:
        if item.attempt_id not in seen:
            seen.add(item.attempt_id)
            firsts.append(item)
    return firsts


def _repeats_refused(
    items: Sequence[_Report], firsts: Sequence[_Report], outcomes: list[AttemptOutcome]
) -> list[AttemptOutcome]:
    """``outcomes`` (one per item), each repetition's made ``stale_fencing_token``:
    its attempt's outcome was the batch's earlier item's, not its own."""
    if len(firsts) == len(items):
        return outcomes
    first = {id(i) for i in firsts}
    return [
        o if id(i) in first else AttemptOutcome(i.attempt_id, False, "stale_fencing_token")
        for i, o in zip(items, outcomes, strict=True)
    ]


def _view(worker: Worker, webhooks_only: bool, ahead: float) -> Hashable:
    """What a lease can take of its pool's ready queue: two leases alike take the same
    runs."""
    tasks = None if worker.tasks is None else tuple(sorted(worker.tasks))
    return (
        worker.tenant_id,
        tuple(sorted(worker.capabilities)),
        tuple(sorted(worker.tags)),
        tasks,
        webhooks_only,
        ahead,
    )


def _executions(outcomes: Iterable[AttemptOutcome]) -> list[Execution]:
    """(tenant, task, seconds) of the outcomes that say how long they ran."""
    return [
        (o.tenant_id, o.task, o.ran)
        for o in outcomes
        if o.tenant_id is not None and o.ran is not None
    ]
