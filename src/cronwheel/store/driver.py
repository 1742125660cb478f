"""The statement level under the store: one protocol, one driver per database.

The store's logic — resolving outcomes, retries, overlap, catch-up, notices — is
written once, above this line (``store/sql/``). Under it, a :class:`Driver` knows one
database: how to connect and begin a write, read its clock, notify other processes,
and say a few things SQL dialects say differently (an id set, JSON containment). It
also runs the hot statements — fire a batch, lease a batch, start, heartbeat and
complete a batch, renew shard leases — each in the fewest round trips its database
allows: one statement per batch on PostgreSQL (data-modifying CTEs, COPY), a few on
SQLite. Every driver implements every method; the driver conformance suite
(``tests/store/test_driver.py``) runs the same tests against each, and the store suite
runs unchanged on both.

Conventions: every method takes the connection of the caller's transaction first
(``AsyncConnection``; a driver may reach its native connection under it), then keyword
arguments. ``now: datetime | None`` is the caller's instant, ``None`` meaning the
database clock; ``at: datetime`` is an instant already read. Rows come back typed.
"""

from __future__ import annotations

import contextlib
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, ClassVar, Literal

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from cronwheel.domain.model import (
    AttemptOutcome,
    FiredRun,
    LeasedAttempt,
    ReservationsStarted,
    Worker,
)
from cronwheel.store.rows import AUDIT_COLUMNS, EVENT_COLUMNS, NEW_JOB_COLUMNS, NEW_RUN_COLUMNS
from cronwheel.store.schema import audit, log_chunks, runs, shard_leases
from cronwheel.store.values import (
    CompleteItem,
    GateOpened,
    Grant,
    HeartbeatItem,
    LeaseRenewal,
    ReadyQueue,
)

__all__ = [
    "CreatedRun",
    "DagNodeRow",
    "Driver",
    "FireCandidate",
    "JobsInserted",
    "NewJobRows",
    "Outcomes",
    "PlannedRun",
    "WorkerGone",
    "given_instant",
    "lease_fence",
]

# The outcome of each attempt a batch applied to, by (attempt id, fencing token).
Outcomes = dict[tuple[uuid.UUID, int], AttemptOutcome]

DagNodeRow = tuple[uuid.UUID, uuid.UUID, str, str, int | None, bool, uuid.UUID | None, bool]
"""A workflow run's node as advancing reads it: its run id, its workflow run's id, its
name, its state, the token of a reservation on it, whether that reservation is still
held, by which worker, and whether the node was armed for gated reservations."""


class WorkerGone(Exception):
    """The worker of a lease or start is not live (deregistered, or no such row): the
    store turns it into the domain's error, with the row read to tell which."""

    def __init__(self, worker_id: uuid.UUID) -> None:
        super().__init__(str(worker_id))
        self.worker_id = worker_id


# What :meth:`Driver.jobs_insert` did.
JobsInserted = Literal["inserted", "limited", "no_tenant"]


@dataclass(frozen=True, slots=True)
class NewJobRows:
    """The rows of new jobs (``jobs``), their first and skipped runs (``runs``), their
    events and the audit records of their creation (``audit``), each a record of values
    in the order of its table's columns here (:data:`COLUMNS`): no row is a dictionary,
    so a driver that copies them in (COPY) sends them as they are."""

    jobs: Sequence[Sequence[Any]]
    runs: Sequence[Sequence[Any]]
    events: Sequence[Sequence[Any]]
    audit: Sequence[Sequence[Any]] = ()

    COLUMNS: ClassVar[dict[str, tuple[str, ...]]] = {
        "jobs": NEW_JOB_COLUMNS,
        "runs": NEW_RUN_COLUMNS,
        "events": EVENT_COLUMNS,
        "audit": AUDIT_COLUMNS,
    }
    TABLES: ClassVar[tuple[str, ...]] = ("jobs", "runs", "events", "audit")

    def tables(self) -> list[tuple[str, tuple[str, ...], Sequence[Sequence[Any]]]]:
        """Each table with rows — its name, columns and records — in the order they go
        in (a run refers to its job)."""
        return [
            (name, self.COLUMNS[name], records)
            for name in self.TABLES
            if (records := getattr(self, name))
        ]

    def dicts(self, table: str) -> list[dict[str, Any]]:
        """The rows of ``table`` by column name."""
        columns = self.COLUMNS[table]
        return [dict(zip(columns, r, strict=True)) for r in getattr(self, table)]

    @classmethod
    def joined(cls, parts: Sequence[NewJobRows]) -> NewJobRows:
        """``parts`` as one: their rows in order."""
        return cls(
            jobs=[row for p in parts for row in p.jobs],
            runs=[row for p in parts for row in p.runs],
            events=[row for p in parts for row in p.events],
            audit=[row for p in parts for row in p.audit],
        )


@dataclass(frozen=True, slots=True)
class FireCandidate:
    """A run whose firing applies its job's policies (the first try of a recurring
    job's scheduled run), locked, with its job's state and schedule."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    job_id: uuid.UUID
    job_name: str
    shard: int
    due_at: datetime
    fire_at: datetime
    pool: str
    job_state: str
    schedule: dict[str, Any]
    spread: float = 0.0  # the job's (its template's), seconds
    priority: int = 2


@dataclass(frozen=True, slots=True)
class PlannedRun:
    """A run to create beside a fired one, its template taken from the job."""

    source: uuid.UUID  # the fired run it comes from (tenant, job, shard)
    id: uuid.UUID
    due_at: datetime
    due_local: str | None
    state: str
    origin: str
    reason: str | None


@dataclass(frozen=True, slots=True)
class CreatedRun:
    """A planned run that did not exist yet and was created."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    job_id: uuid.UUID
    state: str
    reason: str | None
    shard: int
    fire_at: datetime
    pool: str


def given_instant(now: datetime) -> datetime:
    """A caller's instant, in UTC."""
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    return now.astimezone(UTC)


def lease_fence(
    node_id: str, at: datetime | sa.ColumnElement[Any], epochs: Mapping[int, int] | None
) -> list[sa.ColumnElement[bool]]:
    """The conditions on ``shard_leases`` rows that ``node_id`` may fire for: its own,
    unexpired at ``at`` and, with ``epochs``, of exactly those epochs."""
    fence = [shard_leases.c.owner == node_id, shard_leases.c.expires_at > at]
    if epochs is not None:
        fence.append(
            sa.tuple_(shard_leases.c.shard, shard_leases.c.epoch).in_(sorted(epochs.items()))
        )
    return fence


class Driver(ABC):
    """One database under the store. See the module's docstring."""

    dialect: ClassVar[str]  # "postgresql" | "sqlite"

    def __init__(self, url: str) -> None:
        self.url = url

    # -- connections and transactions ------------------------------------------------

    @abstractmethod
    def make_engine(self) -> AsyncEngine:
        """The engine (connection pool) the store opens."""

    async def opened(self, engine: AsyncEngine, deliver: Callable[[str, list[str]], None]) -> None:
        """Called once the store's engine exists: start what the driver keeps running
        (PostgreSQL: LISTEN, delivering each notification's payloads to ``deliver``)."""
        return None

    async def closing(self) -> None:
        """Stop what :meth:`opened` started."""
        return None

    def begin_write(self, engine: AsyncEngine) -> contextlib.AbstractAsyncContextManager[Any]:
        """A write transaction on a connection of ``engine``: yields the connection."""
        return engine.begin()

    def begin_migration(self, engine: AsyncEngine) -> contextlib.AbstractAsyncContextManager[Any]:
        """The transaction migrations run in: a write transaction."""
        return self.begin_write(engine)

    def begin_renewal(self, engine: AsyncEngine) -> contextlib.AbstractAsyncContextManager[Any]:
        """The transaction of :meth:`shard_leases_renew`: a write transaction, unless the
        driver renews in one statement that is a transaction of its own."""
        return self.begin_write(engine)

    async def prepare_read(self, conn: AsyncConnection) -> None:
        """Set up a connection for reads (and single statements that are a transaction
        of their own)."""
        return None

    @contextlib.asynccontextmanager
    async def planned_each(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """:meth:`plan_each` for a read outside a transaction (``prepare_read``): for
        the reads a dashboard repeats whose best plan depends on the tenant they name."""
        yield

    async def plan_each(self, conn: AsyncConnection) -> None:
        """Have the statements of ``conn``'s transaction planned for the values they are
        given, never by a plan cached for any values (for statements whose best plan
        depends on how many rows they name)."""
        return None

    @abstractmethod
    async def db_now(self, conn: AsyncConnection) -> datetime:
        """The database clock, the one time authority."""

    async def instant(self, conn: AsyncConnection, now: datetime | None) -> datetime:
        """``now`` in UTC, or the database clock when it is None."""
        if now is not None:
            return given_instant(now)
        return await self.db_now(conn)

    # Whether a statement can read the database clock itself (no round trip of its own).
    now_in_statement: ClassVar[bool] = False

    async def migration_lock(self, conn: AsyncConnection) -> None:
        """Serialise migrations of processes starting together, inside the migrating
        transaction (SQLite: the write transaction already does)."""
        return None

    async def lock(self, conn: AsyncConnection, name: str) -> None:
        """Hold the lock called ``name`` until the write transaction of ``conn`` ends
        (PostgreSQL: an advisory lock; SQLite: the write transaction already excludes
        every other)."""
        return None

    def transient(self, exc: BaseException) -> bool:
        """A failure worth retrying (lost connection, lock conflict, no connection free
        in the pool within its timeout)."""
        return isinstance(exc, OperationalError | OSError | PoolTimeoutError)

    def lock_not_available(self, exc: BaseException) -> bool:
        """``exc`` says a row asked for without waiting (NOWAIT) is held by another
        transaction (SQLite never says so: one writer at a time)."""
        return False

    def integrity_error(self, exc: BaseException) -> str | None:
        """What a broken constraint (a unique key) that ``exc`` reports says, or None
        when ``exc`` is something else."""
        return str(exc.orig) if isinstance(exc, IntegrityError) else None

    @abstractmethod
    async def notify(self, conn: AsyncConnection, channel: str, payloads: Sequence[str]) -> None:
        """Queue notifications; they are delivered when ``conn``'s transaction commits."""

    def notify_committed(
        self,
        channel: str,
        payloads: Sequence[str],
        deliver: Callable[[str, list[str]], None],
        *,
        within: float = 0.0,
    ) -> None:
        """Send notifications about what has committed already, outside any transaction:
        soon, not before this returns, and never waited for (they are wake-ups only).
        They may wait up to ``within`` seconds, to go with others. The default delivers
        them at once through ``deliver`` (this process's subscribers: the only ones an
        embedded database has)."""
        deliver(channel, list(payloads))

    # -- what dialects say differently -------------------------------------------------

    @abstractmethod
    def id_in(self, column: sa.ColumnElement[Any], ids: Sequence[Any]) -> sa.ColumnElement[bool]:
        """``column IN ids`` as the dialect does it best (``= ANY(array)`` on PostgreSQL)."""

    @abstractmethod
    def json_has(self, column: sa.ColumnElement[Any], value: str) -> sa.ColumnElement[bool]:
        """The JSON array ``column`` contains the string ``value``."""

    @abstractmethod
    def json_subset(
        self, column: sa.ColumnElement[Any], values: Sequence[str]
    ) -> sa.ColumnElement[bool]:
        """Every element of the JSON array ``column`` is in ``values``."""

    @abstractmethod
    def json_equals(self, column: sa.ColumnElement[Any], value: Any) -> sa.ColumnElement[bool]:
        """The JSON ``column`` equals the JSON value ``value``."""

    @abstractmethod
    def late_past(
        self,
        instant: sa.ColumnElement[datetime],
        seconds: sa.ColumnElement[float],
        now: datetime,
    ) -> sa.ColumnElement[bool]:
        """``instant`` plus ``seconds`` (a per-row number) is before ``now``."""

    def starts_with(self, column: sa.ColumnElement[str], prefix: str) -> sa.ColumnElement[bool]:
        """Case-sensitive prefix match."""
        return column.startswith(prefix, autoescape=True)

    @abstractmethod
    def insert_ignore(self, table: sa.Table, rows: list[dict[str, Any]]) -> Any:
        """INSERT of ``rows`` that skips rows whose key exists (no rows: a statement to
        execute with many parameter sets)."""

    @abstractmethod
    def upsert(self, table: sa.Table, rows: list[dict[str, Any]], update: Sequence[str]) -> Any:
        """INSERT of ``rows`` (at least one) that sets the columns ``update`` of a row
        whose primary key exists instead."""

    @abstractmethod
    async def fencing_tokens(self, conn: AsyncConnection, count: int) -> list[int]:
        """``count`` new fencing tokens, each larger than any handed out before."""

    # -- worker logs (log_chunks) ------------------------------------------------------

    async def log_days_prepare(self, conn: AsyncConnection, days: Sequence[date]) -> None:
        """Make room for the log chunks of ``days`` (PostgreSQL: a partition each, made
        unless it exists; one table needs nothing)."""
        return None

    async def log_days_drop(self, conn: AsyncConnection, *, before: date) -> list[date]:
        """Remove every log chunk of a day before ``before``; the days removed."""
        days = (
            await conn.execute(
                sa.select(log_chunks.c.day).where(log_chunks.c.day < before).distinct()
            )
        ).scalars()
        dropped = sorted(days)
        if dropped:
            await conn.execute(log_chunks.delete().where(log_chunks.c.day < before))
        return dropped

    # -- the audit trail ---------------------------------------------------------------

    async def audit_delete(self, conn: AsyncConnection, *, before: datetime, limit: int) -> int:
        """Delete those of the ``limit`` oldest audit records (by id, the order they
        were made in) made before ``before``: retention, the only way a record leaves;
        how many went. Fewer than ``limit`` means the oldest left are young enough."""
        oldest = sa.select(audit.c.id, audit.c.at).order_by(audit.c.id).limit(limit).subquery()
        expired = sa.select(oldest.c.id).where(oldest.c.at < before)
        result = await conn.execute(audit.delete().where(audit.c.id.in_(expired)))
        return int(result.rowcount)

    # -- events ----------------------------------------------------------------------

    @abstractmethod
    async def events_insert(self, conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
        """Append event rows (``store.sql.core.event_row``); no ids come back."""

    # -- creating jobs -----------------------------------------------------------------

    @abstractmethod
    async def jobs_insert(
        self,
        conn: AsyncConnection,
        *,
        tenant_id: uuid.UUID,
        rows: NewJobRows,
        admitted: bool,
    ) -> JobsInserted:
        """Insert new jobs with their runs and events, keeping the tenant's row until the
        transaction ends (a deletion waits). Unless ``admitted`` (the caller checked
        ``max_pending_runs`` in this transaction), a tenant that has that limit gets
        nothing inserted (``"limited"``): the caller checks the limit and calls again.
        ``"no_tenant"``: no such tenant, nothing inserted. May be the first statement of
        its transaction: then it is a transaction of its own (one round trip on
        PostgreSQL). The runs' notices are the caller's to send once committed
        (:meth:`notify_committed`)."""

    async def jobs_insert_alone(
        self,
        engine: AsyncEngine,
        *,
        tenant_id: uuid.UUID,
        rows: NewJobRows | AsyncIterator[NewJobRows],
    ) -> JobsInserted:
        """:meth:`jobs_insert`, not admitted, as a transaction of its own on a connection
        of ``engine`` (PostgreSQL: one statement on a bare pooled connection, none of
        the transaction machinery around it).

        ``rows`` may come in parts, made while they are read (each part's runs and
        events refer to its own jobs): all of them are still one transaction, all
        inserted or none. A driver may insert a part while the next is being made
        (PostgreSQL does). Unless ``"inserted"``, parts may be left unread."""
        if not isinstance(rows, NewJobRows):
            # Made before the transaction begins: not while holding the write lock.
            rows = NewJobRows.joined([part async for part in rows])
        async with self.begin_write(engine) as conn:
            return await self.jobs_insert(conn, tenant_id=tenant_id, rows=rows, admitted=False)

    # -- firing ------------------------------------------------------------------------

    @abstractmethod
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
        """Dispatch the runs of ``run_ids`` that need no policy — SCHEDULED, due within
        ``lead`` of ``at`` (None: the database clock, read in the statement where
        ``now_in_statement``), not the first try of a recurring job's scheduled run, on a
        shard ``node_id`` holds (of ``epochs``, when given) — with their events and
        ready notices. The first statement of a transaction that may go on."""

    @abstractmethod
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
        """The runs of ``run_ids`` whose firing applies their job's policies — first
        tries of recurring jobs' scheduled runs, due, on a shard ``node_id`` holds —
        locked (skipping runs locked elsewhere), with their job's state, schedule and
        spread."""

    @abstractmethod
    async def runs_insert_planned(
        self,
        conn: AsyncConnection,
        *,
        planned: Sequence[PlannedRun],
        sources: Mapping[uuid.UUID, FireCandidate],
        at: datetime,
        node_id: str,
    ) -> list[CreatedRun]:
        """Create the planned runs that do not exist yet (their template read from the
        job of their source run), with their events; return those created. Each fires
        at the spread instant of its due instant (``timing.spread``; the due instant
        itself when the job has no spread)."""

    # -- workflows ---------------------------------------------------------------------

    async def dag_nodes(
        self, conn: AsyncConnection, *, workflow_run_ids: Sequence[uuid.UUID], at: datetime
    ) -> Sequence[DagNodeRow]:
        """Every node run of the workflow runs ``workflow_run_ids``, as advancing them
        reads it (:data:`DagNodeRow`), whether a reservation is held being judged at
        ``at`` (timezone-aware), within the write transaction that locked them. What
        each completion of a 1,000-node fan-in reads again: a driver may answer it
        without the rows' full decoding."""
        rows = await conn.execute(
            sa.select(
                runs.c.id,
                runs.c.workflow_run_id,
                runs.c.node,
                runs.c.state,
                runs.c.reserved_token,
                runs.c.reserved_until,
                runs.c.reserved_by,
                runs.c.gated_at,
            ).where(self.id_in(runs.c.workflow_run_id, list(workflow_run_ids)))
        )
        return [
            (i, owner, name, state, token, until is not None and until > at, by, armed is not None)
            for i, owner, name, state, token, until, by, armed in rows
        ]

    # -- leasing and results -------------------------------------------------------

    @abstractmethod
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
        """What the worker could take of its pool's ready queue: for each tenant
        waiting, how many runs of each priority class (counting at most ``max`` per
        tenant), with the tenant's limits and the pool's own P0 share, and the clock.
        ``later``: only runs not due yet (to reserve beyond the worker's slots).
        ``gated``: of the gated queue instead — workflow nodes whose upstream nodes are
        all under way (``runs.gated_at``); a driver that reserves none answers none."""

    @abstractmethod
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
        """Lease what admission granted: of each (tenant, class) up to its count of the
        oldest ready runs the worker can take; each due one becomes RUNNING with a new
        attempt and token, each due within ``ahead`` is reserved for the worker
        (``later``: only runs not due yet are taken, all of them reserved; ``gated``:
        nodes of the gated queue, each reserved ahead of its gate, left PENDING).
        Raises :class:`WorkerGone` when the worker is not live (also with no grants).
        Returns the attempts, ordered by ``not_before``, and the count taken of each
        (tenant, class). It is atomic on its own: a driver may run it outside a
        transaction when the caller began none (no lock was taken, nothing is written
        after it)."""

    async def lock_keys(self, conn: AsyncConnection, keys: Sequence[int]) -> None:
        """Hold the advisory locks ``keys`` (sorted) until the transaction ends; a
        driver whose write transactions are serialised needs none."""
        return None

    @abstractmethod
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
        """Start the worker's reservations of ``tokens`` that are due within ``ahead``
        seconds, each beginning at the later of now and its instant, and its gated
        reservations whose gate is ``opened`` (as read in this transaction: the node is
        started only still PENDING under that reservation), each beginning at the
        opening with the payload it gave. Raises :class:`WorkerGone` when the worker is
        not live."""

    @abstractmethod
    async def attempts_heartbeat(
        self,
        conn: AsyncConnection,
        *,
        items: Sequence[HeartbeatItem],
        tenant_id: uuid.UUID | None,
        now: datetime | None,
    ) -> Outcomes:
        """Extend the leases of the live attempts named exactly (id and token) and keep
        the progress reports riding on the beats; the outcome of each one applied."""

    @abstractmethod
    async def attempts_complete(
        self,
        conn: AsyncConnection,
        *,
        items: Sequence[CompleteItem],
        tenant_id: uuid.UUID | None,
        now: datetime | None,
    ) -> Outcomes:
        """End the live attempts named exactly as SUCCEEDED with their results, their
        runs SUCCESS (CANCELLED when a cancel was requested), one-off jobs finished;
        the outcome of each one applied."""

    # -- shard leases ------------------------------------------------------------------

    @abstractmethod
    async def shard_leases_renew(
        self,
        conn: AsyncConnection,
        *,
        node_id: str,
        ttl: float,
        shards: int,
        now: datetime | None,
    ) -> LeaseRenewal:
        """A scheduler node's beat: record it live, count the live nodes, renew its
        leases and take expired then free ones up to its fair share of ``shards``."""
