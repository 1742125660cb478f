"""The store interface: every read and write cronwheel makes goes through it.

The contract is documented here once. ``SqlStore`` implements it once, for every
database, over a statement-level driver (``store/driver.py``): one for PostgreSQL, one
for SQLite.

Conventions:

- Methods are named noun-first and grouped by table; arguments after the first are
  keyword-only.
- ``tenant_id`` is the first argument of every tenant-scoped method, and every such
  query is filtered by it: another tenant's id behaves exactly like an unknown id
  (:class:`NotFoundError`).
- Every time-sensitive call takes ``now``; ``None`` means the database clock, the one
  time authority. Tests pass a fixed instant.
- Every run transition is one of ``domain.states.TRANSITIONS`` and appends an event in
  the same transaction; a rejected transition writes nothing.
- Batch methods take and return lists: one statement per batch, never one per run.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from cronwheel.domain.model import (
    ApiKey,
    Attempt,
    AttemptOutcome,
    DueRun,
    Event,
    FiredRun,
    Job,
    LeasedAttempt,
    NewJob,
    Page,
    QuarantinedRun,
    ReservationsStarted,
    RouteCheck,
    Run,
    Tenant,
    UnroutableRuns,
    Worker,
)
from cronwheel.store.values import (
    REDRIVE_BATCH_MAX,
    CompleteItem,
    FailItem,
    HeartbeatItem,
    LeaseRenewal,
    RedriveBatch,
    RunFilter,
)

__all__ = [
    "Store",
    "Subscription",
]


class Subscription(ABC):
    """A wake-up signal for one channel. Notifications are hints, never needed for
    correctness: every loop that waits on one also polls the database now and then."""

    @abstractmethod
    async def wait(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` seconds for notifications; return their payloads
        (empty on timeout). Notifications that arrived since the last call count."""

    @abstractmethod
    def close(self) -> None: ...


class Store(ABC):
    """Abstract store. Open with :meth:`open`, close with :meth:`close`."""

    dialect: str  # "postgresql" | "sqlite"

    @abstractmethod
    def subscribe(self, channel: str) -> Subscription:
        """Wake-ups for ``channel``, from this process and (PostgreSQL) every other."""

    # -- lifecycle -----------------------------------------------------------------

    @abstractmethod
    async def open(self) -> None:
        """Connect. Does not migrate; call :meth:`migrate` (or ``cronwheel db upgrade``)."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def migrate(self) -> None:
        """Apply every pending Alembic migration."""

    @abstractmethod
    async def db_now(self) -> datetime:
        """The database clock (aware UTC)."""

    @abstractmethod
    async def ping(self) -> None:
        """Raise :class:`StoreUnavailableError` unless the database answers."""

    # -- tenants and keys ----------------------------------------------------------

    @abstractmethod
    async def tenants_create(
        self,
        *,
        name: str,
        limits: dict[str, Any],
        actor: str | None = None,
        now: datetime | None = None,
    ) -> Tenant:
        """Create a tenant. A duplicate name raises :class:`ConflictError`."""

    @abstractmethod
    async def tenants_get(self, tenant_id: uuid.UUID) -> Tenant: ...

    @abstractmethod
    async def tenants_get_by_name(self, *, name: str) -> Tenant: ...

    @abstractmethod
    async def tenants_list(
        self, *, cursor: str | None = None, limit: int = 100
    ) -> Page[Tenant]: ...

    @abstractmethod
    async def tenants_update(
        self,
        tenant_id: uuid.UUID,
        *,
        limits: dict[str, Any],
        actor: str | None = None,
        now: datetime | None = None,
    ) -> Tenant: ...

    @abstractmethod
    async def tenants_webhook_secret(self, tenant_id: uuid.UUID) -> str:
        """The secret the webhook worker signs this tenant's requests with."""

    @abstractmethod
    async def tenants_webhook_secret_rotate(
        self, tenant_id: uuid.UUID, *, actor: str | None = None, now: datetime | None = None
    ) -> str:
        """Replace the tenant's webhook secret with a new random one and return it; the
        event ``tenant.webhook_secret_rotated`` records who (never the secret)."""

    @abstractmethod
    async def api_keys_create(
        self,
        tenant_id: uuid.UUID | None,
        *,
        role: str,
        key_hash: str,
        prefix: str,
        now: datetime | None = None,
    ) -> ApiKey:
        """Store a key by its hash (the key itself is never stored)."""

    @abstractmethod
    async def api_keys_get_by_hash(self, *, key_hash: str) -> ApiKey | None:
        """The unrevoked key with this hash, or None."""

    # -- jobs ----------------------------------------------------------------------

    @abstractmethod
    async def jobs_create_many(
        self, tenant_id: uuid.UUID, *, jobs: Sequence[NewJob], now: datetime | None = None
    ) -> list[tuple[Job, Run | None, bool]]:
        """Create jobs and their first runs in one transaction.

        Returns, per input in order, ``(job, first_run, created)``. A job whose
        ``idempotency_key`` was already used with the same request returns the existing
        job and run with ``created=False``; with a different request it raises
        :class:`IdempotencyConflictError` and nothing of the batch is written.
        """

    @abstractmethod
    async def jobs_get(self, tenant_id: uuid.UUID, job_id: uuid.UUID) -> Job: ...

    @abstractmethod
    async def jobs_list(
        self,
        tenant_id: uuid.UUID,
        *,
        state: str | None = None,
        tag: str | None = None,
        name_prefix: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[Job]:
        """Newest first; ``cursor`` is the ``next_cursor`` of the previous page."""

    @abstractmethod
    async def jobs_cancel(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: str | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Job:
        """Cancel a job: it fires no more, and its SCHEDULED and DISPATCHED runs become
        CANCELLED; RUNNING runs get ``cancel_requested``. Cancelling a finished or
        cancelled job raises :class:`IllegalTransitionError`."""

    @abstractmethod
    async def jobs_pause(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: str | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Job:
        """Pause an active job: it fires nothing until resumed. Its SCHEDULED runs stay
        (their fire time is parked at ``PARKED_FIRE_AT``, their due instant kept, reason
        "job paused") and its DISPATCHED runs go back to SCHEDULED, parked alike, so the
        pause takes effect before any run starts; RUNNING runs finish. The job's version
        increases. Pausing a job that is not active raises
        :class:`IllegalTransitionError`."""

    @abstractmethod
    async def jobs_resume(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: str | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Job:
        """Resume a paused job: its parked runs become due again at their due instant
        (reason "resumed after pause"), so the scheduler fires them at once if that
        instant has passed and the job's catch-up policy decides what happens to what
        was missed; runs due soon are announced on :data:`CHANNEL_RUNS_NEW`. Resuming a
        job that is not paused raises :class:`IllegalTransitionError`."""

    @abstractmethod
    async def jobs_trigger(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: str | None = None,
        payload: dict[str, Any] | None = None,
        now: datetime | None = None,
    ) -> Run:
        """A run of the job due now, outside its schedule (origin ``trigger``), with
        ``payload`` merged over the job's. Allowed for active, paused (the run is not
        parked: it is an explicit request) and finished jobs (a finished one-off job can
        run again); a cancelled job raises :class:`IllegalTransitionError`. Should
        another run of the job be due at the same microsecond, the run takes the next
        free one."""

    @abstractmethod
    async def jobs_backfill(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        start: datetime,
        end: datetime,
        actor: str | None = None,
        rate: float = 10.0,
        limit: int = 10_000,
        now: datetime | None = None,
    ) -> list[Run]:
        """Runs for the recurring job's occurrences in ``[start, end)``, as its DST
        policies make them, origin ``backfill``, idempotent: an occurrence that already
        has a run gets no second one. Throttled: their fire times are spread ``rate`` per
        second from now (never parked, even for a paused job). Returns the runs created,
        by due instant.

        :class:`ValidationError` names the field: ``from`` / ``to`` unless
        ``start < end <= now``; ``schedule`` for a one-off job; ``to`` when the range
        holds more than ``limit`` occurrences. A cancelled job raises
        :class:`IllegalTransitionError`."""

    # -- runs ----------------------------------------------------------------------

    @abstractmethod
    async def runs_get(self, tenant_id: uuid.UUID, run_id: uuid.UUID) -> Run: ...

    @abstractmethod
    async def runs_list(
        self,
        tenant_id: uuid.UUID,
        *,
        filter: RunFilter | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[Run]:
        """Newest first by creation."""

    @abstractmethod
    async def runs_cancel(
        self,
        tenant_id: uuid.UUID,
        run_id: uuid.UUID,
        *,
        actor: str | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Run:
        """SCHEDULED or DISPATCHED: CANCELLED at once. RUNNING: ``cancel_requested`` is
        set; the worker learns it on its next heartbeat. Terminal: IllegalTransitionError."""

    @abstractmethod
    async def runs_redrive(
        self,
        tenant_id: uuid.UUID,
        run_id: uuid.UUID,
        *,
        states: Sequence[str] = ("DEAD_LETTER",),
        actor: str | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Run:
        """Send a finished run back to SCHEDULED, due now, with a new series of attempts
        (its retry policy's ``max_attempts`` more; attempt numbers go on). Only from
        ``states`` (a redrive: DEAD_LETTER; a retry: also FAILED and CANCELLED); from any
        other state :class:`IllegalTransitionError`. A finished one-off job is active
        again until the run ends."""

    @abstractmethod
    async def runs_redrive_many(
        self,
        tenant_id: uuid.UUID,
        *,
        run_ids: Sequence[uuid.UUID] | None = None,
        job_id: uuid.UUID | None = None,
        limit: int = REDRIVE_BATCH_MAX,
        actor: str | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> RedriveBatch:
        """Redrive, as :meth:`runs_redrive` does one, the tenant's DEAD_LETTER runs among
        ``run_ids`` and of ``job_id`` (each ``None``: no such condition; both: runs
        meeting both), at most ``limit`` of them in id order, in one transaction and a
        fixed number of statements. Named ids that are not the tenant's dead letters are
        reported, not errors. An unknown ``job_id`` raises :class:`NotFoundError`;
        ``limit`` outside 1..``REDRIVE_BATCH_MAX`` or more ids than that
        :class:`ValidationError`."""

    @abstractmethod
    async def runs_count_by_state(self) -> dict[str, int]:
        """Every tenant's runs counted by state (for metrics)."""

    # -- the scheduler's hot path --------------------------------------------------

    @abstractmethod
    async def runs_due_scan(
        self,
        *,
        shards: Sequence[int],
        until: datetime,
        limit: int = 10_000,
        since: datetime | None = None,
    ) -> list[DueRun]:
        """SCHEDULED runs of ``shards`` with ``since <= fire_at < until`` (no lower bound
        when ``since`` is None), soonest first: an index range scan on ``(shard,
        fire_at) WHERE state = 'SCHEDULED'``."""

    @abstractmethod
    async def runs_fire(
        self,
        *,
        run_ids: Sequence[uuid.UUID],
        node_id: str,
        now: datetime | None = None,
        lead: float = 0.0,
        epochs: Mapping[int, int] | None = None,
    ) -> list[FiredRun]:
        """Move SCHEDULED runs to DISPATCHED in one conditional UPDATE: only runs still
        SCHEDULED, due by ``now + lead`` seconds, and whose shard ``node_id`` holds an
        unexpired lease on at ``now`` — with ``epochs`` (shard → the lease epoch the
        caller acquired), a lease of that very epoch: a node whose lease lapsed fires
        nothing from its stale view, even after it won the shard back. ``lead`` > 0
        hands runs out that many seconds ahead of their instant; the default 0 never
        dispatches a run early by the database's clock. Sets ``dispatched_at``; appends
        one event per run. Returns what moved."""

    @abstractmethod
    async def shard_leases_acquire(
        self,
        *,
        node_id: str,
        shards: Sequence[int],
        ttl: float,
        limit: int | None = None,
        now: datetime | None = None,
    ) -> dict[int, int]:
        """Renew ``node_id``'s leases among ``shards``, then take expired ones (failover
        first) and free ones, in shard order, until it holds ``limit`` (no limit: all it
        can); a change of owner increments the epoch. Returns ``{shard: epoch}`` of every
        shard ``node_id`` holds afterwards."""

    @abstractmethod
    async def scheduler_nodes_leave(self, *, node_id: str) -> None: ...

    @abstractmethod
    async def scheduler_renew(
        self, *, node_id: str, ttl: float, shards: int, now: datetime | None = None
    ) -> LeaseRenewal:
        """A scheduler node's periodic beat, in one go: record that ``node_id`` is alive
        (forgetting nodes silent for ``ttl`` seconds), count the live nodes, and acquire
        leases on the shards ``0 … shards-1`` as :meth:`shard_leases_acquire` does with
        the fair share ``ceil(shards / live)`` as its limit. The result says what it
        holds, the share, and when the first lease of another node runs out."""

    @abstractmethod
    async def shard_leases_release(self, *, node_id: str, shards: Sequence[int]) -> None: ...

    @abstractmethod
    async def shard_leases_list(self) -> list[dict[str, Any]]: ...

    @abstractmethod
    async def workers_register(
        self,
        tenant_id: uuid.UUID | None,
        *,
        pool: str,
        capabilities: Sequence[str],
        tags: Sequence[str],
        capacity: int,
        name: str | None = None,
        webhooks_only: bool = False,
        now: datetime | None = None,
    ) -> Worker: ...

    @abstractmethod
    async def workers_get(self, worker_id: uuid.UUID) -> Worker: ...

    @abstractmethod
    async def workers_deregister(
        self, worker_id: uuid.UUID, *, now: datetime | None = None
    ) -> None:
        """Record that the worker said goodbye: it no longer counts as live for routing
        (see :meth:`runs_route_check`), and it may never lease or start a run again
        (:meth:`attempts_lease`, :meth:`attempts_start_many`). An unknown or already
        deregistered worker is left as it is. What it still holds is released by
        :meth:`attempts_release_by_worker`, called after this: a lease in flight
        meanwhile has either committed (and is released) or leases nothing."""

    # -- routing: runs no live worker can take ---------------------------------------

    @abstractmethod
    async def runs_route_check(
        self,
        *,
        shards: Sequence[int],
        min_wait: float = 5.0,
        worker_ttl: float = 30.0,
        now: datetime | None = None,
    ) -> RouteCheck:
        """Record why DISPATCHED runs of ``shards`` wait. A run dispatched at least
        ``min_wait`` seconds ago that no live worker can take gets ``wait_reason`` (e.g.
        ``no live worker in pool 'gpu' has capabilities ['cuda']``) and, when the reason
        is new for it, one ``run.waiting`` event; a run some live worker can take loses
        its reason, as does a run no longer DISPATCHED. Live: not deregistered, and seen
        within ``worker_ttl`` seconds or holding an unexpired lease. Can take: the run's
        pool, its tenant (or every tenant), all the capabilities the run requires.
        Works by group of (tenant, pool, requires), never run by run."""

    @abstractmethod
    async def runs_unroutable(
        self, tenant_id: uuid.UUID | None, *, limit: int = 1000
    ) -> list[UnroutableRuns]:
        """The DISPATCHED runs waiting with a reason, by (tenant, pool, requires,
        reason), longest waiting first; only ``tenant_id``'s, or every tenant's when
        None."""

    @abstractmethod
    async def runs_quarantine(
        self,
        *,
        run_ids: Sequence[uuid.UUID],
        step: str,
        error: str,
        actor: str | None = None,
        now: datetime | None = None,
    ) -> list[uuid.UUID]:
        """Take runs a step of a scheduler pass failed on (``step``: fire, expire,
        retry) out of it: each live one becomes DEAD_LETTER with ``quarantined_at`` set
        and ``error`` as its reason, its live attempt ends FAILED, its one-off job
        finishes. Returns the runs quarantined (finished ones are left alone). See
        ``store/sql/quarantine.py``."""

    @abstractmethod
    async def runs_quarantined(
        self, tenant_id: uuid.UUID | None, *, limit: int = 1000
    ) -> list[QuarantinedRun]:
        """Quarantined runs not redriven, of jobs not cancelled: oldest first; only
        ``tenant_id``'s, or every tenant's when None."""

    @abstractmethod
    async def runs_count_quarantined(self) -> int:
        """How many runs :meth:`runs_quarantined` would list, over every tenant."""

    @abstractmethod
    async def attempts_lease(
        self,
        *,
        worker: Worker,
        max: int,
        webhooks_only: bool = False,
        ahead: float = 0.0,
        now: datetime | None = None,
    ) -> list[LeasedAttempt]:
        """Lease up to ``max`` DISPATCHED runs the worker can execute (its pool, its
        tenant if it has one, required capabilities a subset of its own; with
        ``webhooks_only``, webhook runs only), highest priority then oldest first, in
        one statement. Each whose instant (``fire_at``) has come becomes RUNNING with a
        new attempt and a new, strictly larger fencing token; it loses its
        ``wait_reason``. Two workers racing never get the same run. The worker counts
        as seen (see :meth:`runs_route_check`).

        With ``ahead`` > 0, runs due within that many seconds are leased too, as
        *reservations* (``not_before`` set): the run stays DISPATCHED, held for this
        worker under the attempt id and token it will start with, until it is started
        by :meth:`attempts_start_many` at its instant, handed back, or the reservation
        lapses (its instant plus the heartbeat timeout) and any worker may lease it.
        A cancel or pause before the start wins. A lapsed reservation is taken over by
        the next lease like any ready run.

        A deregistered worker leases nothing: :class:`WorkerDeregisteredError`, decided
        inside the statement. A lease racing :meth:`workers_deregister` is ordered with
        it: either it commits first (and a release after the deregistration finds its
        attempts) or it sees the deregistration and leases nothing."""

    @abstractmethod
    async def attempts_start_many(
        self,
        *,
        worker_id: uuid.UUID,
        tokens: Sequence[int],
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> ReservationsStarted:
        """Start reservations of ``worker_id``, named by their fencing tokens, in one
        statement: each whose run is still DISPATCHED under that reservation and whose
        instant has come becomes RUNNING with the attempt (id and token) it was
        reserved with, exactly as a lease at this moment would have made it. Refused:
        ``not_yet`` (its instant is still ahead: nothing changed, start it then), and
        ``refused`` (the reservation is gone: the run was cancelled, paused, or its
        reservation lapsed and another worker took it; never this worker's or, with
        ``tenant_id``, that tenant's). The worker drops what was refused. A
        deregistered worker starts nothing: :class:`WorkerDeregisteredError`, ordered
        with :meth:`workers_deregister` as :meth:`attempts_lease` is."""

    @abstractmethod
    async def attempts_heartbeat_many(
        self,
        *,
        items: Sequence[HeartbeatItem],
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> list[AttemptOutcome]:
        """Extend each live attempt's lease by its run's heartbeat timeout.

        An item with ``progress`` is also a progress report: the attempt records now as
        ``progress_at`` and the item's ``details`` (replacing the last ones, None
        included), and under a progress timeout its ``progress_deadline`` moves to now
        plus that timeout. Of several items for one attempt, the last report wins.

        Conventions of every ``attempts_*_many``: one outcome per item, in order. An item
        is applied only when its (attempt id, fencing token) pair is the attempt's live
        lease and, with ``tenant_id``, the attempt is that tenant's; otherwise it gets
        ``ok=False`` with ``error_code`` ``stale_fencing_token`` (the attempt exists) or
        ``not_found`` (unknown, or another tenant's), and nothing changes for it. An ok
        outcome carries the run's state afterwards."""

    @abstractmethod
    async def attempts_complete_many(
        self,
        *,
        items: Sequence[CompleteItem],
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> list[AttemptOutcome]:
        """Finish attempts successfully: their runs become SUCCESS (or CANCELLED when a
        cancel was requested); one-off jobs become finished."""

    @abstractmethod
    async def attempts_fail_many(
        self,
        *,
        items: Sequence[FailItem],
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> list[AttemptOutcome]:
        """Fail attempts: the run is retried while attempts remain and the error is
        retryable — after its backoff, or after the item's ``retry_after`` when that is
        longer — else it becomes DEAD_LETTER (retries exhausted) or FAILED (not
        retryable)."""

    @abstractmethod
    async def attempts_release_many(
        self,
        *,
        items: Sequence[HeartbeatItem],
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> list[AttemptOutcome]:
        """A worker shutting down hands attempts back: each run returns to DISPATCHED at
        once and the try is not counted. An item naming a reservation that has not
        started releases the reservation: the run is free for any worker again."""

    @abstractmethod
    async def attempts_release_by_worker(
        self,
        *,
        worker_id: uuid.UUID,
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
    ) -> list[AttemptOutcome]:
        """A worker deregistering hands back every attempt it still holds, including
        any it was leased but never received (a lease answer lost when it stopped
        mid-long-poll): each of its RUNNING attempts (with ``tenant_id``, only that
        tenant's) is released as by :meth:`attempts_release_many` — the run returns to
        DISPATCHED at once, the try is not counted — and the event records
        ``released: worker deregistered``; its reservations are released too. Returns
        one ok outcome per released attempt or reservation (empty for an unknown worker
        or one holding nothing)."""

    @abstractmethod
    async def attempts_expire(
        self,
        *,
        now: datetime | None = None,
        limit: int = 1000,
        attempt_ids: Sequence[uuid.UUID] | None = None,
    ) -> int:
        """End attempts whose lease expired (LOST), or whose deadline or progress
        deadline passed (TIMED_OUT, the error saying which), and retry or dead-letter
        their runs, and void reservations not started by their
        expiry (their runs are back in the ready queue). Returns how many attempts and
        reservations were ended. ``attempt_ids``: only these attempts (of those
        :meth:`attempts_expire_candidates` found), and no reservations."""

    @abstractmethod
    async def attempts_expire_candidates(
        self, *, now: datetime | None = None, limit: int = 1000
    ) -> list[tuple[uuid.UUID, uuid.UUID]]:
        """``(attempt id, run id)`` of up to ``limit`` attempts :meth:`attempts_expire`
        would end now: what the scheduler splits a failed sweep by."""

    @abstractmethod
    async def attempts_list(self, tenant_id: uuid.UUID, *, run_id: uuid.UUID) -> list[Attempt]: ...

    @abstractmethod
    async def attempts_get(self, attempt_id: uuid.UUID) -> Attempt: ...

    @abstractmethod
    async def attempts_get_live(
        self,
        *,
        attempt_id: uuid.UUID,
        fencing_token: int,
        tenant_id: uuid.UUID | None = None,
    ) -> Attempt:
        """The attempt, when ``fencing_token`` is its token and it is still live
        (RUNNING): the fencing check of writes kept outside the database, such as log
        lines. One read by primary key, nothing written. Unknown (or, with
        ``tenant_id``, another tenant's): :class:`NotFoundError`; a wrong token or an
        attempt that ended (succeeded, failed, lost, timed out, released):
        :class:`StaleFencingTokenError`."""

    # -- events --------------------------------------------------------------------

    @abstractmethod
    async def events_list(
        self,
        tenant_id: uuid.UUID | None,
        *,
        run_id: uuid.UUID | None = None,
        job_id: uuid.UUID | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[Event]:
        """Oldest first (the order things happened)."""

    @abstractmethod
    async def events_transitions(self) -> dict[tuple[str | None, str], int]:
        """Every ``(from_state, to_state)`` pair the history records for runs, with how
        often: what ``domain.states.illegal_transitions`` checks against the table."""
