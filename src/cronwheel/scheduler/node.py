"""A scheduler node: owns shards by lease, keeps their due window in memory, fires due
runs in batches, and ends attempts whose lease or deadline passed.

::

    start ──▶ measure clock offset ──▶ acquire shard leases ──┐
                                                              ▼
          ┌──────────────────────────── run_once() ◀─── wake: timer | notification | stop
          │  renew leases (every ttl/3) — lost shards leave the window
          │  expire attempts (every expire_interval); retention of the audit trail
          │  and of finished bulk operations (hourly)
          │  check routing (every route_check_interval): dispatched runs that no
          │  live worker can take get the reason recorded
          │  look for missed runs of our shards and, on shard 0's owner, stalled
          │  schedules (every missed_check_interval; docs/alerts.md)
          │  refill the window when its horizon comes near; poll for stragglers
          │  fire what is due: one conditional UPDATE per batch
          └──────────────────────────────▶ sleep until the next due run or chore
    stop ──▶ release shard leases (a successor takes over at once)

Every write that fires a run is conditioned, in SQL, on this node holding an unexpired
lease on the run's shard, so a node that lost its lease (paused, partitioned) fires
nothing even if its memory still says it should. Time is the database's: the node
measures its offset from the database clock and fires by corrected time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from cronwheel.clock import Clock
from cronwheel.domain.errors import StoreUnavailableError, describe_error
from cronwheel.domain.model import DueRun, FiredRun, MissedRun, ScheduleProbe
from cronwheel.domain.sharding import NUM_SHARDS
from cronwheel.metrics import (
    CLOCK_OFFSET,
    CLOCK_UNCERTAINTY,
    RUNS_MISSED,
    RUNS_QUARANTINED,
    SCHEDULES_STALLED,
    SHARDS_HELD,
    TENANT_NAMES,
    observe_dispatch_lateness,
)
from cronwheel.scheduler.isolation import QuarantineBudget, isolate
from cronwheel.scheduler.missed import stall_reason
from cronwheel.scheduler.release import Backlog
from cronwheel.scheduler.window import DueWindow
from cronwheel.settings import Settings
from cronwheel.store.base import Store, Subscription
from cronwheel.store.notices import CHANNEL_RUNS_NEW, parse_announcement

__all__ = ["QUARANTINE_PER_PASS", "Clock", "SchedulerNode", "default_node_id"]  # Clock: re-exported

log = logging.getLogger("cronwheel.scheduler")

# How often the node that owns shard 0 removes audit records and finished bulk
# operations past their retention.
_RETENTION_EVERY = timedelta(hours=1)
# A release pass that found every ready queue full waits this many release intervals.
_FULL_PAUSE = 5
# A pass that dispatches a burst ahead takes with it the bursts due up to this share of
# the lead later: runs due one by one (each its own burst, with ``dispatch_lead_burst``
# 1, the default) go a few hundred at a time, not each in a pass of its own.
_LEAD_GATHER = 0.2

# The most poison rows one pass quarantines: a bug that failed every row alike would
# otherwise dead-letter them all (see ``isolation.py``).
QUARANTINE_PER_PASS = 32
# Batches of missed runs one check marks at most (the rest: at the next check).
_MISSED_BATCHES = 5
# Runs the missed-run check failed on alone, left out of later checks (at most this
# many remembered: a row the check fails on must not cost every check a split).
_MISSED_SKIP_MAX = 1000


def default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class SchedulerNode:
    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        node_id: str | None = None,
        clock: Clock | None = None,
        poll_interval: float = 1.0,
        fire_concurrency: int = 2,
    ) -> None:
        self.store = store
        self.settings = settings
        self.node_id = node_id or settings.node_id or default_node_id()
        self.clock = clock or Clock()
        self.window = DueWindow(burst=settings.dispatch_lead_burst)
        self.backlog = Backlog()  # a burst's runs waiting for room in their pools
        self.shards: dict[int, int] = {}  # shard -> epoch
        self.poll_interval = poll_interval
        self.fire_concurrency = fire_concurrency
        self.fired_total = 0
        self._window = timedelta(seconds=settings.window_seconds)
        self._lead = timedelta(seconds=settings.dispatch_lead)
        self._next_lease = datetime.min.replace(tzinfo=UTC)
        self._next_expire = datetime.min.replace(tzinfo=UTC)
        self._next_route_check = datetime.min.replace(tzinfo=UTC)
        self._next_retention = datetime.min.replace(tzinfo=UTC)
        self._next_missed_check = datetime.min.replace(tzinfo=UTC)
        self._stall_after: uuid.UUID | None = None  # where the stalled-schedule sweep is
        self._missed_skip: set[uuid.UUID] = set()
        # Retention runs beside the passes: a long trail must not hold up firing.
        self._retention: asyncio.Task[None] | None = None
        self._next_poll = datetime.min.replace(tzinfo=UTC)
        self._next_clock = datetime.min.replace(tzinfo=UTC)
        self._next_release: datetime | None = None
        self._poll_after: DueRun | None = None  # where the next poll goes on
        self.refill_limit = 20_000  # runs one refill reads at most
        self.poll_limit = 5_000  # runs one poll reads at most
        self._clock_trusted = True
        self._subscription: Subscription | None = None
        self._pass_budget = QuarantineBudget(QUARANTINE_PER_PASS)

    # -- the loop ------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then give the shards back."""
        self._subscription = self.store.subscribe(CHANNEL_RUNS_NEW)
        stopping = asyncio.ensure_future(stop.wait())
        log.info("scheduler started", extra={"event": "scheduler_started", "node": self.node_id})
        try:
            while not stop.is_set():
                try:
                    await self.run_once()
                except Exception:
                    log.exception("scheduler pass failed", extra={"event": "scheduler_error"})
                    await asyncio.wait({stopping}, timeout=1.0)
                    continue
                waiting = asyncio.ensure_future(self._subscription.wait(self._sleep_for()))
                await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if waiting.done():
                    self._absorb(waiting.result())
                else:
                    waiting.cancel()
        finally:
            stopping.cancel()
            self._subscription.close()
            if self._retention is not None:
                self._retention.cancel()
            await self._release()

    async def run_once(self) -> int:
        """One pass: chores that are due, then fire every due run. Returns runs fired."""
        self._pass_budget = QuarantineBudget(QUARANTINE_PER_PASS)
        now = self.clock.now()
        if now >= self._next_clock:
            await self._check_clock()
            now = self.clock.now()
        if not self._clock_trusted:
            return 0
        if now >= self._next_lease:
            await self._renew_leases()
        if not self.shards:
            return 0
        if now >= self._next_expire:
            # Ending lost and timed-out attempts is one node's chore: shard 0's owner.
            if 0 in self.shards:
                await self._expire()
            self._next_expire = now + timedelta(seconds=self.settings.expire_interval)
        if now >= self._next_route_check:
            self._next_route_check = now + timedelta(seconds=self.settings.route_check_interval)
            await self._check_routing()
        if now >= self._next_missed_check:
            self._next_missed_check = now + timedelta(seconds=self.settings.missed_check_interval)
            await self._check_missed()
        if now >= self._next_retention:
            self._next_retention = now + _RETENTION_EVERY
            # One node's chore, as expiry is; never two at once.
            if 0 in self.shards and (self._retention is None or self._retention.done()):
                self._retention = asyncio.create_task(
                    self._apply_retention(), name="cronwheel-retention"
                )
        now = self.clock.now()
        horizon = self.window.horizon
        if horizon is None or now + self._lead + self._window / 2 >= horizon:
            await self._refill(now)
        elif now >= self._next_poll:
            await self._poll(now)
        return await self._fire_due()

    def _sleep_for(self) -> float:
        now = self.clock.now()
        wake = [
            self._next_lease,
            self._next_expire,
            self._next_poll,
            self._next_route_check,
            self._next_missed_check,
            self._next_clock,
        ]
        if self.window.horizon is not None:
            wake.append(self.window.horizon - self._window / 2 - self._lead)
        nxt = self.window.next_fire_at(self._lead)
        if nxt is not None:
            wake.append(nxt)
        if self.backlog and self._next_release is not None:
            wake.append(self._next_release)
        return max(0.0, min(w - now for w in wake).total_seconds())

    # -- chores --------------------------------------------------------------------

    async def _check_clock(self) -> None:
        """Measure the offset from the database clock. A node that cannot trust its time
        within ``max_clock_uncertainty`` gives its shards back (another node fires them
        on time) and measures every second until two readings agree again."""
        await self.clock.measure(self.store)
        CLOCK_OFFSET.set(self.clock.offset.total_seconds())
        uncertainty = self.clock.uncertainty
        CLOCK_UNCERTAINTY.set(uncertainty.total_seconds())
        bound = timedelta(seconds=self.settings.max_clock_uncertainty)
        trusted = uncertainty <= bound
        if trusted != self._clock_trusted:
            extra = {
                "node": self.node_id,
                "offset": self.clock.offset.total_seconds(),
                "uncertainty": uncertainty.total_seconds(),
                "bound": bound.total_seconds(),
            }
            if trusted:
                log.info("clock trusted again", extra={"event": "clock_trusted", **extra})
                self._next_lease = datetime.min.replace(tzinfo=UTC)
            else:
                log.warning(
                    "clock uncertainty over the bound: giving up shards",
                    extra={"event": "clock_untrusted", **extra},
                )
                await self._release()
                self.window.drop_shards(set(range(NUM_SHARDS)))
                self.backlog.drop_shards(set(range(NUM_SHARDS)))
                self.window.horizon = None
        self._clock_trusted = trusted
        interval = self.settings.clock_check_interval if trusted else 1.0
        self._next_clock = self.clock.now() + timedelta(seconds=interval)

    async def _renew_leases(self) -> None:
        """Beat, renew, and keep this node's fair share: ceil(shards / live nodes). Expired
        leases are taken over whatever the share; shards above it are handed back for a
        node that has fewer."""
        ttl = self.settings.shard_lease_ttl
        now = self.clock.store_now()
        renewal = await self.store.scheduler_renew(
            node_id=self.node_id, ttl=ttl, shards=NUM_SHARDS, now=now
        )
        held, share = dict(renewal.held), renewal.share
        if len(held) > share:
            extra = sorted(held)[share:]
            await self.store.shard_leases_release(node_id=self.node_id, shards=extra)
            for shard in extra:
                del held[shard]
        lost = set(self.shards) - set(held)
        gained = set(held) - set(self.shards)
        if lost:
            self.window.drop_shards(lost)
            self.backlog.drop_shards(lost)
            log.warning("shard leases lost", extra={"event": "shards_lost", "count": len(lost)})
        if gained:
            # New shards: their due runs are not in the window yet.
            self.window.horizon = None
            log.info("shard leases gained", extra={"event": "shards_gained", "count": len(gained)})
        self.shards = held
        SHARDS_HELD.set(len(held))
        self._next_lease = self.clock.now() + timedelta(seconds=ttl / 3)
        # A node that dies stops renewing: be there the moment its leases run out, not
        # up to a third of the TTL later.
        others = renewal.others_expire_at
        if others is not None and others <= self._next_lease:
            self._next_lease = others + timedelta(milliseconds=1)

    async def _expire(self) -> None:
        limit = 1000
        while True:
            now = self.clock.store_now()
            try:
                ended = await self.store.attempts_expire(now=now, limit=limit)
            except StoreUnavailableError:
                raise
            except Exception:
                # One attempt's run fails the sweep: find it, quarantine it, end the rest.
                ended = await self._expire_isolating(now, limit)
            if ended < limit:
                return

    async def _expire_isolating(self, now: datetime | None, limit: int) -> int:
        candidates = await self.store.attempts_expire_candidates(now=now, limit=limit)

        async def expire(batch: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> list[int]:
            ids = [attempt_id for attempt_id, _ in batch]
            return [await self.store.attempts_expire(now=now, attempt_ids=ids)]

        async def quarantine(item: tuple[uuid.UUID, uuid.UUID], exc: Exception) -> None:
            await self._quarantine("expire", [item[1]], exc)

        return sum(await isolate(candidates, expire, quarantine, budget=self._pass_budget))

    async def chores_done(self) -> None:
        """Wait for the chores running beside the passes (retention) to end."""
        if self._retention is not None:
            await asyncio.wait({self._retention})

    async def _apply_retention(self) -> None:
        """The audit trail's retention, then the finished bulk operations': each
        failure is logged and tried again in an hour, neither stops the other, and
        neither ever holds up firing."""
        for kept, expire, days in (
            ("audit", self.store.audit_expire, self.settings.audit_retention_days),
            ("operations", self.store.operations_expire, self.settings.operation_retention_days),
        ):
            try:
                removed = await expire(retention_days=days, now=self.clock.store_now())
            except Exception:
                log.warning(
                    "retention failed",
                    exc_info=True,
                    extra={"event": f"{kept}_expire_failed", "table": kept},
                )
                continue
            if removed:
                log.info(
                    "retention removed rows",
                    extra={"event": f"{kept}_expired", "table": kept, "count": removed},
                )

    async def _check_routing(self) -> None:
        """Record why dispatched runs of our shards wait when no live worker can take
        them (cleared once one can): a few set-based statements, never one per run.
        Only a diagnosis: a failure is logged and never holds up firing."""
        try:
            check = await self.store.runs_route_check(
                shards=list(self.shards),
                min_wait=self.settings.route_wait,
                worker_ttl=self.settings.worker_ttl,
                now=self.clock.store_now(),
            )
        except Exception:
            log.warning(
                "routing check failed", exc_info=True, extra={"event": "route_check_failed"}
            )
            return
        if check.marked or check.cleared:
            log.info(
                "routing checked",
                extra={
                    "event": "runs_unroutable",
                    "waiting": check.waiting,
                    "marked": check.marked,
                    "cleared": check.cleared,
                },
            )

    async def _check_missed(self) -> None:
        """Mark the missed runs of our shards (``run.missed``) and, on shard 0's owner,
        mark and clear stalled schedules. Only a diagnosis: a failure is logged and
        never holds up firing; a row the check fails on alone is left out of it."""
        try:
            await self._mark_missed()
            if 0 in self.shards:
                await self._check_schedules()
        except Exception:
            log.warning(
                "missed-run check failed", exc_info=True, extra={"event": "missed_check_failed"}
            )

    async def _mark_missed(self) -> None:
        limit = self.settings.missed_batch
        shards = list(self.shards)
        for _ in range(_MISSED_BATCHES):
            now = self.clock.store_now()
            if self._missed_skip:
                marked = await self._mark_missed_isolating(shards, now, limit)
            else:
                try:
                    missed = await self.store.runs_mark_missed(
                        shards=shards, actor=self.node_id, now=now, limit=limit
                    )
                except StoreUnavailableError:
                    raise
                except Exception:
                    marked = await self._mark_missed_isolating(shards, now, limit)
                else:
                    self._count_missed(missed)
                    marked = len(missed)
            if marked < limit:
                return

    async def _mark_missed_isolating(
        self, shards: list[int], now: datetime | None, limit: int
    ) -> int:
        found = await self.store.runs_missed_candidates(
            shards=shards, now=now, limit=limit + len(self._missed_skip)
        )
        candidates = [i for i in found if i not in self._missed_skip][:limit]

        async def mark(batch: Sequence[uuid.UUID]) -> list[int]:
            missed = await self.store.runs_mark_missed(
                shards=shards, run_ids=batch, actor=self.node_id, now=now, limit=limit
            )
            self._count_missed(missed)
            return [len(missed)]

        async def leave_out(run_id: uuid.UUID, exc: Exception) -> None:
            if len(self._missed_skip) < _MISSED_SKIP_MAX:
                self._missed_skip.add(run_id)
            log.error(
                "missed-run check failed on one run: left out of the check",
                extra={"event": "missed_check_row_failed", "run": str(run_id), "error": repr(exc)},
            )

        budget = QuarantineBudget(_MISSED_SKIP_MAX)
        return sum(await isolate(candidates, mark, leave_out, budget=budget))

    def _count_missed(self, missed: Sequence[MissedRun]) -> None:
        for run in missed:
            RUNS_MISSED.labels(tenant=run.tenant_name).inc()
        if missed:
            log.warning(
                "runs missed: not dispatched within their lateness budget",
                extra={"event": "runs_missed", "count": len(missed)},
            )

    async def _check_schedules(self) -> None:
        """One batch of the stalled-schedule sweep, and every job marked stalled."""
        probes, self._stall_after = await self.store.jobs_schedule_probe(
            after=self._stall_after, limit=self.settings.missed_batch
        )
        now = self.clock.store_now()
        changes: list[tuple[uuid.UUID, str, bool]] = []  # job, why, stalled
        for probe in probes:
            try:
                why = stall_reason(probe, self.clock.now())
            except Exception as exc:
                # The job's own schedule: this job alone is left as it is.
                log.error(
                    "stalled-schedule check failed on one job",
                    extra={
                        "event": "stall_check_row_failed",
                        "job": str(probe.job_id),
                        "error": repr(exc),
                    },
                )
                continue
            if why is not None and probe.stalled_at is None:
                changes.append((probe.job_id, why, True))
            elif why is None and probe.stalled_at is not None:
                changes.append((probe.job_id, _resumed(probe), False))

        async def apply(batch: Sequence[tuple[uuid.UUID, str, bool]]) -> list[int]:
            stalled, _resumed_ids = await self.store.jobs_mark_stalled(
                stalled=[(j, w) for j, w, s in batch if s],
                resumed=[(j, w) for j, w, s in batch if not s],
                actor=self.node_id,
                now=now,
            )
            return [len(stalled)]

        async def leave(item: tuple[uuid.UUID, str, bool], exc: Exception) -> None:
            log.error(
                "stalled-schedule check failed on one job: left as it is",
                extra={"event": "stall_check_row_failed", "job": str(item[0]), "error": repr(exc)},
            )

        newly = sum(await isolate(changes, apply, leave, budget=QuarantineBudget(len(changes))))
        if newly:
            SCHEDULES_STALLED.inc(newly)
            log.warning(
                "schedules stalled: no run to fire their next occurrence",
                extra={"event": "schedules_stalled", "count": newly},
            )

    async def _refill(self, now: datetime) -> None:
        limit = self.refill_limit
        until = now + self._lead + self._window
        # What the window already holds stays there (runs created inside it arrive by
        # notification, stragglers by the poll): only the slice beyond it is read.
        since = self.window.horizon
        due = await self.store.runs_due_scan(
            shards=list(self.shards),
            until=until,
            limit=limit,
            since=since,
            after_id=self.window.horizon_id if since is not None else None,
        )
        self.window.push(due)
        # A truncated scan covers only up to its last row (by instant, then id); refill
        # again from there — inside the same instant, if a burst is larger than a scan.
        truncated = len(due) >= limit
        self.window.horizon = due[-1].fire_at if truncated else until
        self.window.horizon_id = due[-1].id if truncated else None
        self._next_poll = now + timedelta(seconds=self.poll_interval)

    async def _poll(self, now: datetime) -> None:
        """Catch runs whose notification never came (another process on SQLite, a dropped
        LISTEN connection): everything due within the next poll interval. (Not within
        the dispatch lead as well: that would re-read every run due in the next few
        seconds, each poll, for the rare straggler of a burst, which then goes at its
        instant rather than ahead.)"""
        until = now + timedelta(seconds=self.poll_interval)
        # Page by page across polls: runs held back in the backlog are still SCHEDULED,
        # and a poll that always read the first page would only ever see them.
        after = self._poll_after
        due = await self.store.runs_due_scan(
            shards=list(self.shards),
            until=until,
            limit=self.poll_limit,
            since=None if after is None else after.fire_at,
            after_id=None if after is None else after.id,
        )
        self._poll_after = due[-1] if len(due) >= self.poll_limit else None
        self.window.push(due)
        self._next_poll = now + timedelta(seconds=self.poll_interval)

    def _absorb(self, payloads: list[str]) -> None:
        """Notifications of runs created or retried: add those inside our window."""
        horizon = self.window.horizon
        if horizon is None:
            return
        fresh: list[DueRun] = []
        for payload in payloads:
            try:
                run = parse_announcement(payload)
            except ValueError:
                self._next_poll = self.clock.now()  # unreadable: poll instead
                continue
            if run.shard in self.shards and run.fire_at < horizon:
                fresh.append(run)
        self.window.push(fresh)

    # -- firing --------------------------------------------------------------------

    async def _fire_due(self) -> int:
        gather = self._lead * _LEAD_GATHER
        due = self.window.pop_due(self.clock.now(), self._lead, gather)
        if len(due) >= self.settings.dispatch_lead_burst or self.backlog:
            due = await self._pace(due)
        if not due:
            return 0
        size = self.settings.fire_batch_size
        batches = [due[i : i + size] for i in range(0, len(due), size)]
        gate = asyncio.Semaphore(self.fire_concurrency)

        async def fire_some(batch: Sequence[DueRun]) -> list[FiredRun]:
            return await self.store.runs_fire(
                run_ids=[r.id for r in batch],
                node_id=self.node_id,
                now=self.clock.store_now(),
                # What the pass popped ahead: the lead and the bursts it gathered.
                lead=(self._lead + gather).total_seconds(),
                epochs=dict(self.shards),
            )

        async def quarantine(run: DueRun, exc: Exception) -> None:
            await self._quarantine("fire", [run.id], exc)

        async def fire(batch: list[DueRun]) -> int:
            async with gate:
                fired = await isolate(batch, fire_some, quarantine, budget=self._pass_budget)
            if fired:
                names = await TENANT_NAMES.names(
                    {r.tenant_id for r in fired}, self.store.tenant_names
                )
                for run in fired:
                    observe_dispatch_lateness(
                        fire_at=run.fire_at,
                        dispatched_at=run.dispatched_at,
                        tenant=names[run.tenant_id],
                        priority=run.priority,
                    )
            if len(fired) < len(batch):
                # Runs the store would not fire ahead (their jobs guard against overlap)
                # go at their instant. (Others not fired — cancelled, paused — are
                # simply not fired then either.)
                done = {r.id for r in fired}
                now = self.clock.now()
                self.window.push(
                    (r for r in batch if r.id not in done and r.fire_at > now), at_instant=True
                )
            return len(fired)

        counts = await asyncio.gather(*(fire(b) for b in batches))
        total = sum(counts)
        self.fired_total += total
        return total

    async def _pace(self, due: list[DueRun]) -> list[DueRun]:
        """A burst, or runs due while one waits: what the pools have room for now, P0
        first, then tenants by weight; the rest waits in the backlog (``release.py``)."""
        fresh = [r.id for r in due if r.id not in self.backlog]
        if fresh:
            self.backlog.add(await self.store.runs_releasable(run_ids=fresh))
        pools = self.backlog.pools()
        room = await self.store.pools_room(
            pools=pools,
            buffer=self.settings.dispatch_buffer,
            worker_ttl=self.settings.worker_ttl,
            now=self.clock.store_now(),
        )
        released: list[DueRun] = []
        for pool in pools:
            if room[pool] <= 0:
                continue
            # Runs of a tenant a limit holds back are released only as far as it can
            # take them: held runs waiting in the ready queue would crowd out the rest.
            limited = self.backlog.limited(pool)
            ready = await self.store.runs_ready_counts(pool=pool, caps=limited)
            released += self.backlog.take(pool, room[pool], ready)
        # Every ready queue full: it holds at least two rounds of its pool's work, so
        # looking again a few intervals later loses nothing and saves the counting —
        # unless a P0 run waits for room.
        full = not released and not self.backlog.waiting_class(0)
        pause = self.settings.release_interval * (_FULL_PAUSE if full else 1)
        self._next_release = self.clock.now() + timedelta(seconds=pause) if self.backlog else None
        return released

    async def _quarantine(self, step: str, run_ids: list[uuid.UUID], exc: Exception) -> None:
        """Take runs a step failed on alone out of the pass (``isolation.py``)."""
        error = describe_error(exc)
        done = await self.store.runs_quarantine(
            run_ids=run_ids, step=step, error=error, actor=self.node_id, now=self.clock.store_now()
        )
        RUNS_QUARANTINED.labels(step=step).inc(len(done))
        log.error(
            "run quarantined: a step of the pass failed on it alone",
            extra={
                "event": "run_quarantined",
                "step": step,
                "runs": [str(i) for i in done],
                "error": error,
            },
        )

    async def _release(self) -> None:
        with contextlib.suppress(Exception):
            await self.store.scheduler_nodes_leave(node_id=self.node_id)
        if not self.shards:
            return
        with contextlib.suppress(Exception):
            await self.store.shard_leases_release(node_id=self.node_id, shards=list(self.shards))
        log.info(
            "shard leases released", extra={"event": "shards_released", "count": len(self.shards)}
        )
        self.shards = {}
        SHARDS_HELD.set(0)


def _resumed(probe: ScheduleProbe) -> str:
    if probe.state != "active":
        return f"the job is {probe.state}"
    return "the schedule has a run to fire again"
