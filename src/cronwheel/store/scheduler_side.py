"""The scheduler's side of the store interface: the due-window scan, firing, shard
leases, the routing check, quarantine and the expiry sweep (the conventions are
``store/base.py``'s)."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from cronwheel.domain.model import (
    DueRun,
    FiredRun,
    MissedRun,
    QuarantinedRun,
    RouteCheck,
    ScheduleProbe,
    StalledJob,
    UnroutableRuns,
)
from cronwheel.store.values import (
    LeaseRenewal,
    Releasable,
)

__all__ = ["SchedulerSide"]


class SchedulerSide(ABC):
    """What scheduler nodes call."""

    @abstractmethod
    async def runs_due_scan(
        self,
        *,
        shards: Sequence[int],
        until: datetime,
        limit: int = 10_000,
        since: datetime | None = None,
        after_id: uuid.UUID | None = None,
    ) -> list[DueRun]:
        """SCHEDULED runs of ``shards`` with ``since <= fire_at < until`` (no lower bound
        when ``since`` is None), soonest first, then by id: an index range scan on
        ``(shard, fire_at) WHERE state = 'SCHEDULED'``. With ``after_id``, only those
        after ``(since, after_id)`` in that order: the next page of a scan that stopped
        at its limit inside one instant (a burst larger than the limit)."""

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
        pool, its tenant (or every tenant), all the capabilities the run requires, its
        task (a worker that declared no tasks runs any), tags holding all the run's
        route tags — what leasing asks. The reason names what is missing (``no live
        worker in pool 'default' handles task 'ops.ping'``, ``… has tags ['red']``).
        Works by group of (tenant, pool, requires, route tags, task), never run by
        run."""

    @abstractmethod
    async def runs_unroutable(
        self, tenant_id: uuid.UUID | None, *, limit: int = 1000
    ) -> list[UnroutableRuns]:
        """The DISPATCHED runs waiting with a reason, by (tenant, pool, requires,
        route tags, reason), longest waiting first; only ``tenant_id``'s, or every tenant's when
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
    async def tenant_names(self, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
        """The names of the tenants of ``ids`` that exist (metric labels)."""

    @abstractmethod
    async def runs_mark_missed(
        self,
        *,
        shards: Sequence[int],
        run_ids: Sequence[uuid.UUID] | None = None,
        actor: str | None = None,
        now: datetime | None = None,
        limit: int = 1000,
    ) -> list[MissedRun]:
        """Mark up to ``limit`` runs of ``shards`` (only those of ``run_ids`` when given)
        missed: SCHEDULED past their fire time plus their job's lateness budget and not
        marked in this stint; one ``run.missed`` event each, oldest fire time first.
        Rows another transaction holds (being fired) are skipped. Returns those marked."""

    @abstractmethod
    async def runs_missed_candidates(
        self, *, shards: Sequence[int], now: datetime | None = None, limit: int = 1000
    ) -> list[uuid.UUID]:
        """The runs :meth:`runs_mark_missed` would mark, without marking them: what the
        scheduler splits a failing batch by."""

    @abstractmethod
    async def runs_missed(
        self, tenant_id: uuid.UUID | None, *, now: datetime | None = None, limit: int = 1000
    ) -> list[MissedRun]:
        """Runs missed now (marked, still SCHEDULED in the stint they were missed in),
        oldest fire time first; only ``tenant_id``'s, or every tenant's when None."""

    @abstractmethod
    async def jobs_schedule_probe(
        self, *, after: uuid.UUID | None = None, limit: int = 1000
    ) -> tuple[list[ScheduleProbe], uuid.UUID | None]:
        """Active recurring jobs after ``after`` by id (up to ``limit``) and the jobs
        marked stalled, each with its latest scheduled run; and the id the sweep goes on
        after (None: it is through)."""

    @abstractmethod
    async def jobs_mark_stalled(
        self,
        *,
        stalled: Sequence[tuple[uuid.UUID, str]],
        resumed: Sequence[tuple[uuid.UUID, str]],
        actor: str | None = None,
        now: datetime | None = None,
    ) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
        """Mark jobs stalled (``job.schedule_stalled``) and clear stalled ones
        (``job.schedule_resumed``), each with its reason, each once. Returns the ids
        changed each way."""

    @abstractmethod
    async def jobs_stalled(
        self, tenant_id: uuid.UUID | None, *, limit: int = 1000
    ) -> list[StalledJob]:
        """Jobs whose schedule is marked stalled, longest-stalled first."""

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

    # -- capacity-aware release --------------------------------------------------------

    @abstractmethod
    async def runs_releasable(self, *, run_ids: Sequence[uuid.UUID]) -> list[Releasable]:
        """The runs of ``run_ids`` still SCHEDULED, each with its tenant, pool, priority
        and its tenant's weight (what the release of a burst orders by)."""

    @abstractmethod
    async def runs_ready_counts(
        self, *, pool: str, caps: Mapping[uuid.UUID, int]
    ) -> dict[uuid.UUID, int]:
        """The ready runs of each tenant of ``caps`` in ``pool``, counted up to its cap."""

    @abstractmethod
    async def pools_room(
        self,
        *,
        pools: Sequence[str],
        buffer: int,
        worker_ttl: float = 30.0,
        now: datetime | None = None,
    ) -> dict[str, int]:
        """How many more runs each pool's ready queue may take now: up to the larger of
        ``buffer`` and twice the slots of the pool's live workers, less the ready runs
        it holds (never below 0)."""
