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
- Every run transition is one of the named moves of ``domain.states`` (``FIRE``,
  ``START``, ``FAIL``, …; ``TRANSITIONS`` is their union): a statement that moves runs
  takes its state precondition from the move (``statements.may``, ``Move.sql``) and
  appends an event in the same transaction; a rejected transition writes nothing.
- Batch methods take and return lists: one statement per batch, never one per run.
- Every method that changes something on request takes ``actor``
  (``domain.audit.Actor``) and appends one audit record in the change's own
  transaction (``audit_list`` reads them); without an actor the change is recorded in
  the history (events) only.
- Every method that adds runs on request — ``jobs_create_many``, ``jobs_trigger``,
  ``jobs_backfill``, ``runs_redrive``, ``runs_redrive_many`` — raises
  :class:`TenantLimitError` and writes nothing when the tenant would end with more
  pending runs than its ``max_pending_runs`` (``store/sql/pending.py``). The
  scheduler's next occurrences are never refused.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import date, datetime
from typing import Any

from cronwheel.domain.audit import Actor, AuditRecord
from cronwheel.domain.bulk import Operation, Selector
from cronwheel.domain.job_edit import JobEdit
from cronwheel.domain.model import (
    ApiKey,
    Attempt,
    Event,
    Job,
    NewJob,
    Page,
    Run,
    Tenant,
)
from cronwheel.domain.overrides import Override, OverrideScope
from cronwheel.domain.pools import Pool, PoolCapacity, PoolStatus
from cronwheel.domain.states import REDRIVE, Move
from cronwheel.store.scheduler_side import SchedulerSide
from cronwheel.store.values import (
    REDRIVE_BATCH_MAX,
    BucketTake,
    JobDeleted,
    LogChunk,
    LogHead,
    LogWrite,
    Migrated,
    RedriveBatch,
    RunFilter,
    RunsOverview,
    TenantDeleted,
    UiSession,
)
from cronwheel.store.worker_side import WorkerSide

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


class Store(SchedulerSide, WorkerSide):
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
    async def migrate(self) -> Migrated:
        """Apply every pending Alembic migration; say from which revision to which."""

    @abstractmethod
    async def db_now(self) -> datetime:
        """The database clock (aware UTC)."""

    @abstractmethod
    async def db_now_estimate(self) -> datetime:
        """The database clock without a round trip: this process's clock corrected by
        its offset from the database's, measured when last read more than a few seconds
        ago. Never ahead of the database clock; behind it by at most the measuring round
        trip (plus how far the local clock drifted since). For instants that must not
        cost a round trip of their own — a new job's first due instant — never for
        leases or expiry."""

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
        actor: Actor | None = None,
        now: datetime | None = None,
    ) -> Tenant:
        """Create a tenant. A duplicate name raises :class:`ConflictError`."""

    @abstractmethod
    async def tenants_get(self, tenant_id: uuid.UUID) -> Tenant: ...

    @abstractmethod
    async def tenants_get_by_name(self, *, name: str) -> Tenant: ...

    @abstractmethod
    async def tenants_held(
        self, tenant_ids: Sequence[uuid.UUID], *, now: datetime | None = None
    ) -> dict[uuid.UUID, str]:
        """The tenants of ``tenant_ids`` whose limits hold their ready runs back now,
        each with the reason a waiting run of theirs shows: at ``max_concurrent_runs``
        (runs leased or running), or with an empty dispatch-rate bucket."""

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
        actor: Actor | None = None,
        now: datetime | None = None,
    ) -> Tenant: ...

    @abstractmethod
    async def tenants_webhook_secret(self, tenant_id: uuid.UUID) -> str:
        """The secret the webhook worker signs this tenant's requests with."""

    @abstractmethod
    async def tenants_webhook_secret_rotate(
        self, tenant_id: uuid.UUID, *, actor: Actor | None = None, now: datetime | None = None
    ) -> str:
        """Replace the tenant's webhook secret with a new random one and return it; the
        event ``tenant.webhook_secret_rotated`` records who (never the secret)."""

    @abstractmethod
    async def tenants_delete(
        self,
        tenant_id: uuid.UUID,
        *,
        force: bool = False,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> TenantDeleted:
        """Delete the tenant with its API keys, workers, jobs, runs, attempts and run
        events, in one transaction. Refused (:class:`InUseError`, naming them) while it
        has a job active or paused or a run in progress (DISPATCHED or RUNNING), unless
        ``force``. The event ``tenant.deleted`` (``actor``, ``role``, ``reason``, the
        name and counts) and the tenant's other events not tied to a run remain: the
        audit trail. Attempts under way are refused as stale from then on (see
        ``store/sql/deletion.py``). An unknown tenant: :class:`NotFoundError`."""

    @abstractmethod
    async def api_keys_create(
        self,
        tenant_id: uuid.UUID | None,
        *,
        role: str,
        key_hash: str,
        prefix: str,
        actor: Actor | None = None,
        now: datetime | None = None,
    ) -> ApiKey:
        """Store a key by its hash (the key itself is never stored)."""

    @abstractmethod
    async def api_keys_get_by_hash(self, *, key_hash: str) -> ApiKey | None:
        """The unrevoked key with this hash, or None."""

    # -- dashboard sessions ----------------------------------------------------------

    @abstractmethod
    async def ui_sessions_create(
        self,
        *,
        token_hash: str,
        key_hash: str,
        tenant_id: uuid.UUID | None,
        idle: float,
        lifetime: float,
        now: datetime | None = None,
    ) -> UiSession:
        """Store a new session, expiring ``idle`` seconds from now (at most ``lifetime``
        seconds after it began), and purge the expired ones."""

    @abstractmethod
    async def ui_sessions_get(
        self, *, token_hash: str, now: datetime | None = None
    ) -> UiSession | None:
        """The session with this token hash, unless it is unknown or expired (None)."""

    @abstractmethod
    async def ui_sessions_touch(
        self,
        *,
        token_hash: str,
        idle: float,
        lifetime: float,
        now: datetime | None = None,
    ) -> None:
        """The session was used now: it expires ``idle`` seconds from now (never past
        ``lifetime`` seconds after it began)."""

    @abstractmethod
    async def ui_sessions_set_tenant(self, *, token_hash: str, tenant_id: uuid.UUID | None) -> None:
        """The tenant the session looks at from now on."""

    @abstractmethod
    async def ui_sessions_delete(self, *, token_hash: str) -> None:
        """End the session (signed out, or its key is no longer valid)."""

    # -- shared token buckets --------------------------------------------------------

    @abstractmethod
    async def rate_buckets_take(
        self,
        *,
        name: str,
        rate: float,
        burst: float,
        wanted: int,
        now: datetime | None = None,
    ) -> BucketTake:
        """Take up to ``wanted`` whole tokens from the bucket ``name`` (``rate`` a
        second, up to ``burst``; full when first drawn on), for every node at once:
        takes racing on one bucket are serialised, so together they never get more
        than ``burst`` + ``rate`` x the time elapsed. Grants what it holds, maybe 0."""

    @abstractmethod
    async def api_keys_bootstrap(
        self, *, key_hash: str, prefix: str, now: datetime | None = None
    ) -> tuple[ApiKey, bool]:
        """The deployment's bootstrap admin key (no tenant): stored by ``key_hash``
        unless one exists, in which case that one is returned untouched — ``(record,
        created)``. Of any number of processes calling at once on an empty database,
        exactly one creates it. (A revoked bootstrap key stays the bootstrap key.)"""

    @abstractmethod
    async def api_keys_list(
        self, tenant_id: uuid.UUID, *, cursor: str | None = None, limit: int = 100
    ) -> Page[ApiKey]:
        """The tenant's keys, revoked ones included, oldest first (never a hash)."""

    @abstractmethod
    async def api_keys_revoke(
        self,
        tenant_id: uuid.UUID,
        key_id: uuid.UUID,
        *,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> ApiKey:
        """Revoke the tenant's key: it authenticates nothing from now on. The event
        ``api_key.revoked`` records who and why, and a notice on
        :data:`CHANNEL_KEYS_REVOKED` tells every API node to forget the key at once.
        Revoking a revoked key changes nothing and returns it; an unknown key, or
        another tenant's, raises :class:`NotFoundError`."""

    # -- jobs ----------------------------------------------------------------------

    @abstractmethod
    async def jobs_create_many(
        self,
        tenant_id: uuid.UUID,
        *,
        jobs: Sequence[NewJob],
        now: datetime | None = None,
    ) -> list[tuple[Job, Run | None, bool]]:
        """Create jobs and their first runs in one transaction.

        Returns, per input in order, ``(job, first_run, created)``. A job whose
        ``idempotency_key`` was already used with the same request returns the existing
        job and run with ``created=False``; with a different request it raises
        :class:`IdempotencyConflictError` and nothing of the batch is written.
        """

    @abstractmethod
    async def jobs_create_many_brief(
        self,
        tenant_id: uuid.UUID,
        *,
        jobs: Sequence[NewJob],
        now: datetime | None = None,
    ) -> list[tuple[Job, uuid.UUID | None, bool]]:
        """:meth:`jobs_create_many`, each first run answered by its id alone: what the
        API answers, without a record made of every new run."""

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
        workflows: bool | None = None,
    ) -> Page[Job]:
        """Newest first; ``cursor`` is the ``next_cursor`` of the previous page.
        ``workflows``: only workflows (True), only jobs (False), or both (None)."""

    # -- workflows (``domain/workflow.py``, ``store/sql/dag.py``) -------------------------

    @abstractmethod
    async def workflows_create(
        self, tenant_id: uuid.UUID, *, new: NewJob, now: datetime | None = None
    ) -> tuple[Job, Run | None, bool]:
        """Create the workflow ``new`` (a job whose ``workflow`` is its DAG) and its first
        workflow run, in one transaction; and whether it was created (False: ``new``'s
        idempotency key was used before with the same request, and this is the workflow
        created then, with its first run; another request: IdempotencyConflictError)."""

    @abstractmethod
    async def workflow_runs_list(
        self,
        tenant_id: uuid.UUID,
        workflow_id: uuid.UUID,
        *,
        states: Sequence[str] = (),
        cursor: str | None = None,
        limit: int = 50,
    ) -> Page[Run]:
        """A workflow's workflow runs, newest first (by due instant)."""

    @abstractmethod
    async def workflow_run_nodes(
        self, tenant_id: uuid.UUID, run_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, list[Run]]:
        """The node runs of each workflow run of ``run_ids``."""

    @abstractmethod
    async def jobs_cancel(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Job:
        """Cancel a job: it fires no more, and its SCHEDULED and DISPATCHED runs become
        CANCELLED; RUNNING runs get ``cancel_requested``. Cancelling a finished or
        cancelled job raises :class:`IllegalTransitionError`."""

    @abstractmethod
    async def jobs_delete(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        force: bool = False,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> JobDeleted:
        """Delete the job with its runs, their attempts and their events, in one
        transaction, whatever the job's state. Refused (:class:`InUseError`, naming the
        runs and their states) while a run of it is DISPATCHED or RUNNING, unless
        ``force``: then those runs end with it, and a worker's later report about one
        of their attempts is refused as stale. The event ``job.deleted`` (``actor``,
        ``role``, ``reason``, the job's name and state, what was stopped) and the job's
        other events not tied to a run remain: the audit trail. Worker logs are the
        caller's to delete (``JobDeleted.attempted``)."""

    @abstractmethod
    async def jobs_pause(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: Actor | None = None,
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
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Job:
        """Resume a paused job: its parked runs become due again at their due instant
        (reason "resumed after pause"), so the scheduler fires them at once if that
        instant has passed and the job's catch-up policy decides what happens to what
        was missed; runs due soon are announced on :data:`CHANNEL_RUNS_NEW`. Resuming a
        job that is not paused raises :class:`IllegalTransitionError`."""

    @abstractmethod
    async def jobs_update(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        edit: JobEdit,
        actor: Actor | None = None,
        reason: str | None = None,
        max_payload_bytes: int | None = None,
        now: datetime | None = None,
    ) -> Job:
        """Apply ``edit`` (``domain.job_edit``): the job becomes ``edit.spec``, its
        version one more, in one conditional UPDATE — only while it is still at
        ``edit.version`` and active or paused. Otherwise nothing changes and it raises
        :class:`NotFoundError`, :class:`IllegalTransitionError` (the job is over) or
        :class:`StaleVersionError` (``details.current_version``): of two edits made
        from one version, exactly one applies.

        In the same transaction the job's pending occurrence — its SCHEDULED run of
        origin ``once``/``schedule`` not yet tried, parked or not — follows: when the
        occurrences change (``edit.occurrence``) it moves, the same run, to the first
        occurrence of the new schedule from ``now`` that no other run of the job has
        (event ``run.rescheduled``; created when there was none; a paused job's stays
        parked), and any other such run ends SKIPPED ("job edited"); when the template
        changes (``edit.rewrites``) its template columns are rewritten (``run.edited``).
        Every other run — dispatched (ahead of its instant, reserved or not), running,
        triggered, backfilled, replayed, retried — keeps what it was made with. A
        one-off job whose run was dispatched or tried cannot change its schedule:
        :class:`ConflictError`, nothing changed. The event ``job.edited`` records
        ``edit.before`` / ``edit.after``, the audit record (``job.edit``) the same;
        runs now due soon are announced on :data:`CHANNEL_RUNS_NEW`."""

    @abstractmethod
    async def jobs_trigger(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        *,
        actor: Actor | None = None,
        payload: dict[str, Any] | None = None,
        max_payload_bytes: int | None = None,
        now: datetime | None = None,
    ) -> Run:
        """A run of the job due now, outside its schedule (origin ``trigger``), with
        ``payload`` merged over the job's, then the job's ``future`` overrides; with a
        ``payload``, the result must be within ``max_payload_bytes``
        (:class:`PayloadTooLargeError`). Allowed for active, paused (the run is not
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
        actor: Actor | None = None,
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

    # -- overrides (``domain/overrides.py``) ----------------------------------------

    @abstractmethod
    async def overrides_create(
        self,
        tenant_id: uuid.UUID,
        *,
        scope: OverrideScope,
        job_id: uuid.UUID | None = None,
        run_id: uuid.UUID | None = None,
        payload: dict[str, Any] | None = None,
        timeout: float | None = None,
        priority: int | None = None,
        pool: str | None = None,
        reason: str | None = None,
        actor: Actor | None = None,
        max_payload_bytes: int | None = None,
        now: datetime | None = None,
    ) -> tuple[Override, list[uuid.UUID]]:
        """Make an override of ``job_id`` (scope ``next`` or ``future``) or of
        ``run_id`` (scope ``run``) and apply it, at once, to the runs it reaches: answers
        it and their ids. NotFoundError for no such job or run; ConflictError for a run
        that started, a ``next`` with no unstarted occurrence, or a job at its limit of
        overrides; IllegalTransitionError for a job that is over; ValidationError (or
        PayloadTooLargeError) for values no run may take. Nothing is stored then."""

    @abstractmethod
    async def overrides_remove(
        self,
        tenant_id: uuid.UUID,
        override_id: uuid.UUID,
        *,
        job_id: uuid.UUID | None = None,
        run_id: uuid.UUID | None = None,
        actor: Actor | None = None,
        reason: str | None = None,
        max_payload_bytes: int | None = None,
        now: datetime | None = None,
    ) -> tuple[Override, list[uuid.UUID]]:
        """Remove an active override (of ``job_id`` or bound to ``run_id`` when given):
        the unstarted runs it reached are made again without it. ConflictError for one
        already removed or consumed (its run started with it). A payload the others
        then make past ``max_payload_bytes`` is refused (413) and nothing changes."""

    @abstractmethod
    async def overrides_list(
        self,
        tenant_id: uuid.UUID,
        *,
        job_id: uuid.UUID | None = None,
        run_id: uuid.UUID | None = None,
        ended: bool = False,
    ) -> list[Override]: ...

    @abstractmethod
    async def overrides_get(self, tenant_id: uuid.UUID, override_id: uuid.UUID) -> Override: ...

    # -- runs ----------------------------------------------------------------------

    @abstractmethod
    async def runs_get(self, tenant_id: uuid.UUID, run_id: uuid.UUID) -> Run: ...

    @abstractmethod
    async def runs_list(
        self,
        tenant_id: uuid.UUID | None,
        *,
        filter: RunFilter | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[Run]:
        """The tenant's runs (None: every tenant's) matching ``filter``, newest first by
        due instant, then by id; ``cursor`` is a page's ``next_cursor`` (keyset: runs
        added meanwhile never shift later pages). A malformed cursor is a
        :class:`ValidationError`."""

    @abstractmethod
    async def runs_last_finished(
        self, tenant_id: uuid.UUID, *, job_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, Run]:
        """Each job's last outcome: its newest finished run by due instant (as the
        history orders a job's runs), by job id. A job with no finished run, or not the
        tenant's, is left out. One statement for every job: for each, a backward walk
        of the job's runs by the key (tenant_id, job_id, due_at, node) to its first
        finished one."""

    @abstractmethod
    async def runs_cancel(
        self,
        tenant_id: uuid.UUID,
        run_id: uuid.UUID,
        *,
        actor: Actor | None = None,
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
        move: Move = REDRIVE,
        actor: Actor | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Run:
        """Send a finished run back to SCHEDULED, due now, with a new series of attempts
        (its retry policy's ``max_attempts`` more; attempt numbers go on). Only from the
        sources of ``move`` (REDRIVE: DEAD_LETTER; RETRY: also FAILED and CANCELLED); from
        any other state :class:`IllegalTransitionError`. A finished one-off job is active
        again until the run ends."""

    @abstractmethod
    async def runs_redrive_many(
        self,
        tenant_id: uuid.UUID,
        *,
        run_ids: Sequence[uuid.UUID] | None = None,
        job_id: uuid.UUID | None = None,
        limit: int = REDRIVE_BATCH_MAX,
        actor: Actor | None = None,
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

    @abstractmethod
    async def runs_overview(
        self,
        tenant_id: uuid.UUID | None,
        *,
        since: datetime,
        minutes: int,
        until: datetime | None = None,
    ) -> RunsOverview:
        """The runs due from ``since`` for ``minutes`` minutes — cut at ``until`` when
        given and earlier (the current minute so far) — by minute and in all, counted
        by state with their dispatch and start lateness (:class:`RunStats`).
        ``tenant_id`` None: every tenant's. Reads only the runs of the window, through
        ranges of a ``(tenant_id, due_at)`` index, one per tenant (see
        ``store/sql/overview.py``). ``minutes`` outside 1..1440, or ``until`` not after
        ``since``, raises :class:`ValidationError`."""

    @abstractmethod
    async def attempts_list(self, tenant_id: uuid.UUID, *, run_id: uuid.UUID) -> list[Attempt]: ...

    @abstractmethod
    async def attempts_get(self, attempt_id: uuid.UUID) -> Attempt: ...

    # -- pools -----------------------------------------------------------------------

    @abstractmethod
    async def pools_set(
        self,
        name: str,
        *,
        p0_reserved_share: float | None,
        actor: Actor | None = None,
        now: datetime | None = None,
    ) -> Pool:
        """Set the pool's share of worker slots kept for P0 runs (0..1; None: the
        deployment's default ``p0_reserved_share``), recorded as the event
        ``pool.updated`` (no tenant: ``actor``, the pool, the share and the one
        before). A share out of range raises :class:`ValidationError`."""

    @abstractmethod
    async def pools_get(self, name: str) -> Pool:
        """The pool's settings; a pool never set has every one None."""

    @abstractmethod
    async def pools_capacity(
        self,
        *,
        default_share: float = 0.0,
        worker_ttl: float = 30.0,
        now: datetime | None = None,
    ) -> dict[str, PoolCapacity]:
        """What each pool's live workers can take now, every tenant's work counted:
        the pools with a live worker, in one statement (what a dispatcher reads before
        each release). Live as :meth:`workers_list` counts it; a worker's busy slots
        are its RUNNING attempts and the runs reserved for it. ``free_by_owner``
        splits the free slots by whom the workers serve (a tenant's own workers take
        only its runs; None: shared ones)."""

    @abstractmethod
    async def pools_status(
        self,
        tenant_id: uuid.UUID | None,
        *,
        names: Sequence[str] | None = None,
        default_share: float = 0.0,
        worker_ttl: float = 30.0,
        now: datetime | None = None,
    ) -> list[PoolStatus]:
        """Pools by name with their live workers, capacity, busy and free slots, P0
        share and reserved slots, and backlog — ready runs (the ready queue) and due
        ones (SCHEDULED, fire time come) by tenant and priority. ``names``: those
        pools, whatever they hold; None: every pool with a live worker or a backlog.
        With ``tenant_id``: as that tenant sees them — the workers serving it (its own
        and the shared ones), only its own runs counted busy, ``free`` None, only its
        own backlog, and (``names`` None) the pools of those workers or that backlog.
        Index bounded (see ``store/sql/pools.py``)."""

    # -- events --------------------------------------------------------------------

    # -- bulk operations (domain/bulk.py) ---------------------------------------------

    @abstractmethod
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
        """Accept a bulk operation: PENDING, its audit record written, the API nodes
        woken to claim it. ``ValidationError`` (nothing stored) for a selector that does
        not fit the action or is empty without ``all``; ``TenantLimitError`` (nothing
        stored) when the tenant has ``max_open`` operations open (pending or running)
        already, two requests at once counting each other; NotFoundError for no
        tenant."""

    @abstractmethod
    async def operations_get(self, tenant_id: uuid.UUID, operation_id: uuid.UUID) -> Operation:
        """One of the tenant's operations; NotFoundError otherwise."""

    @abstractmethod
    async def operations_list(
        self, tenant_id: uuid.UUID, *, cursor: str | None = None, limit: int = 100
    ) -> Page[Operation]:
        """The tenant's operations, newest first."""

    @abstractmethod
    async def operations_claim(
        self, *, owner: str, ttl: float, now: datetime | None = None
    ) -> Operation | None:
        """Take an open operation nobody holds (never claimed, or its holder's lease
        lapsed) for ``ttl`` seconds: RUNNING, held by ``owner``. None: none left. Fair
        between tenants: the oldest of the tenant whose place in line is first — every
        tenant's oldest open operation goes before any tenant's second, and so on."""

    @abstractmethod
    async def operations_step(
        self, operation_id: uuid.UUID, *, owner: str, ttl: float, now: datetime | None = None
    ) -> Operation:
        """One step of an operation ``owner`` holds, in one transaction with its counts;
        the lease renewed, DONE when nothing was left. ``LeaseLostError`` (a
        ConflictError) when ``owner`` no longer holds it: nothing changed."""

    @abstractmethod
    async def operations_renew(
        self, *, owner: str, ttl: float, now: datetime | None = None
    ) -> list[uuid.UUID]:
        """Extend, for ``ttl`` seconds from ``now``, the lease of every operation
        ``owner`` holds, in one statement; their ids (those it no longer holds are not
        among them)."""

    @abstractmethod
    async def operations_fail(
        self, operation_id: uuid.UUID, *, owner: str, error: str, now: datetime | None = None
    ) -> None:
        """End an operation ``owner`` holds as FAILED with ``error`` — shown to the
        tenant's clients as it is, so never an exception's raw text; what its steps did
        stays done."""

    @abstractmethod
    async def operations_expire(self, *, retention_days: int, now: datetime | None = None) -> int:
        """Retention: delete the operations that finished (done or failed) more than
        ``retention_days`` before ``now``, in bounded batches; how many went. Open ones
        stay, however old."""

    @abstractmethod
    async def audit_list(
        self,
        tenant_id: uuid.UUID | None,
        *,
        actor: str | None = None,
        action: str | None = None,
        target_kind: str | None = None,
        target_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page[AuditRecord]:
        """The audit trail, newest first: a tenant's records (``None``: every record,
        the changes to no one tenant among them), each filter an exact match, ``since``
        inclusive and ``until`` exclusive. ``ValidationError`` for a malformed cursor or
        an empty time range."""

    @abstractmethod
    async def audit_expire(self, *, retention_days: int, now: datetime | None = None) -> int:
        """Retention, the only way audit records leave: delete those made more than
        ``retention_days`` before ``now``, in bounded batches; how many went."""

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

    # -- worker logs (the database log store) --------------------------------------

    @abstractmethod
    async def log_chunks_append(
        self,
        tenant_id: uuid.UUID,
        *,
        run_id: uuid.UUID,
        attempt: int,
        plan: Callable[[LogHead], LogWrite],
        now: datetime | None = None,
    ) -> int:
        """Append to an attempt's log what ``plan`` makes of its head (called once,
        while no other append to the attempt, from any process, runs), as one chunk of
        the day of ``now``; return the bytes the log takes after. The day's partition
        must exist (:meth:`log_chunks_maintain`)."""

    @abstractmethod
    async def log_chunks_read(
        self,
        tenant_id: uuid.UUID,
        *,
        run_id: uuid.UUID,
        after: tuple[int, int] = (0, 0),
        attempt: int | None = None,
        limit: int = 100,
    ) -> list[LogChunk]:
        """Up to ``limit`` chunks of the run's log past ``after`` — ``(attempt,
        offset)``: the chunks of that attempt ending past the offset, then every chunk
        of later attempts — by attempt, then position; only ``attempt``'s when given."""

    @abstractmethod
    async def log_chunks_size(
        self, tenant_id: uuid.UUID, *, run_id: uuid.UUID, attempt: int
    ) -> int:
        """Bytes the attempt's log takes (0: none)."""

    @abstractmethod
    async def log_chunks_delete(
        self, tenant_id: uuid.UUID, *, run_ids: Sequence[uuid.UUID] | None = None
    ) -> int:
        """Delete the chunks of ``run_ids`` (None: every chunk of the tenant), as their
        job or tenant is deleted; how many went."""

    @abstractmethod
    async def log_chunks_maintain(
        self, *, retention_days: int, now: datetime | None = None
    ) -> list[date]:
        """Make room for the chunks of the day before ``now``, its day and the next
        (PostgreSQL: a partition each), and remove those of every day more than
        ``retention_days`` before it (whole partitions); the days removed."""
