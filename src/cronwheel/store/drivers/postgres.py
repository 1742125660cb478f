"""The PostgreSQL driver (asyncpg): ``= ANY(array)`` for id sets, JSONB containment, a
sequence for fencing tokens, LISTEN/NOTIFY for wake-ups across processes, and the hot
statements in one round trip per batch (``postgres_firing.py``, ``postgres_jobs.py``,
``postgres_leasing.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import date, datetime, timedelta
from typing import Any, cast

import asyncpg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from cronwheel import jsontext
from cronwheel.domain.model import FiredRun, LeasedAttempt, ReservationsStarted, Worker
from cronwheel.ids import new_id
from cronwheel.store.driver import (
    CreatedRun,
    DagNodeRow,
    Driver,
    FireCandidate,
    JobsInserted,
    NewJobRows,
    Outcomes,
    PlannedRun,
)
from cronwheel.store.drivers import postgres_firing as firing
from cronwheel.store.drivers import postgres_leasing as leasing
from cronwheel.store.drivers.postgres_jobs import (
    CommittedNotices,
    bare_connection,
    insert_job_parts,
    insert_jobs,
    notify_chunks,
)
from cronwheel.store.notices import (
    CHANNEL_CANCELS,
    CHANNEL_GATES,
    CHANNEL_KEYS_REVOKED,
    CHANNEL_OPERATIONS,
    CHANNEL_RUNS_NEW,
    CHANNEL_RUNS_READY,
)
from cronwheel.store.schema import AUDIT_RETENTION_SETTING, UtcDateTime, runs
from cronwheel.store.values import (
    CompleteItem,
    GateOpened,
    Grant,
    HeartbeatItem,
    LeaseRenewal,
    ReadyQueue,
)

__all__ = ["PostgresDriver"]

log = logging.getLogger("cronwheel.store.postgres")

_TRANSIENT = (
    # The server's connection slots are all taken (by this or any other client): a
    # moment of overload, not a fault of the request.
    asyncpg.TooManyConnectionsError,
    asyncpg.DeadlockDetectedError,
    asyncpg.SerializationError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    ConnectionError,
)

# Any constant: the advisory lock that serialises migrations.
_MIGRATION_LOCK = 0x63776D67  # "cwmg"
_DAG_NODES = """
SELECT id, workflow_run_id, node, state, reserved_token,
       COALESCE(reserved_until > $2, false), reserved_by, gated_at IS NOT NULL
FROM runs WHERE workflow_run_id = ANY($1::uuid[])
"""

# The partitions of log_chunks: one a day, named after it.
_LOG_PARTITION = re.compile(r"^log_chunks_p(\d{8})$")


def _log_partition(day: date) -> str:
    return f"log_chunks_p{day:%Y%m%d}"


async def _raw(conn: AsyncConnection) -> firing.Raw:
    """The asyncpg connection under ``conn``, inside the same transaction."""
    raw = await conn.get_raw_connection()
    return raw.driver_connection


async def _raw_begun(conn: AsyncConnection) -> firing.Raw:
    """:func:`_raw`, with the transaction begun. SQLAlchemy sends BEGIN lazily, before
    its own first statement: a statement sent straight to asyncpg before any would run
    on its own and commit, whatever the rest of the transaction does. (A write that
    read the database clock first has begun already: this costs nothing then.)"""
    raw = await conn.get_raw_connection()
    adapted: Any = raw.dbapi_connection
    if adapted._transaction is None:  # (an autocommit connection begins nothing)
        await adapted._start_transaction()
    return raw.driver_connection


class PostgresDriver(Driver):
    dialect = "postgresql"
    now_in_statement = True

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        pool_overflow: int = 8,
        idle_transaction_timeout: float | None = None,
        warm: bool = False,
    ) -> None:
        """``idle_transaction_timeout``: the server ends a session that sits this long
        inside a transaction. A process frozen mid-transaction (SIGSTOP, a long GC, a
        partition) would otherwise keep its row locks — a scheduler node's fire batch,
        say — and stall whoever takes its shards over; keep it well under the shard
        lease TTL. None: no limit (tools loading data in big batches).

        ``pool_size`` connections are kept open once made, and ``pool_overflow`` more
        may be opened while all are in use (closed when returned): with the LISTEN
        connection, the most this store ever holds is their sum plus one. ``warm``
        makes the pool when the store opens, so that a burst of requests (the API at a
        burst's instant) does not wait for connections being set up."""
        super().__init__(url)
        self._pool_size = pool_size
        self._pool_overflow = pool_overflow
        self._warm = warm
        self._server_settings = (
            {}
            if idle_transaction_timeout is None
            else {
                "idle_in_transaction_session_timeout": str(
                    max(1, round(idle_transaction_timeout * 1000))
                )
            }
        )
        self._listener: asyncpg.Connection | None = None
        self._listen_task: asyncio.Task[None] | None = None
        # The LISTEN connection once it listens: it sends the notices of what committed.
        self._notifying: asyncpg.Connection | None = None
        self._committed_notices = CommittedNotices(lambda: self._notifying)

    # -- connections and transactions ------------------------------------------------

    def make_engine(self) -> AsyncEngine:
        return create_async_engine(
            self.url,
            pool_size=self._pool_size,
            max_overflow=self._pool_overflow,
            pool_recycle=3600,
            # The connection used last is used next: its backend's caches (and the
            # CPU's) are warm. Handed out in turn, a lone client's creates went through
            # every connection of the pool: PostgreSQL spent 0.63 ms of CPU on each,
            # against 0.37 (bench/ingest.py, one client: 514-575 -> 660-680 creates/s).
            pool_use_lifo=True,
            json_deserializer=jsontext.loads,  # results and payloads read back
            connect_args={"server_settings": self._server_settings},
        )

    async def opened(self, engine: AsyncEngine, deliver: Callable[[str, list[str]], None]) -> None:
        if self._warm:
            # Check out ``pool_size`` connections at once and return them to the pool.
            async with contextlib.AsyncExitStack() as stack:
                await asyncio.gather(
                    *(stack.enter_async_context(engine.connect()) for _ in range(self._pool_size))
                )
        if self._listen_task is None:
            self._listen_task = asyncio.create_task(self._listen_forever(deliver), name="cw-listen")

    async def closing(self) -> None:
        await self._committed_notices.close()
        if self._listen_task is not None:
            self._listen_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listen_task
            self._listen_task = None
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close(timeout=2)
            self._listener = None

    async def _listen_forever(self, deliver: Callable[[str, list[str]], None]) -> None:
        """Keep one LISTEN connection; reconnect when it drops. Notifications are only
        wake-ups, so a gap costs latency (the loops also poll), never correctness."""

        def on_notify(_conn: Any, _pid: int, channel: str, payload: str) -> None:
            deliver(channel, payload.split("\n") if payload else [""])

        dsn = self.url.replace("postgresql+asyncpg://", "postgresql://", 1)
        while True:
            try:
                conn = await asyncpg.connect(dsn)
                self._listener = conn
                for channel in (
                    CHANNEL_RUNS_NEW,
                    CHANNEL_RUNS_READY,
                    CHANNEL_KEYS_REVOKED,
                    CHANNEL_OPERATIONS,
                    CHANNEL_CANCELS,
                    CHANNEL_GATES,
                ):
                    await conn.add_listener(channel, on_notify)
                closed = asyncio.Event()
                conn.add_termination_listener(lambda _c, done=closed: done.set())
                self._notifying = conn
                try:
                    await closed.wait()
                finally:
                    self._notifying = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "listen connection failed", extra={"event": "listen_failed", "error": str(exc)}
                )
            await asyncio.sleep(1)

    @contextlib.asynccontextmanager
    async def _autocommit(self, engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
        async with engine.connect() as conn:
            await self.prepare_read(conn)
            yield conn

    def begin_renewal(self, engine: AsyncEngine) -> contextlib.AbstractAsyncContextManager[Any]:
        # The renewal is one statement: its own transaction.
        return self._autocommit(engine)

    async def prepare_read(self, conn: AsyncConnection) -> None:
        # Reads — and single statements that are a transaction of their own — run in
        # autocommit: under READ COMMITTED a BEGIN and a COMMIT around them add two
        # round trips and nothing else (each statement sees its own snapshot either way).
        await conn.execution_options(isolation_level="AUTOCOMMIT")

    async def db_now(self, conn: AsyncConnection) -> datetime:
        value = (await conn.execute(sa.text("SELECT clock_timestamp()"))).scalar_one()
        assert isinstance(value, datetime)
        return value

    async def migration_lock(self, conn: AsyncConnection) -> None:
        # An api and a scheduler starting at once would both create alembic_version.
        await conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})

    async def lock(self, conn: AsyncConnection, name: str) -> None:
        # Two names may share a lock (a 64-bit hash): that only serialises them.
        await conn.execute(
            sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:name, 0))"), {"name": name}
        )

    def transient(self, exc: BaseException) -> bool:
        # The hot statements speak asyncpg directly, so its errors arrive untranslated.
        cause = exc.orig if isinstance(exc, DBAPIError) else exc
        cause = getattr(cause, "__cause__", None) or cause
        return super().transient(exc) or isinstance(cause, _TRANSIENT)

    async def notify(self, conn: AsyncConnection, channel: str, payloads: Sequence[str]) -> None:
        await conn.execute(
            sa.text("SELECT pg_notify(:channel, p) FROM unnest(CAST(:payloads AS text[])) AS p"),
            {"channel": channel, "payloads": notify_chunks(payloads)},
        )

    def notify_committed(
        self,
        channel: str,
        payloads: Sequence[str],
        deliver: Callable[[str, list[str]], None],
        *,
        within: float = 0.0,
    ) -> None:
        # This process hears them through LISTEN, as every other does.
        self._committed_notices.send(channel, payloads, within=within)

    def lock_not_available(self, exc: BaseException) -> bool:
        cause = exc.orig if isinstance(exc, DBAPIError) else exc
        cause = getattr(cause, "__cause__", None) or cause
        return isinstance(cause, asyncpg.LockNotAvailableError)

    def integrity_error(self, exc: BaseException) -> str | None:
        # The hot statements speak asyncpg directly, so its errors arrive untranslated.
        if isinstance(exc, asyncpg.IntegrityConstraintViolationError):
            return str(exc)
        return super().integrity_error(exc)

    # -- what dialects say differently -------------------------------------------------

    async def plan_each(self, conn: AsyncConnection) -> None:
        await conn.execute(sa.text("SET LOCAL plan_cache_mode = force_custom_plan"))

    @contextlib.asynccontextmanager
    async def planned_each(self, conn: AsyncConnection) -> AsyncIterator[None]:
        # A prepared statement run five times may get PostgreSQL's generic plan, made
        # for any tenant: for one with 80,000 waiting runs, counting them went from
        # 13 ms to 145 ms. (In autocommit there is no transaction for SET LOCAL.)
        await conn.execute(sa.text("SET plan_cache_mode = force_custom_plan"))
        try:
            yield
        except BaseException:
            # Cut off mid-statement (a cancelled request) the connection takes no
            # RESET: dropped from the pool, closed, it keeps the setting nowhere.
            with contextlib.suppress(Exception):
                await conn.invalidate()
            raise
        await conn.execute(sa.text("RESET plan_cache_mode"))

    def id_in(self, column: sa.ColumnElement[Any], ids: Sequence[Any]) -> sa.ColumnElement[bool]:
        return column == sa.any_(sa.bindparam(None, list(ids), type_=postgresql.ARRAY(column.type)))

    def late_past(
        self,
        instant: sa.ColumnElement[datetime],
        seconds: sa.ColumnElement[float],
        now: datetime,
    ) -> sa.ColumnElement[bool]:
        at = sa.bindparam(None, now, type_=UtcDateTime)
        return instant + sa.func.make_interval(0, 0, 0, 0, 0, 0, seconds) < at

    def json_has(self, column: sa.ColumnElement[Any], value: str) -> sa.ColumnElement[bool]:
        return sa.type_coerce(column, postgresql.JSONB).contains([value])

    def json_subset(
        self, column: sa.ColumnElement[Any], values: Sequence[str]
    ) -> sa.ColumnElement[bool]:
        subset: sa.ColumnElement[bool] = sa.type_coerce(column, postgresql.JSONB).contained_by(
            list(values)
        )
        return subset

    def json_equals(self, column: sa.ColumnElement[Any], value: Any) -> sa.ColumnElement[bool]:
        stored = list(value) if isinstance(value, tuple) else value
        return column == sa.bindparam(None, stored, type_=runs.c.requires.type)

    def insert_ignore(self, table: sa.Table, rows: list[dict[str, Any]]) -> Any:
        stmt = postgresql.insert(table)
        return (stmt.values(rows) if rows else stmt).on_conflict_do_nothing()

    def upsert(self, table: sa.Table, rows: list[dict[str, Any]], update: Sequence[str]) -> Any:
        stmt = postgresql.insert(table).values(rows)
        return stmt.on_conflict_do_update(
            index_elements=list(table.primary_key.columns),
            set_={name: stmt.excluded[name] for name in update},
        )

    async def fencing_tokens(self, conn: AsyncConnection, count: int) -> list[int]:
        rows = await conn.execute(
            sa.text("SELECT nextval('fencing_tokens') FROM generate_series(1, :n)"), {"n": count}
        )
        return sorted(int(r[0]) for r in rows)

    # -- worker logs: a partition of log_chunks a day ------------------------------------

    async def log_days_prepare(self, conn: AsyncConnection, days: Sequence[date]) -> None:
        # Making a partition locks the parent table: done ahead of the day (and once per
        # process and day), not in the appends' transactions.
        for day in days:
            await conn.execute(
                sa.text(
                    f'CREATE TABLE IF NOT EXISTS "{_log_partition(day)}" PARTITION OF log_chunks'
                    f" FOR VALUES FROM ('{day.isoformat()}')"
                    f" TO ('{(day + timedelta(days=1)).isoformat()}')"
                )
            )

    async def audit_delete(self, conn: AsyncConnection, *, before: datetime, limit: int) -> int:
        # The table's trigger lets a DELETE through only in a transaction that says it
        # is retention's (migration 0017).
        await conn.execute(
            sa.text("SELECT set_config(:name, 'on', true)"), {"name": AUDIT_RETENTION_SETTING}
        )
        return await super().audit_delete(conn, before=before, limit=limit)

    async def log_days_drop(self, conn: AsyncConnection, *, before: date) -> list[date]:
        # Retention drops whole partitions: no row-by-row delete, no vacuum behind it.
        names = (
            await conn.execute(
                sa.text(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                    " WHERE i.inhparent = 'log_chunks'::regclass"
                )
            )
        ).scalars()
        dropped: list[date] = []
        for name in names:
            match = _LOG_PARTITION.match(name)
            if match is None:
                continue
            day = datetime.strptime(match.group(1), "%Y%m%d").date()
            if day < before:
                await conn.execute(sa.text(f'DROP TABLE IF EXISTS "{name}"'))
                dropped.append(day)
        return sorted(dropped)

    # -- hot statements: one round trip per batch ----------------------------------------

    async def events_insert(self, conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            await firing.copy_events(await _raw(conn), rows)

    async def dag_nodes(
        self, conn: AsyncConnection, *, workflow_run_ids: Sequence[uuid.UUID], at: datetime
    ) -> Sequence[DagNodeRow]:
        # Straight from asyncpg, compared in the statement: through SQLAlchemy's result
        # types a 1,002-node fan-out's rows took 4-7 ms to decode, against 1-2.
        if at.tzinfo is None:  # asyncpg would read it as this host's local time
            raise ValueError("dag_nodes: at must be timezone-aware")
        # (A record unpacks as the tuple would.)
        rows = await (await _raw_begun(conn)).fetch(_DAG_NODES, list(workflow_run_ids), at)
        return cast(Sequence[DagNodeRow], rows)

    async def jobs_insert(
        self,
        conn: AsyncConnection,
        *,
        tenant_id: uuid.UUID,
        rows: NewJobRows,
        admitted: bool,
    ) -> JobsInserted:
        # Not begun: as the first statement of its transaction it is one of its own (no
        # BEGIN, no COMMIT); after SQLAlchemy's statements it is inside theirs.
        return await insert_jobs(
            await _raw(conn), tenant_id=tenant_id, rows=rows, admitted=admitted
        )

    async def jobs_insert_alone(
        self,
        engine: AsyncEngine,
        *,
        tenant_id: uuid.UUID,
        rows: NewJobRows | AsyncIterator[NewJobRows],
    ) -> JobsInserted:
        async with bare_connection(engine) as conn:
            if isinstance(rows, NewJobRows):
                return await insert_jobs(conn, tenant_id=tenant_id, rows=rows, admitted=False)
            return await insert_job_parts(conn, tenant_id=tenant_id, parts=rows)

    async def runs_fire(
        self,
        conn: AsyncConnection,
        *,
        run_ids: Sequence[uuid.UUID],
        node_id: str,
        at: datetime | None,
        lead: float,
        epochs: Mapping[int, int] | None,
    ) -> list[FiredRun]:
        # The first statement of a firing transaction that may go on (policies, next
        # occurrences): it must roll back with the rest if they fail, so that a batch
        # that failed fired nothing and is split (``scheduler/isolation.py``). The
        # clock is read in the statement when ``at`` is None: no round trip of its own.
        return await firing.fire(
            await _raw_begun(conn),
            now=at,
            run_ids=run_ids,
            node_id=node_id,
            lead=lead,
            epochs=epochs,
        )

    async def runs_fire_candidates(
        self,
        conn: AsyncConnection,
        *,
        run_ids: Sequence[uuid.UUID],
        node_id: str,
        at: datetime,
        lead: float,
        epochs: Mapping[int, int] | None,
    ) -> list[FireCandidate]:
        return await firing.fire_candidates(
            await _raw(conn),
            at=at,
            run_ids=run_ids,
            node_id=node_id,
            lead=lead,
            epochs=epochs,
        )

    async def runs_insert_planned(
        self,
        conn: AsyncConnection,
        *,
        planned: Sequence[PlannedRun],
        sources: Mapping[uuid.UUID, FireCandidate],
        at: datetime,
        node_id: str,
    ) -> list[CreatedRun]:
        # The templates are read from the jobs inside the statement.
        return await firing.insert_planned(
            await _raw(conn), at=at, planned=planned, node_id=node_id
        )

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
        # A read of its own: no transaction begun for it (see attempts_lease).
        return await leasing.ready_queue(
            await _raw(conn),
            now=now,
            worker=worker,
            max=max,
            webhooks_only=webhooks_only,
            ahead=ahead,
            later=later,
            gated=gated,
        )

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
        # One statement. Inside the transaction the plan's locks began, if they did;
        # otherwise (one tenant per class, no limits: nothing to lock, nothing to write
        # back) on its own, which saves the BEGIN and COMMIT round trips.
        return await leasing.lease(
            await _raw(conn),
            now=now,
            worker=worker,
            grants=grants,
            new_id=new_id,
            webhooks_only=webhooks_only,
            ahead=ahead,
            later=later,
            gated=gated,
        )

    async def lock_keys(self, conn: AsyncConnection, keys: Sequence[int]) -> None:
        # One statement, the locks taken left to right: every lease takes its keys in
        # the same (sorted) order, so two never wait for each other.
        if keys:
            calls = ", ".join(f"pg_advisory_xact_lock(${i})" for i in range(1, len(keys) + 1))
            await (await _raw_begun(conn)).execute(f"SELECT {calls}", *keys)

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
        return await leasing.start_many(
            await _raw(conn),
            now=now,
            worker_id=worker_id,
            tokens=tokens,
            tenant_id=tenant_id,
            ahead=ahead,
            opened=opened,
        )

    async def attempts_heartbeat(
        self,
        conn: AsyncConnection,
        *,
        items: Sequence[HeartbeatItem],
        tenant_id: uuid.UUID | None,
        now: datetime | None,
    ) -> Outcomes:
        return await leasing.heartbeat_many(
            await _raw(conn), now=now, items=items, tenant_id=tenant_id
        )

    async def attempts_complete(
        self,
        conn: AsyncConnection,
        *,
        items: Sequence[CompleteItem],
        tenant_id: uuid.UUID | None,
        now: datetime | None,
    ) -> Outcomes:
        # Begun: a workflow's node run ended here advances its workflow run in the same
        # transaction (``store/sql/dag.py``); alone, this statement would commit first.
        return await leasing.complete_many(
            await _raw_begun(conn),
            now=now,
            ids=[i.attempt_id for i in items],
            tokens=[i.fencing_token for i in items],
            results=[i.result for i in items],
            tenant_id=tenant_id,
        )

    async def shard_leases_renew(
        self,
        conn: AsyncConnection,
        *,
        node_id: str,
        ttl: float,
        shards: int,
        now: datetime | None,
    ) -> LeaseRenewal:
        return await firing.renew(
            await _raw(conn), node_id=node_id, ttl=ttl, shards=shards, now=now
        )
