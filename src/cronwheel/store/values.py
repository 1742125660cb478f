"""The values store calls take and give back, beside the domain's records: the items
of a worker's batches, a run filter, what a renewal or a bulk redrive did."""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cronwheel.domain.model import DueRun, LeasedAttempt, Run

__all__ = [
    "REDRIVE_BATCH_MAX",
    "SHARE_MIN",
    "Admitted",
    "BucketTake",
    "CompleteItem",
    "FailItem",
    "GateOpened",
    "GatedHeld",
    "Gates",
    "Grant",
    "HeartbeatItem",
    "JobDeleted",
    "LeaseRenewal",
    "LeaseShare",
    "LogChunk",
    "LogHead",
    "LogWrite",
    "Migrated",
    "ReadyQueue",
    "RedriveBatch",
    "Releasable",
    "RunFilter",
    "RunStats",
    "RunsOverview",
    "TenantDeleted",
    "UiSession",
]


@dataclass(frozen=True, slots=True)
class BucketTake:
    """What a shared token bucket gave: ``granted`` whole tokens (0 to the number
    asked for), and ``wait``, the seconds until it holds a token again (0: it does)."""

    granted: int
    wait: float


@dataclass(frozen=True, slots=True)
class LeaseRenewal:
    """What a scheduler node's renewal found: the live nodes, its fair share, the shards
    it holds (shard → epoch) and the earliest expiry of another node's lease."""

    live: int
    share: int
    held: dict[int, int]
    others_expire_at: datetime | None


@dataclass(frozen=True, slots=True)
class HeartbeatItem:
    attempt_id: uuid.UUID
    fencing_token: int
    # A progress report rides on the beat (see ``attempts_heartbeat_many``); ``details``
    # are its JSON (None: none). Ignored by releases.
    progress: bool = False
    details: Any = None


@dataclass(frozen=True, slots=True)
class CompleteItem:
    attempt_id: uuid.UUID
    fencing_token: int
    result: Any = None


@dataclass(frozen=True, slots=True)
class FailItem:
    attempt_id: uuid.UUID
    fencing_token: int
    error: str
    retryable: bool = True
    retry_after: float | None = None  # seconds: the retry fires no sooner (e.g. Retry-After)


@dataclass(frozen=True, slots=True)
class RunFilter:
    """What ``runs_list`` selects; every field given must hold (docs/history.md)."""

    job_id: uuid.UUID | None = None
    states: Sequence[str] | None = None
    since: datetime | None = None  # due_at >= since
    until: datetime | None = None  # due_at < until
    tags: Sequence[str] = ()  # each of them among the run's tags
    pool: str | None = None


# The most dead letters one bulk redrive sends back, and the most ids it may name.
REDRIVE_BATCH_MAX = 1000


@dataclass(frozen=True, slots=True)
class RedriveBatch:
    """What one ``runs_redrive_many`` did."""

    runs: list[Run]  # sent back, in id order
    # Each named id that was not sent back, with why: "not found" (the tenant has no
    # such run), "not a dead letter: <state>", "its job is cancelled", "over the limit".
    skipped: dict[uuid.UUID, str]
    more: bool  # dead letters matching the selection remain (the limit cut the batch)


@dataclass(frozen=True, slots=True)
class LogHead:
    """An attempt's log as an append finds it (under the attempt's lock): the bytes it
    takes, and the marker line that ends it once capped (None before)."""

    size: int
    marker: bytes | None


@dataclass(frozen=True, slots=True)
class LogWrite:
    """What an append adds to an attempt's log: ``lines`` at its end (may be empty),
    then ``marker`` (None: none) — appended when the log had none, else rewritten in
    place (a marker line keeps its length)."""

    lines: bytes
    marker: bytes | None


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Stored bytes of an attempt's log: ``data`` is ``[start, end)`` of it, whole
    lines."""

    attempt: int
    start: int
    end: int
    data: bytes


@dataclass(frozen=True, slots=True)
class JobDeleted:
    """What one ``jobs_delete`` removed."""

    id: uuid.UUID
    name: str
    at: datetime
    runs: int  # runs deleted, with their attempts and run events
    # Runs that were in progress (DISPATCHED or RUNNING) and ended by the deletion
    # (``force``), with their state then, in id order.
    stopped: list[tuple[uuid.UUID, str]]
    # Runs that had attempts: those whose worker logs go too.
    attempted: list[uuid.UUID]


@dataclass(frozen=True, slots=True)
class TenantDeleted:
    """What one ``tenants_delete`` removed."""

    id: uuid.UUID
    name: str
    at: datetime
    jobs: int
    runs: int
    stopped: list[tuple[uuid.UUID, str]]  # as in :class:`JobDeleted`
    api_keys: int
    workers: int


@dataclass(frozen=True, slots=True)
class Migrated:
    """What one ``migrate`` did: the revision before (None: an empty database) and
    after, and how many migrations ran (0: it was up to date)."""

    before: str | None
    after: str | None
    steps: int


@dataclass(frozen=True, slots=True)
class ReadyQueue:
    """What a driver read of a pool's ready queue for one worker: what admission
    (``store/sql/admission.py``) decides on."""

    now: datetime
    share: float | None  # the pool's own P0 share (None: the default)
    supply: dict[uuid.UUID, dict[int, int]]  # tenant -> class -> runs (up to the budget)
    limits: dict[uuid.UUID, dict[str, Any]]  # tenant -> its limits
    names: dict[uuid.UUID, str]  # tenant -> its name (for metrics)


@dataclass(frozen=True, slots=True)
class Grant:
    """Admission's answer for one tenant and class: lease up to ``count`` runs."""

    tenant_id: uuid.UUID
    priority: int
    count: int


@dataclass(frozen=True, slots=True)
class Admitted:
    """What a lease gave the worker, and what admission held back: the tenants a limit
    held (tenant id -> the limit) and, when a dispatch-rate bucket held one, the seconds
    until it holds a run's token again (None: no bucket held anyone)."""

    attempts: list[LeasedAttempt]
    held: dict[uuid.UUID, str]
    retry_in: float | None = None
    p0_reserved: int = 0  # the worker's slots only P0 runs may take


@dataclass(frozen=True, slots=True)
class GateOpened:
    """Gated reservations whose gates opened together: their tokens, the payload the
    opening gave each node (its upstream results in it), and when it opened."""

    fencing_tokens: list[int]
    payload: dict[str, Any]
    opened_at: datetime


@dataclass(frozen=True, slots=True)
class GatedHeld:
    """A gated reservation still held: its token, its node's run and workflow run."""

    reserved_token: int
    id: uuid.UUID
    workflow_run_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Gates:
    """What :meth:`attempts_gates` found of a worker's gated reservations: those whose
    gates opened, those gone, and those held (what a read again after a gate's notice
    may be given, to look at their gates alone)."""

    opened: list[GateOpened] = field(default_factory=list)
    gone: list[int] = field(default_factory=list)
    held: list[GatedHeld] = field(default_factory=list)


@dataclass(slots=True)
class LeaseShare:
    """Leases woken together by one notice, ``among`` of them, sharing what woke them:
    the batch of ready runs the first of them to read the queue found (``batch``, set
    by that read), split into as many equal parts as there are leases, or as it holds
    :data:`SHARE_MIN` runs if fewer (one at least: a batch too small to split is the
    first lease's whole): the batch is then leased by that many statements side by
    side, and begun by that many workers at once. A lease finding its part
    taken takes nothing (and waits on). A part is of the runs of every class: the slots
    a pool keeps for P0 come on top of it.

    When that first read found every run its worker could take (no more than its
    budget), the batch is all there is for workers that can take the same runs
    (``view``): once its parts are handed out, a further lease of that view takes no
    part (it would only find them locked) and waits on. What the cohort left of the
    batch (a lease of it went away, or could not take its part) is read again when the
    cohort ends: its last lease to end wakes the pool's waiting leases, if the cohort
    took runs and some may be left (:meth:`ended`). A cohort that took nothing (admission
    held every run back) does not wake itself again: its leases look again when their
    poll says (at a limit's pace)."""

    among: int
    batch: int | None = None
    view: Hashable = None  # what the first reader's worker can take
    whole: bool = False  # the first read found no more than its budget
    handed: int = 0  # parts handed to leases of the first reader's view
    leasing: int = 0  # leases of the cohort between :meth:`joined` and :meth:`ended`
    taken: int = 0  # runs the leases of the first reader's view took
    took_any: int = 0  # runs any lease of the cohort took

    def part(self, ready: int, *, budget: int, view: Hashable = None) -> int | None:
        """This lease's part, ``ready`` being what its read found — read up to one run
        past its ``budget``, to tell whether there was more (None: all it can take;
        0: none, the parts are all handed out)."""
        if self.batch is None:
            self.batch, self.view, self.whole = min(budget, ready), view, ready <= budget
        # A batch too small to split is one part: the first lease's whole.
        parts = max(1, min(self.among, self.batch // SHARE_MIN))
        if view == self.view:
            self.handed += 1
            if self.whole and self.handed > parts:
                return 0
        return None if parts == 1 else -(-self.batch // parts)

    def took(self, count: int, *, view: Hashable = None) -> None:
        """A lease of the cohort took ``count`` runs (committed)."""
        self.took_any += count
        if view == self.view:
            self.taken += count

    def joined(self) -> None:
        """A lease of the cohort begins."""
        self.leasing += 1

    def ended(self) -> bool:
        """A lease of the cohort ended: whether it was the last, the cohort took runs,
        and runs may be left — of the batch, or past it when the first read did not find
        them all (the pool's waiting leases should read again)."""
        self.leasing -= 1
        if self.leasing or self.batch is None or not self.took_any:
            return False
        return self.taken < self.batch or not self.whole


# The fewest runs a part of a shared batch holds (:class:`LeaseShare`): a batch is
# split into at most as many parts as it holds this many runs. Leases side by side
# touch the same pages: on two cores, a 1,000-run batch leased by two statements of
# 500 took 35-42 ms, by one 44-47 ms, by four of 250 48-56 ms.
SHARE_MIN = 500


@dataclass(frozen=True, slots=True)
class Releasable:
    """A due run of a burst, described for capacity-aware release
    (``scheduler/release.py``): still SCHEDULED when read."""

    run: DueRun
    tenant_id: uuid.UUID
    pool: str
    priority: int
    weight: float
    # The most of its tenant's runs worth holding ready in a pool, when a limit bounds
    # how fast they can be leased (None: no limit): more would only fill the ready queue
    # with runs no worker may take, and crowd out other tenants' release.
    ready_cap: int | None = None


@dataclass(frozen=True, slots=True)
class RunStats:
    """The runs due in one stretch of time (a minute, or a whole window): how many are
    in each state now (every state named, zeros included), and the 50th and 99th
    percentiles of their lateness in milliseconds (None: no run to measure).

    Dispatch lateness: ``dispatched_at - fire_at`` of the runs dispatched (not back in
    SCHEDULED); start lateness: ``started_at - fire_at`` of the runs started on their
    first try (a retry's ``fire_at`` lies after its backoff). Both are never below 0: a
    run dispatched or started ahead of its instant (a reservation) counts as on time.
    Percentiles interpolate between the two nearest values (``percentile_cont``)."""

    at: datetime  # where the stretch begins
    states: dict[str, int]
    dispatch_p50_ms: float | None
    dispatch_p99_ms: float | None
    start_p50_ms: float | None
    start_p99_ms: float | None


@dataclass(frozen=True, slots=True)
class RunsOverview:
    """The runs due in ``[since, until)``: by minute from ``since`` (every minute of
    the window, empty ones included; the last may be cut short at ``until``) and over
    the whole window (``total``)."""

    since: datetime
    until: datetime
    minutes: list[RunStats]
    total: RunStats


@dataclass(frozen=True, slots=True)
class UiSession:
    """A dashboard session as stored: the hash of its token, the hash of the API key it
    signed in with, the tenant it looks at (None: the admin key chose none yet)."""

    token_hash: str
    key_hash: str
    tenant_id: uuid.UUID | None
    created_at: datetime
    last_seen_at: datetime
    expires_at: datetime
