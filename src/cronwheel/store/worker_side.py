"""The workers' side of the store interface: registration and the worker protocol —
lease, start, heartbeat, complete, fail, release (the conventions are
``store/base.py``'s)."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import datetime

from cronwheel.domain.model import (
    Attempt,
    AttemptOutcome,
    CancelRequest,
    LeasedAttempt,
    Page,
    ReservationsStarted,
    Worker,
    WorkerStatus,
)
from cronwheel.store.values import (
    Admitted,
    CompleteItem,
    FailItem,
    GatedHeld,
    Gates,
    HeartbeatItem,
    LeaseShare,
)

__all__ = ["WorkerSide"]


class WorkerSide(ABC):
    """What the worker protocol calls."""

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
        tasks: Sequence[str] | None = None,
        now: datetime | None = None,
    ) -> Worker:
        """A new worker of ``tenant_id`` (None: serving every tenant of its pool).
        ``tasks``: the task names it runs — it leases only runs of those tasks (and
        webhook runs, as its capabilities allow); None: any task. Capabilities, tags and
        tasks are stored sorted, without repeats."""

    @abstractmethod
    async def workers_list(
        self,
        tenant_id: uuid.UUID | None,
        *,
        pool: str | None = None,
        worker_ttl: float = 30.0,
        cursor: str | None = None,
        limit: int = 100,
        now: datetime | None = None,
    ) -> Page[WorkerStatus]:
        """Workers by id, with what they hold now and whether they are live (as the
        routing check counts it, :meth:`runs_route_check`: not deregistered, and seen
        within ``worker_ttl`` seconds or holding an unexpired lease). With
        ``tenant_id``: the workers serving that tenant — its own and the shared ones
        (no tenant), never another tenant's, and what they hold of that tenant's
        only; None: every worker. ``pool``: only that pool's."""

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

    async def attempts_lease(
        self,
        *,
        worker: Worker,
        max: int,
        webhooks_only: bool = False,
        ahead: float = 0.0,
        now: datetime | None = None,
        p0_share: float = 0.0,
        reserve: int = 0,
    ) -> list[LeasedAttempt]:
        """Lease up to ``max`` DISPATCHED runs the worker can execute (its pool, its
        tenant if it has one, required capabilities a subset of its own, route tags a
        subset of its tags, a task among its ``tasks`` unless it declared none; with
        ``webhooks_only``, webhook runs only): runs it cannot take are passed over, so
        a batch fills with runs it can take however many others stand before them in
        the queue. Admission decides how many of each tenant's and class's runs it is
        given (``domain/admission.py``): highest priority first; lower classes leave
        the worker floor(share * capacity) slots free for P0, ``share`` being the pool's
        own setting or else ``p0_share``; each tenant within its limits (runs held,
        dispatch rate); and tenants competing in a class by their weights. Each
        tenant's runs go oldest first. Each
        whose instant (``fire_at``) has come becomes RUNNING with a new attempt and a
        new, strictly larger fencing token; it loses its ``wait_reason``. Two workers
        racing never get the same run. The worker counts as seen (see
        :meth:`runs_route_check`).

        With ``ahead`` > 0, runs due within that many seconds are leased too, as
        *reservations* (``not_before`` set): the run stays DISPATCHED, held for this
        worker under the attempt id and token it will start with, until it is started
        by :meth:`attempts_start_many` at its instant, handed back, or the reservation
        lapses (its instant plus the heartbeat timeout) and any worker may lease it.
        A cancel or pause before the start wins. A lapsed reservation is taken over by
        the next lease like any ready run. With ``reserve`` > 0 too, a worker whose
        ``max`` was filled is also given up to ``reserve`` more runs not due yet, all
        reservations (beyond its free slots: a worker whose handlers are short begins
        many runs of a burst in the time its slots take to free up).

        A deregistered worker leases nothing: :class:`WorkerDeregisteredError`, decided
        inside the statement. A lease racing :meth:`workers_deregister` is ordered with
        it: either it commits first (and a release after the deregistration finds its
        attempts) or it sees the deregistration and leases nothing."""
        admitted = await self.attempts_lease_admitted(
            worker=worker,
            max=max,
            webhooks_only=webhooks_only,
            ahead=ahead,
            now=now,
            p0_share=p0_share,
            reserve=reserve,
        )
        return admitted.attempts

    @abstractmethod
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
        """:meth:`attempts_lease`, telling also what admission held back: the tenants
        a limit held, and when a dispatch-rate limit will let the next run go. With
        ``share``, this lease is one of several woken together that share a large
        batch of ready runs (:class:`LeaseShare`): it takes at most its part.

        With ``gated`` > 0, the worker is also given up to that many *gated
        reservations*, admitted as any lease is: workflow nodes still waiting (PENDING)
        whose upstream nodes are all under way (``runs.gated_at``), reserved for it
        under the attempt id and token they will start with (``gated`` set,
        ``not_before`` None). The node stays PENDING. When its upstream nodes make it
        ready, its gate opens instead (:meth:`attempts_gates`): its holder begins it
        and then starts it (:meth:`attempts_start_many`). Unopened, the reservation
        lapses after the node's heartbeat timeout (and may be taken again); opened and
        not started within that timeout, it lapses and the node is made ready for any
        worker. A gated reservation counts against ``max_concurrent_runs``."""

    @abstractmethod
    async def attempts_gates(
        self,
        *,
        worker_id: uuid.UUID,
        tokens: Sequence[int],
        tenant_id: uuid.UUID | None = None,
        held: Sequence[GatedHeld] | None = None,
    ) -> Gates:
        """Of the worker's gated reservations ``tokens``: those whose gate opened, with
        the payload the opening gave the node (its upstream results) and when it
        opened, and those that are gone (lapsed, voided by a cancel or a skip, handed
        back, started: the worker drops them). Reads only, nothing written. Every
        opening notifies the holders on ``CHANNEL_GATES`` once it commits (a wake-up:
        this read is the truth). With ``held`` (a read's ``held`` for these tokens),
        only their gates are read — what a notice calls for — and none is told gone."""

    @abstractmethod
    async def attempts_start_many(
        self,
        *,
        worker_id: uuid.UUID,
        tokens: Sequence[int],
        tenant_id: uuid.UUID | None = None,
        now: datetime | None = None,
        ahead: float = 0.0,
    ) -> ReservationsStarted:
        """Start reservations of ``worker_id``, named by their fencing tokens, in one
        statement: each whose run is still DISPATCHED under that reservation and whose
        instant is at most ``ahead`` seconds away becomes RUNNING with the attempt (id
        and token) it was reserved with, exactly as a lease at the later of now and its
        instant would have made it (a run started ahead begins at its instant). A gated
        reservation whose gate opened starts too, beginning at the opening (its READY
        transition dated then); one whose gate is shut is ``not_yet``. Refused:
        ``not_yet`` (its instant is further ahead: nothing changed, start it later), and
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
    async def attempts_cancel_requested(
        self, *, worker_id: uuid.UUID, tenant_id: uuid.UUID | None = None
    ) -> list[CancelRequest]:
        """The worker's live (RUNNING) attempts whose run was asked to stop — a cancel of
        the run, of its job, in bulk, or ``overlap: cancel_previous`` — with ``tenant_id``
        only that tenant's, by fencing token. What a heartbeat answers as
        ``cancel_requested``, for every attempt of the worker in one read that writes
        nothing. Every change that asks a running run to stop notifies the workers
        running it on ``CHANNEL_CANCELS`` once it commits (a wake-up: this read is the
        truth)."""

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
