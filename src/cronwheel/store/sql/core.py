"""The store's shared machinery: engine, transactions and notifications over the driver,
and the steps several rooms take (locking a job's live runs, cancelling runs)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import NotFoundError, StoreUnavailableError
from cronwheel.domain.model import Job
from cronwheel.domain.states import ACTIVE_STATES, CANCEL, AttemptState, RunState
from cronwheel.domain.workflow import NODE_INPUT_MAX, WORKFLOW_POOL
from cronwheel.store.base import Store, Subscription
from cronwheel.store.driver import Driver
from cronwheel.store.notices import CHANNEL_CANCELS, worker_notice
from cronwheel.store.rows import AUDIT_COLUMNS, audit_record, event_row, job_from
from cronwheel.store.schema import UtcDateTime, attempts, audit, jobs, runs, tenants
from cronwheel.store.sql import dag
from cronwheel.store.values import Migrated

__all__ = ["MIGRATIONS_DIR", "LocalSubscription", "Retake", "SqlCore", "jobs_select"]

log = logging.getLogger("cronwheel.store")

T = TypeVar("T")

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"

# A job's live runs, locked before it (``_lock_live_runs``), and how many times the
# locks are taken again when a run was made between the two (``_lock_jobs_with_runs``).
_LIVE = sorted(s.value for s in ACTIVE_STATES)
_RELOCKS = 20

# How long a measured offset from the database clock serves ``db_now_estimate``.
_CLOCK_MAX_AGE = 10.0


class LocalSubscription(Subscription):
    """Payloads pushed by the store's own process (and, on PostgreSQL, by LISTEN)."""

    def __init__(self, owner: dict[str, list[LocalSubscription]], channel: str) -> None:
        self._owner = owner
        self._channel = channel
        self._payloads: list[str] = []
        self._event = asyncio.Event()
        owner.setdefault(channel, []).append(self)

    def push(self, payloads: Sequence[str]) -> None:
        self._payloads.extend(payloads)
        self._event.set()

    async def wait(self, timeout: float) -> list[str]:
        if not self._payloads:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout)
        self._event.clear()
        payloads, self._payloads = self._payloads, []
        return payloads

    def close(self) -> None:
        subs = self._owner.get(self._channel, [])
        if self in subs:
            subs.remove(self)


class Retake:
    """A savepoint (PostgreSQL) that locks are given back to, to be taken again: set
    once, rolled back to as often as needed, released at the end. One subtransaction in
    all, however many tries: a new nested transaction per try would leave one behind at
    each rollback (PostgreSQL sets the savepoint again), and past 64 of them every other
    session's visibility checks slow down."""

    def __init__(self, conn: AsyncConnection, driver: Driver, name: str) -> None:
        self._conn, self._driver, self._name = conn, driver, name

    async def set(self) -> None:
        await self._conn.execute(sa.text(f"SAVEPOINT {self._name}"))

    async def back(self) -> None:
        """Undo what was done since it was set, and let go of what was locked."""
        await self._conn.execute(sa.text(f"ROLLBACK TO SAVEPOINT {self._name}"))

    async def give_back(self, exc: DBAPIError, *, then_wait: float) -> None:
        """After ``exc``: when it says a row asked for without waiting is held
        (``Driver.lock_not_available``), undo what was done since the savepoint was set
        and wait ``then_wait`` seconds, for the holder to go first; else raise it."""
        if not self._driver.lock_not_available(exc):
            raise exc
        await self.back()
        await asyncio.sleep(then_wait)

    async def release(self) -> None:
        """Keep what was done since it was set."""
        await self._conn.execute(sa.text(f"RELEASE SAVEPOINT {self._name}"))


class SqlCore(Store):
    """The one store: engine, transactions, notifications and shared steps, over a
    driver that knows the database (``store/driver.py``)."""

    def __init__(self, driver: Driver, *, node_input_limit: int = NODE_INPUT_MAX) -> None:
        self.driver = driver
        # The most bytes of JSON a workflow's node is given when made ready (dag.py).
        self.node_input_limit = node_input_limit
        self.url = driver.url
        self._engine: AsyncEngine | None = None
        self._subs: dict[str, list[LocalSubscription]] = {}
        self._clock_offset: timedelta | None = None
        self._clock_read_at = 0.0
        # Done when the measurement under way ends (None: none is).
        self._clock_reading: asyncio.Future[None] | None = None

    @property
    def dialect(self) -> str:  # type: ignore[override]
        return self.driver.dialect

    # -- lifecycle -----------------------------------------------------------------

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            raise StoreUnavailableError("the store is not open")
        return self._engine

    async def open(self) -> None:
        if self._engine is None:
            self._engine = self.driver.make_engine()
            await self.driver.opened(self._engine, self._deliver)

    async def close(self) -> None:
        await self.driver.closing()
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    async def migrate(self) -> Migrated:
        from alembic import command
        from alembic.config import Config
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        opened_here = self._engine is None
        await self.open()
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        try:
            async with self.driver.begin_migration(self.engine) as conn:
                await self.driver.migration_lock(conn)

                def upgrade(sync_conn: sa.Connection) -> Migrated:
                    def revision() -> str | None:
                        return MigrationContext.configure(sync_conn).get_current_revision()

                    before = revision()
                    config.attributes["connection"] = sync_conn
                    command.upgrade(config, "head")
                    after = revision()
                    script = ScriptDirectory.from_config(config)
                    steps = 0
                    if after is not None and after != before:
                        steps = len(list(script.iterate_revisions(after, before or "base")))
                    return Migrated(before=before, after=after, steps=steps)

                done: Migrated = await conn.run_sync(upgrade)
                return done
        finally:
            if opened_here:
                await self.close()

    async def ping(self) -> None:
        try:
            async with self.engine.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
        except (OSError, DBAPIError) as exc:
            raise StoreUnavailableError(f"the database does not answer: {exc}") from exc

    async def db_now(self) -> datetime:
        async with self.engine.connect() as conn:
            return await self.driver.db_now(conn)

    async def db_now_estimate(self) -> datetime:
        # One reader at a time: the others go on with the offset they have or, having
        # none yet (a process started under load), wait for the first one's.
        while self._clock_offset is None and self._clock_reading is not None:
            await asyncio.shield(self._clock_reading)
        if self._clock_offset is None or (
            time.monotonic() - self._clock_read_at > _CLOCK_MAX_AGE and self._clock_reading is None
        ):
            await self._clock_measure()
        assert self._clock_offset is not None
        return datetime.now(UTC) + self._clock_offset

    async def _clock_measure(self) -> None:
        reading = self._clock_reading = asyncio.get_running_loop().create_future()
        try:
            before = datetime.now(UTC)
            db = await self.db_now()
            after = datetime.now(UTC)
            # A lower bound: the database read its clock before ``after``.
            self._clock_offset = db - after
            self._clock_read_at = time.monotonic()
            log.debug(
                "clock offset measured",
                extra={
                    "event": "clock_offset",
                    "offset": self._clock_offset.total_seconds(),
                    "round_trip": (after - before).total_seconds(),
                },
            )
        finally:
            # Those waiting measure again if this one failed.
            self._clock_reading = None
            reading.set_result(None)

    async def _now(self, conn: AsyncConnection, now: datetime | None) -> datetime:
        return await self.driver.instant(conn, now)

    async def _statement_now(self, conn: AsyncConnection, now: datetime | None) -> Any:
        """``now``, or the database clock: read inside the statement where the database
        can (no round trip of its own), beforehand elsewhere."""
        if now is None and self.driver.now_in_statement:
            return sa.func.now()
        return await self._now(conn, now)

    def _write(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A write transaction. Local notifications queued in it go out after commit."""
        return self._transaction(self.driver.begin_write)

    @contextlib.asynccontextmanager
    async def _transaction(
        self,
        begin: Callable[[AsyncEngine], contextlib.AbstractAsyncContextManager[AsyncConnection]],
    ) -> AsyncIterator[AsyncConnection]:
        pending: list[tuple[str, Sequence[str]]] = []
        try:
            async with begin(self.engine) as conn:
                conn.info["cw_pending"] = pending
                try:
                    yield conn
                finally:
                    # A connection cut off mid-statement (a cancelled task) refuses even
                    # this until rolled back: its error must not replace the
                    # cancellation. (Each transaction sets its own list anyway.)
                    with contextlib.suppress(DBAPIError, sa.exc.InvalidRequestError):
                        conn.info.pop("cw_pending", None)
        except Exception as exc:
            if self.driver.transient(exc):
                raise StoreUnavailableError(f"the database failed, try again: {exc}") from exc
            raise
        for channel, payloads in pending:
            self._deliver(channel, payloads)

    async def _alone(self, statement: Awaitable[T]) -> T:
        """Await a driver's statement that is a transaction of its own (``…_alone``):
        its failures are a transaction's (a transient one: try again)."""
        try:
            return await statement
        except Exception as exc:
            if self.driver.transient(exc):
                raise StoreUnavailableError(f"the database failed, try again: {exc}") from exc
            raise

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        try:
            async with self.engine.connect() as conn:
                await self.driver.prepare_read(conn)
                yield conn
        except Exception as exc:
            if self.driver.transient(exc):
                raise StoreUnavailableError(f"the database failed, try again: {exc}") from exc
            raise

    # -- notifications -------------------------------------------------------------

    def subscribe(self, channel: str) -> Subscription:
        return LocalSubscription(self._subs, channel)

    def _deliver(self, channel: str, payloads: Sequence[str]) -> None:
        for sub in list(self._subs.get(channel, [])):
            sub.push(payloads)

    async def _notify(self, conn: AsyncConnection, channel: str, payloads: Sequence[str]) -> None:
        """Queue notifications; they are delivered when ``conn``'s transaction commits."""
        await self.driver.notify(conn, channel, payloads)

    # -- shared steps ----------------------------------------------------------------

    async def _insert_events(self, conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
        await self.driver.events_insert(conn, rows)

    async def _audit(
        self,
        conn: AsyncConnection,
        actor: Actor | None,
        *,
        at: datetime,
        tenant_id: uuid.UUID | None,
        action: str,
        target_kind: str,
        target_id: uuid.UUID | str | None,
        reason: str | None = None,
        before: dict[str, Any] | None = None,
        after: dict[str, Any] | None = None,
    ) -> None:
        """Append the audit record of a change, in the change's own transaction
        (``domain/audit.py``). A change nobody asked for (``actor`` None: the system's
        own, or a test's) is recorded in the history only."""
        if actor is None:
            return
        record = audit_record(
            actor,
            at=at,
            tenant_id=tenant_id,
            action=action,
            target_kind=target_kind,
            target_id=target_id,
            reason=reason,
            before=before,
            after=after,
        )
        await conn.execute(audit.insert().values(dict(zip(AUDIT_COLUMNS, record, strict=True))))

    async def _job_with_runs(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, job_id: uuid.UUID
    ) -> Job:
        """The job, locked after its live runs (``_lock_jobs_with_runs``); or
        NotFoundError."""
        job = (await self._lock_jobs_with_runs(conn, tenant_id, [job_id])).get(job_id)
        if job is None:
            raise self._not_found("job", job_id)
        return job

    async def _lock_jobs_with_runs(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, job_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, Job]:
        """Lock the jobs' live runs (``_lock_live_runs``), then the jobs in id order,
        with none of their live runs left out; returns the jobs found, as locked.

        A run committed between the two (a scheduler firing one occurrence makes the
        next) was not there to be locked. Left so, this transaction would hold its job
        and then wait for that run, to change it, while whoever locked the run — to fire
        it, lease it or start it — may wait for the job: a new run it makes references
        the job, and a trigger or an override locks it. That is a deadlock. So the locks
        are taken under a savepoint and, when a live run of the jobs is found that they
        missed, given back and taken again from the start: rolling back to the savepoint
        lets the other transaction go first. SQLite runs one write transaction at a
        time: nothing can come between."""
        ids = sorted(set(job_ids))
        of_jobs = self.driver.id_in(runs.c.job_id, ids)

        async def lock_jobs() -> dict[uuid.UUID, Job]:
            rows = await conn.execute(
                sa.select(*jobs.c)
                .where(jobs.c.tenant_id == tenant_id, self.driver.id_in(jobs.c.id, ids))
                .order_by(jobs.c.id)
                .with_for_update()
            )
            return {job.id: job for job in map(job_from, rows)}

        if self.driver.dialect == "sqlite":
            await self._lock_live_runs(conn, tenant_id, of_jobs)
            return await lock_jobs()
        savepoint = Retake(conn, self.driver, "cw_job_runs")
        await savepoint.set()
        for _ in range(_RELOCKS):
            locked = await self._lock_live_runs(conn, tenant_id, of_jobs)
            found = await lock_jobs()
            live = await conn.execute(
                sa.select(runs.c.id).where(
                    runs.c.tenant_id == tenant_id, of_jobs, runs.c.state.in_(_LIVE)
                )
            )
            if set(live.scalars()) <= locked:
                await savepoint.release()
                return found
            await savepoint.back()
        await savepoint.release()
        # Runs keep being made between the two: lock them now, as before this check.
        await self._lock_live_runs(conn, tenant_id, of_jobs)
        found = await lock_jobs()
        await self._lock_live_runs(conn, tenant_id, of_jobs)
        return found

    async def _lock_live_runs(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        where: sa.ColumnElement[bool],
        *,
        nowait: bool = False,
        retake: bool = True,
    ) -> set[uuid.UUID]:
        """Lock the selected runs that are not finished, in id order, before touching
        their job: every path that changes runs and their job (results, expiry, cancel,
        pause) then takes run locks before the job's, so they cannot deadlock, and a
        retry committed meanwhile cannot slip past a cancel.

        Workflow runs are taken between their nodes: first every selected run that is
        not a workflow run (plain runs and nodes) together with the live nodes of the
        selected workflow runs, in id order, but for the nodes still waiting (PENDING);
        then the workflow runs selected and those of the waiting nodes selected, in id
        order; then the waiting nodes. That is the order of a worker's batch of results
        (its runs, plain runs and running nodes, in id order, then the workflow runs it
        advances) and of advancing a workflow run (``dag.advance``: it holds the
        workflow run when it makes its waiting nodes ready or skips them). Any other
        order could hold a run such a path waits for while waiting for one it holds.

        A node still waiting when the workflow runs were picked may have been made
        ready, leased and ended meanwhile, its worker's result now holding it and
        waiting for the workflow run held here: the waiting nodes are asked for without
        waiting, and when one is held the locks are given back (a savepoint) and taken
        again a moment later.

        Returns the ids locked. ``nowait``: a row another transaction holds fails the
        statement (``Driver.lock_not_available``);
        not ``retake``: a waiting node held elsewhere is waited for, not given back
        (for a caller with a lock timeout of its own)."""
        live = runs.c.state.in_(_LIVE)
        waiting = runs.c.state == RunState.PENDING.value
        is_owner = sa.and_(runs.c.pool == WORKFLOW_POOL, runs.c.workflow_run_id.is_(None))
        found = (
            await conn.execute(
                sa.select(runs.c.id, runs.c.workflow_run_id, runs.c.state).where(
                    runs.c.tenant_id == tenant_id,
                    where,
                    sa.or_(sa.and_(live, is_owner), waiting),
                )
            )
        ).all()
        owners = sorted({r.id for r in found if r.workflow_run_id is None})
        workflows = sorted(
            set(owners) | {r.workflow_run_id for r in found if r.workflow_run_id is not None}
        )
        chosen = sa.and_(where, sa.not_(is_owner))  # plain runs and nodes selected
        if owners:
            chosen = sa.or_(chosen, self.driver.id_in(runs.c.workflow_run_id, owners))

        async def take(which: sa.ColumnElement[bool], *, now: bool = False) -> set[uuid.UUID]:
            rows = await conn.execute(
                sa.select(runs.c.id)
                .where(runs.c.tenant_id == tenant_id, which, live)
                .order_by(runs.c.id)
                .with_for_update(nowait=nowait or now)
            )
            return set(rows.scalars())

        if not workflows:
            return await take(chosen)
        steps = [
            (sa.and_(chosen, sa.not_(waiting)), False),
            (self.driver.id_in(runs.c.id, workflows), False),
            (sa.and_(chosen, runs.c.workflow_run_id.is_not(None)), True),
        ]
        if self.driver.dialect == "sqlite" or nowait or not retake:
            return {i for which, _ in steps for i in await take(which)}
        savepoint = Retake(conn, self.driver, "cw_live_runs")
        await savepoint.set()
        for attempt in range(_RELOCKS):
            try:
                locked = {i for which, now in steps for i in await take(which, now=now)}
            except DBAPIError as exc:
                await savepoint.give_back(exc, then_wait=min(0.002 * 2**attempt, 0.1))
                continue
            await savepoint.release()
            return locked
        await savepoint.release()
        # Held all along: wait for them (as before this check).
        return {i for which, _ in steps for i in await take(which)}

    async def _cancel_runs(
        self,
        conn: AsyncConnection,
        tenant_id: uuid.UUID,
        where: sa.ColumnElement[bool],
        *,
        at: datetime,
        actor: str | None,
        reason: str,
    ) -> list[dict[str, Any]]:
        """Cancel the selected runs not yet started, and ask running ones to stop: the
        workers running them are notified (``CHANNEL_CANCELS``) once this commits, and
        learn of it from their cancels long-poll — or, the notice lost, their next
        heartbeat."""
        out: list[dict[str, Any]] = []
        workflows: set[uuid.UUID] = set()
        for source in CANCEL.source_values:
            cancelled = (
                await conn.execute(
                    runs.update()
                    .where(runs.c.tenant_id == tenant_id, where, runs.c.state == source)
                    .values(state=RunState.CANCELLED.value, finished_at=at, reason=reason)
                    .returning(runs.c.id, runs.c.job_id, runs.c.workflow_run_id)
                )
            ).all()
            workflows.update(r.workflow_run_id for r in cancelled if r.workflow_run_id)
            out += [
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=tenant_id,
                    job_id=r.job_id,
                    run_id=r.id,
                    from_state=source,
                    to_state=RunState.CANCELLED.value,
                    actor=actor,
                    reason=reason,
                )
                for r in cancelled
            ]
        requested = (
            await conn.execute(
                runs.update()
                .where(
                    runs.c.tenant_id == tenant_id,
                    where,
                    runs.c.state == RunState.RUNNING.value,
                    runs.c.cancel_requested.is_(sa.false()),
                )
                # A workflow run keeps why, to end with it once its nodes have.
                .values(
                    cancel_requested=True,
                    reason=sa.case(
                        (
                            sa.and_(runs.c.pool == WORKFLOW_POOL, runs.c.workflow_run_id.is_(None)),
                            reason,
                        ),
                        else_=runs.c.reason,
                    ),
                )
                .returning(runs.c.id, runs.c.job_id, runs.c.pool, runs.c.workflow_run_id)
            )
        ).all()
        if requested:
            await self._notify_holders(conn, tenant_id, [r.id for r in requested])
        out += [
            event_row(
                at=at,
                kind="run.cancel_requested",
                tenant_id=tenant_id,
                job_id=r.job_id,
                run_id=r.id,
                actor=actor,
                reason=reason,
            )
            for r in requested
        ]
        # A workflow run has no worker to stop: its nodes are cancelled in its place,
        # and it ends when they have (``dag.advance``).
        started = [r.id for r in requested if r.pool == WORKFLOW_POOL and r.workflow_run_id is None]
        if started:
            out += await self._cancel_runs(
                conn,
                tenant_id,
                self.driver.id_in(runs.c.workflow_run_id, started),
                at=at,
                actor=actor,
                reason=reason,
            )
            workflows.update(started)
        await dag.advance(self, conn, workflows, at=at, actor=actor)
        return out

    async def _notify_holders(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, run_ids: Sequence[uuid.UUID]
    ) -> None:
        """Notify the workers running ``run_ids`` that they have a cancel to hear of."""
        holders = (
            await conn.execute(
                sa.select(attempts.c.worker_id)
                .distinct()
                .where(
                    attempts.c.tenant_id == tenant_id,
                    self.driver.id_in(attempts.c.run_id, run_ids),
                    attempts.c.state == AttemptState.RUNNING.value,
                    attempts.c.worker_id.is_not(None),
                )
            )
        ).scalars()
        notices = sorted(worker_notice(w) for w in holders)
        if notices:
            await self._notify(conn, CHANNEL_CANCELS, notices)

    @staticmethod
    def _not_found(kind: str, ident: Any) -> NotFoundError:
        return NotFoundError(f"{kind} {ident} not found", **{f"{kind}_id": str(ident)})

    async def _require_tenant(self, conn: AsyncConnection, tenant_id: uuid.UUID) -> None:
        """Not found unless the tenant exists; on PostgreSQL its row stays until this
        transaction ends (a deletion waits), so what is added for it is never orphaned."""
        found = await conn.execute(
            sa.select(tenants.c.id).where(tenants.c.id == tenant_id).with_for_update(key_share=True)
        )
        if found.first() is None:
            raise self._not_found("tenant", tenant_id)


def jobs_select() -> sa.Select[Any]:
    """SELECT of jobs whose ``next_due_at`` is read from the job's own pending runs (the
    scheduled one of a recurring job, the one of a one-off job), so firing never has to
    write the job row."""
    pending = (
        sa.select(sa.func.min(runs.c.due_at))
        .where(
            runs.c.tenant_id == jobs.c.tenant_id,
            runs.c.job_id == jobs.c.id,
            runs.c.state == RunState.SCHEDULED.value,
            runs.c.origin.in_(("once", "schedule")),
        )
        .scalar_subquery()
    )
    columns = [c for c in jobs.c if c.name != "next_due_at"]
    return sa.select(*columns, sa.type_coerce(pending, UtcDateTime).label("next_due_at"))
