"""The shared machinery of the SQL stores: engine, transactions, notifications, the
dialect hooks each backend fills in, and row-to-record conversion."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from abc import abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Row
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from cronwheel.domain.errors import NotFoundError, StoreUnavailableError, ValidationError
from cronwheel.domain.model import Attempt, Event, Job, Run, Tenant, Worker
from cronwheel.domain.states import AttemptState, JobState, RunState
from cronwheel.store.base import Store, Subscription
from cronwheel.store.schema import UtcDateTime, events, jobs, runs, shard_leases

__all__ = [
    "MIGRATIONS_DIR",
    "LocalSubscription",
    "SqlCore",
    "attempt_from",
    "event_from",
    "event_row",
    "int_cursor",
    "job_from",
    "jobs_select",
    "lease_fence",
    "new_run_row",
    "run_from",
    "tenant_from",
    "uuid_cursor",
    "worker_from",
]

log = logging.getLogger("cronwheel.store")

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


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


class SqlCore(Store):
    """Engine, transactions and helpers. Subclasses implement the dialect hooks."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine: AsyncEngine | None = None
        self._subs: dict[str, list[LocalSubscription]] = {}

    # -- lifecycle -----------------------------------------------------------------

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            raise StoreUnavailableError("the store is not open")
        return self._engine

    @abstractmethod
    def _make_engine(self) -> AsyncEngine: ...

    async def open(self) -> None:
        if self._engine is None:
            self._engine = self._make_engine()

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    async def migrate(self) -> None:
        from alembic import command
        from alembic.config import Config

        opened_here = self._engine is None
        await self.open()
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        try:
            async with self._begin_write() as conn:
                await self._migration_lock(conn)

                def upgrade(sync_conn: sa.Connection) -> None:
                    config.attributes["connection"] = sync_conn
                    command.upgrade(config, "head")

                await conn.run_sync(upgrade)
        finally:
            if opened_here:
                await self.close()

    async def _migration_lock(self, conn: AsyncConnection) -> None:
        """Serialise migrations of processes starting together (SQLite: the write
        transaction already does)."""

    async def ping(self) -> None:
        try:
            async with self.engine.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
        except (OSError, DBAPIError) as exc:
            raise StoreUnavailableError(f"the database does not answer: {exc}") from exc

    async def db_now(self) -> datetime:
        async with self.engine.connect() as conn:
            return await self._db_now(conn)

    @abstractmethod
    async def _db_now(self, conn: AsyncConnection) -> datetime:
        """The database clock, read on ``conn``."""

    async def _now(self, conn: AsyncConnection, now: datetime | None) -> datetime:
        if now is not None:
            if now.tzinfo is None:
                raise ValueError("now must be an aware datetime")
            return now.astimezone(UTC)
        return await self._db_now(conn)

    async def _statement_now(self, conn: AsyncConnection, now: datetime | None) -> Any:
        """``now``, or the database clock: read inside the statement on PostgreSQL (no
        round trip of its own), beforehand on SQLite."""
        if now is None and self.dialect == "postgresql":
            return sa.func.now()
        return await self._now(conn, now)

    @contextlib.asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction. Local notifications queued in it go out after commit."""
        pending: list[tuple[str, Sequence[str]]] = []
        try:
            async with self._begin_write() as conn:
                conn.info["cw_pending"] = pending
                try:
                    yield conn
                finally:
                    conn.info.pop("cw_pending", None)
        except Exception as exc:
            if self._transient(exc):
                raise StoreUnavailableError(f"the database failed, try again: {exc}") from exc
            raise
        for channel, payloads in pending:
            self._deliver(channel, payloads)

    def _begin_write(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        return self.engine.begin()

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        try:
            async with self.engine.connect() as conn:
                yield conn
        except Exception as exc:
            if self._transient(exc):
                raise StoreUnavailableError(f"the database failed, try again: {exc}") from exc
            raise

    def _transient(self, exc: BaseException) -> bool:
        """A failure worth retrying (lost connection, lock conflict): the caller gets
        :class:`StoreUnavailableError` (503), never a bare driver error."""
        return isinstance(exc, OperationalError | OSError)

    # -- notifications -------------------------------------------------------------

    def subscribe(self, channel: str) -> Subscription:
        return LocalSubscription(self._subs, channel)

    def _deliver(self, channel: str, payloads: Sequence[str]) -> None:
        for sub in list(self._subs.get(channel, [])):
            sub.push(payloads)

    @abstractmethod
    async def _notify(self, conn: AsyncConnection, channel: str, payloads: Sequence[str]) -> None:
        """Queue notifications; they are delivered when ``conn``'s transaction commits."""

    # -- dialect hooks -------------------------------------------------------------

    @abstractmethod
    def _id_in(self, column: sa.ColumnElement[Any], ids: Sequence[Any]) -> sa.ColumnElement[bool]:
        """``column IN ids`` as the dialect does it best (``= ANY(array)`` on PostgreSQL)."""

    @abstractmethod
    def _json_has(self, column: sa.ColumnElement[Any], value: str) -> sa.ColumnElement[bool]:
        """The JSON array ``column`` contains the string ``value``."""

    @abstractmethod
    def _json_subset(
        self, column: sa.ColumnElement[Any], values: Sequence[str]
    ) -> sa.ColumnElement[bool]:
        """Every element of the JSON array ``column`` is in ``values``."""

    def _shard_held(
        self,
        shard: sa.ColumnElement[Any],
        *,
        node_id: str,
        at: datetime,
        epochs: Mapping[int, int] | None = None,
    ) -> sa.ColumnElement[bool]:
        """``shard`` is leased by ``node_id``, the lease is unexpired at ``at`` and, with
        ``epochs``, it is the lease of that epoch."""
        held = sa.select(shard_leases.c.shard).where(*lease_fence(node_id, at, epochs))
        return shard.in_(held.scalar_subquery())

    def _starts_with(self, column: sa.ColumnElement[str], prefix: str) -> sa.ColumnElement[bool]:
        """Case-sensitive prefix match."""
        return column.startswith(prefix, autoescape=True)

    async def _insert_ignoring(
        self,
        conn: AsyncConnection,
        table: sa.Table,
        rows: list[dict[str, Any]],
        returning: Sequence[sa.ColumnElement[Any]] = (),
    ) -> list[Any]:
        """INSERT ``rows``, skipping those whose key exists; returns ``returning`` of the
        rows inserted. Executed as one executemany (SQLAlchemy's "insertmanyvalues"):
        the statement is compiled once, whatever the number of rows."""
        if not rows:
            return []
        stmt = self._insert_ignore(table, [])
        if returning:
            return list((await conn.execute(stmt.returning(*returning), rows)).all())
        await conn.execute(stmt, rows)
        return []

    @abstractmethod
    def _insert_ignore(self, table: sa.Table, rows: list[dict[str, Any]]) -> Any:
        """INSERT of ``rows`` that skips rows whose key exists (no rows: a statement to
        execute with many parameter sets)."""

    @abstractmethod
    async def _fencing_tokens(self, conn: AsyncConnection, count: int) -> list[int]:
        """``count`` new fencing tokens, each larger than any handed out before."""

    # -- helpers -------------------------------------------------------------------

    async def _insert_events(self, conn: AsyncConnection, rows: list[dict[str, Any]]) -> None:
        if rows:
            await conn.execute(events.insert(), rows)

    async def _update_each(
        self, conn: AsyncConnection, table: sa.Table, rows: list[dict[str, Any]]
    ) -> None:
        """Per-row values in one executemany: each row is ``{"id": …, column: value}``."""
        if not rows:
            return
        columns = [k for k in rows[0] if k != "id"]
        stmt = (
            table.update()
            .where(table.c.id == sa.bindparam("b_id"))
            .values({c: sa.bindparam(f"b_{c}") for c in columns})
        )
        await conn.execute(stmt, [{f"b_{k}": v for k, v in row.items()} for row in rows])

    async def _lock_live_runs(
        self, conn: AsyncConnection, tenant_id: uuid.UUID, where: sa.ColumnElement[bool]
    ) -> None:
        """Lock the selected runs that are not finished, in id order, before touching
        their job: every path that changes runs and their job (results, expiry, cancel,
        pause) then takes run locks before the job's, so they cannot deadlock, and a
        retry committed meanwhile cannot slip past a cancel."""
        await conn.execute(
            sa.select(runs.c.id)
            .where(
                runs.c.tenant_id == tenant_id,
                where,
                runs.c.state.in_(
                    [RunState.SCHEDULED.value, RunState.DISPATCHED.value, RunState.RUNNING.value]
                ),
            )
            .order_by(runs.c.id)
            .with_for_update()
        )

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
        """Cancel the selected runs not yet started, and ask running ones to stop."""
        out: list[dict[str, Any]] = []
        for source in (RunState.SCHEDULED, RunState.DISPATCHED):
            cancelled = (
                await conn.execute(
                    runs.update()
                    .where(runs.c.tenant_id == tenant_id, where, runs.c.state == source.value)
                    .values(state=RunState.CANCELLED.value, finished_at=at, reason=reason)
                    .returning(runs.c.id, runs.c.job_id)
                )
            ).all()
            out += [
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=tenant_id,
                    job_id=r.job_id,
                    run_id=r.id,
                    from_state=source.value,
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
                .values(cancel_requested=True)
                .returning(runs.c.id, runs.c.job_id)
            )
        ).all()
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
        return out

    @staticmethod
    def _not_found(kind: str, ident: Any) -> NotFoundError:
        return NotFoundError(f"{kind} {ident} not found", **{f"{kind}_id": str(ident)})


def event_row(
    *,
    at: datetime,
    kind: str,
    tenant_id: uuid.UUID | None,
    job_id: uuid.UUID | None = None,
    run_id: uuid.UUID | None = None,
    attempt_id: uuid.UUID | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    actor: str | None = None,
    reason: str | None = None,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "tenant_id": tenant_id,
        "at": at,
        "kind": kind,
        "job_id": job_id,
        "run_id": run_id,
        "attempt_id": attempt_id,
        "from_state": from_state,
        "to_state": to_state,
        "actor": actor,
        "reason": reason,
        "data": data,
    }


# -- rows ----------------------------------------------------------------------


def lease_fence(
    node_id: str, at: datetime, epochs: Mapping[int, int] | None
) -> list[sa.ColumnElement[bool]]:
    """The conditions on ``shard_leases`` rows that ``node_id`` may fire for."""
    fence = [shard_leases.c.owner == node_id, shard_leases.c.expires_at > at]
    if epochs is not None:
        fence.append(
            sa.tuple_(shard_leases.c.shard, shard_leases.c.epoch).in_(sorted(epochs.items()))
        )
    return fence


def new_run_row(
    *,
    run_id: uuid.UUID,
    tenant_id: uuid.UUID,
    job_id: uuid.UUID,
    name: str,
    template: dict[str, Any],
    due_at: datetime,
    due_local: str | None,
    shard: int,
    at: datetime,
    origin: str = "once",
    fire_at: datetime | None = None,
    state: RunState = RunState.SCHEDULED,
) -> dict[str, Any]:
    """A new run's row, its template copied from the job's (so leasing needs no join)."""
    retry = template["retry"]
    return {
        "id": run_id,
        "tenant_id": tenant_id,
        "job_id": job_id,
        "job_name": name,
        "shard": shard,
        "state": state.value,
        "origin": origin,
        "due_at": due_at,
        "due_local": due_local,
        "fire_at": fire_at or due_at,
        "priority": template["priority"],
        "pool": template["pool"],
        "requires": template["requires"],
        "tags": template["tags"],
        "task": template.get("task"),
        "webhook": template.get("webhook"),
        "payload": template["payload"],
        "attempt": 0,
        "max_attempts": retry["max_attempts"],
        "retry": retry,
        "timeout": template["timeout"],
        "heartbeat_timeout": template["heartbeat_timeout"],
        "progress_timeout": template.get("progress_timeout"),  # absent from older jobs
        "created_at": at,
    }


# -- cursors -------------------------------------------------------------------


def uuid_cursor(cursor: str | None) -> uuid.UUID | None:
    if cursor is None:
        return None
    try:
        return uuid.UUID(cursor)
    except ValueError:
        raise ValidationError("malformed cursor", field="cursor") from None


def int_cursor(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    if not cursor.isdigit():
        raise ValidationError("malformed cursor", field="cursor")
    return int(cursor)


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


# -- rows to records ---------------------------------------------------------------


def tenant_from(row: Row[Any]) -> Tenant:
    return Tenant(id=row.id, name=row.name, limits=dict(row.limits), created_at=row.created_at)


def job_from(row: Row[Any]) -> Job:
    return Job(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        state=JobState(row.state),
        kind=row.kind,
        schedule=row.schedule,
        template=row.template,
        version=row.version,
        next_due_at=row.next_due_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        idempotency_key=row.idempotency_key,
    )


def run_from(row: Row[Any]) -> Run:
    m = row._mapping
    return Run(
        id=m["id"],
        tenant_id=m["tenant_id"],
        job_id=m["job_id"],
        job_name=m["job_name"],
        shard=m["shard"],
        state=RunState(m["state"]),
        due_at=m["due_at"],
        due_local=m["due_local"],
        fire_at=m["fire_at"],
        priority=m["priority"],
        pool=m["pool"],
        requires=list(m["requires"]),
        tags=list(m["tags"]),
        task=m["task"],
        webhook=m["webhook"],
        payload=m["payload"],
        attempt=m["attempt"],
        max_attempts=m["max_attempts"],
        retry=m["retry"],
        timeout=m["timeout"],
        heartbeat_timeout=m["heartbeat_timeout"],
        reason=m["reason"],
        created_at=m["created_at"],
        dispatched_at=m["dispatched_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        result=m["result"],
        last_error=m["last_error"],
        origin=m["origin"],
        wait_reason=m["wait_reason"],
        progress_timeout=m["progress_timeout"],
        quarantined_at=m.get("quarantined_at"),
    )


def attempt_from(row: Row[Any]) -> Attempt:
    return Attempt(
        id=row.id,
        tenant_id=row.tenant_id,
        run_id=row.run_id,
        number=row.number,
        worker_id=row.worker_id,
        fencing_token=row.fencing_token,
        state=AttemptState(row.state),
        lease_expires_at=row.lease_expires_at,
        deadline=row.deadline,
        started_at=row.started_at,
        heartbeat_at=row.heartbeat_at,
        finished_at=row.finished_at,
        error=row.error,
        result=row.result,
        progress_deadline=row.progress_deadline,
        progress_at=row.progress_at,
        progress_details=row.progress_details,
    )


def event_from(row: Row[Any]) -> Event:
    return Event(
        id=row.id,
        tenant_id=row.tenant_id,
        at=row.at,
        kind=row.kind,
        job_id=row.job_id,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        from_state=row.from_state,
        to_state=row.to_state,
        actor=row.actor,
        reason=row.reason,
        data=dict(row.data or {}),
    )


def worker_from(row: Row[Any]) -> Worker:
    return Worker(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        pool=row.pool,
        capabilities=list(row.capabilities),
        tags=list(row.tags),
        capacity=row.capacity,
        registered_at=row.registered_at,
        last_seen_at=row.last_seen_at,
        deregistered_at=row.deregistered_at,
        webhooks_only=bool(row.webhooks_only),
    )
