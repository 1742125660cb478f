"""Admission's state in the database, for both drivers: what a lease reads before it
decides (tenant limits, runs each capped tenant holds, fair-share passes, rate
buckets) and what it writes after (passes, buckets). The rules are in
``domain/admission.py``; each driver reads its ready queue and takes the runs granted.

A lease that finds one tenant waiting, without limits, reads and writes nothing here:
the common case costs no round trip. Otherwise, on PostgreSQL, the lease first takes
transaction-scoped advisory locks — one per contended (pool, class) and one per
limited tenant, in one order — so two leases never decide on the same state at once,
however many API nodes serve the workers; the state is then read by a statement that
starts after the locks are held, so it sees every lease committed before. (SQLite
serialises writers: no lock is needed.)
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.admission import (
    LIMIT_CONCURRENCY,
    LIMIT_RATE,
    Allocation,
    FairState,
    TenantQueue,
    allocate,
    reserved_slots,
)
from cronwheel.domain.bucket import TokenBucket
from cronwheel.domain.model import DueRun, Worker
from cronwheel.domain.states import RunState
from cronwheel.domain.workflow import WORKFLOW_POOL
from cronwheel.store.driver import Driver
from cronwheel.store.schema import (
    READY,
    fair_clocks,
    fair_shares,
    rate_buckets,
    runs,
    tenants,
    workers,
)
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.sql.statements import workers_live
from cronwheel.store.values import Grant, LeaseShare, ReadyQueue, Releasable

__all__ = [
    "AdmissionMixin",
    "LeasePlan",
    "dispatch_bucket",
    "gated_grants",
    "lock_key",
    "plan_lease",
    "settle_lease",
]


def lock_key(name: str) -> int:
    """A stable 64-bit advisory-lock key for ``name`` (the same on every node)."""
    return int.from_bytes(
        hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True
    )


def dispatch_bucket(tenant_id: uuid.UUID) -> str:
    return f"dispatch:{tenant_id}"


def _ready_cap(limits: Mapping[str, Any]) -> int | None:
    """How many of a limited tenant's runs are worth holding ready in a pool: what its
    concurrency limit lets run at once, or two seconds of its dispatch rate (at least
    its burst), whichever is fewer."""
    caps: list[int] = []
    if limits.get("max_concurrent_runs"):
        caps.append(int(limits["max_concurrent_runs"]))
    bucket = _rate_of(limits)
    if bucket is not None:
        caps.append(max(1, int(bucket.burst), min(1_000_000, int(2 * bucket.rate))))
    return min(caps) if caps else None


def _rate_of(limits: Mapping[str, Any]) -> TokenBucket | None:
    rate = limits.get("max_dispatch_rate")
    if rate is None:
        return None
    burst = limits.get("dispatch_burst") or max(1, int(rate))
    return TokenBucket(rate=float(rate), burst=float(burst))


@dataclass(slots=True)
class LeasePlan:
    now: datetime
    grants: list[Grant]
    allocation: Allocation
    reserve: int
    buckets: dict[uuid.UUID, tuple[TokenBucket, float]] = field(default_factory=dict)

    @property
    def held(self) -> dict[uuid.UUID, str]:
        return self.allocation.held

    def retry_in(self, got: Mapping[tuple[uuid.UUID, int], int]) -> float | None:
        """Seconds until the soonest bucket that held a tenant back holds a token."""
        waits = [
            bucket.wait(level - sum(n for (t, _), n in got.items() if t == tenant_id))
            for tenant_id, (bucket, level) in self.buckets.items()
            if self.allocation.held.get(tenant_id) == LIMIT_RATE
        ]
        return min(waits) if waits else None


async def plan_lease(
    driver: Driver,
    conn: AsyncConnection,
    *,
    worker: Worker,
    budget: int,
    queue: ReadyQueue,
    default_share: float,
    cohort: LeaseShare | None = None,
    view: Hashable = None,
) -> LeasePlan:
    """Decide what the worker is given of ``queue``: lock and read the state the
    decision needs (none in the common case), then apply the rules. ``cohort``: the
    lease is one of several woken together, and takes at most its part of the batch
    (:class:`LeaseShare`; ``view``, what its worker can take, and ``queue`` read up to
    one run past ``budget``) — of the runs of every class: the slots kept for P0 are
    the worker's, on top of it."""
    share = default_share if queue.share is None else queue.share
    kept = reserved_slots(worker.capacity, share)
    if cohort is not None:
        ready = sum(n for classes in queue.supply.values() for n in classes.values())
        part = cohort.part(ready, budget=budget, view=view)
        queue = _within(queue, budget)
        if part is not None:
            budget = min(budget, part + kept)
    reserve = min(kept, budget)
    capped = sorted(t for t in queue.supply if queue.limits[t].get("max_concurrent_runs"))
    rated = sorted(t for t in queue.supply if _rate_of(queue.limits[t]) is not None)
    by_class: dict[int, int] = {}
    for classes in queue.supply.values():
        for cls in classes:
            by_class[cls] = by_class.get(cls, 0) + 1
    contended = sorted(cls for cls, n in by_class.items() if n > 1)
    fair = FairState()
    room: dict[uuid.UUID, int] = {}
    levels: dict[uuid.UUID, tuple[TokenBucket, float]] = {}
    if contended or capped or rated:
        keys = [lock_key(f"fair:{worker.pool}:{cls}") for cls in contended]
        keys += [lock_key(f"tenant:{t}") for t in {*capped, *rated}]
        await driver.lock_keys(conn, sorted(set(keys)))
        fair = await _fair_state(conn, worker.pool, contended, list(queue.supply))
        held = await _holding(driver, conn, capped)
        for t in capped:
            room[t] = max(0, int(queue.limits[t]["max_concurrent_runs"]) - held.get(t, 0))
        stored = await _buckets(driver, conn, [dispatch_bucket(t) for t in rated])
        for t in rated:
            bucket = _rate_of(queue.limits[t])
            assert bucket is not None
            tokens, stamp = stored.get(dispatch_bucket(t), (None, None))
            levels[t] = (bucket, bucket.level(tokens, stamp, queue.now))
    allocation = allocate(
        [
            TenantQueue(
                tenant_id=t,
                supply=classes,
                weight=float(queue.limits[t].get("weight") or 1.0),
                room=room.get(t),
                tokens=levels[t][0].grant(levels[t][1], budget) if t in levels else None,
            )
            for t, classes in queue.supply.items()
        ],
        budget=budget,
        reserve=reserve,
        fair=fair,
    )
    grants = [Grant(t, cls, n) for (t, cls), n in sorted(allocation.grants.items()) if n > 0]
    return LeasePlan(queue.now, grants, allocation, kept, levels)


def gated_grants(queue: ReadyQueue, budget: int) -> list[Grant]:
    """What a gated lease (``docs/reservations.md``) is given of the gated queue: up to
    ``budget`` nodes, the highest class first, the tenants of a class sharing evenly.
    A tenant under a concurrency or dispatch-rate limit gets none: a node reserved
    ahead of its gate begins when the gate opens, with no lease then to hold it back,
    and a held reservation would count against its limit while its upstream nodes run
    (its nodes are leased once ready, under the limits, as before). Nothing is drawn
    from fair shares or rate buckets: a reservation may lapse and be taken again many
    times before its node runs."""
    free = {
        t: dict(classes)
        for t, classes in queue.supply.items()
        if not queue.limits[t].get("max_concurrent_runs") and _rate_of(queue.limits[t]) is None
    }
    grants: dict[tuple[uuid.UUID, int], int] = {}
    for cls in sorted({c for classes in free.values() for c in classes}):
        wanting = {t: classes[cls] for t, classes in free.items() if classes.get(cls)}
        while budget > 0 and wanting:
            part = max(1, budget // len(wanting))
            # From a tenant drawn at random: with less budget than tenants, not always
            # the same ones first.
            order = sorted(wanting)
            first = random.randrange(len(order))
            for t in order[first:] + order[:first]:
                n = min(part, wanting[t], budget)
                grants[(t, cls)] = grants.get((t, cls), 0) + n
                wanting[t] -= n
                budget -= n
                if budget == 0:
                    break
            wanting = {t: n for t, n in wanting.items() if n > 0}
    return [Grant(t, cls, n) for (t, cls), n in sorted(grants.items())]


def _within(queue: ReadyQueue, budget: int) -> ReadyQueue:
    """``queue`` with each tenant's runs cut back to ``budget``, from its last class (a
    cohort's read goes one run past the budget, only to tell whether there was more)."""
    supply: dict[uuid.UUID, dict[int, int]] = {}
    for tenant_id, classes in queue.supply.items():
        over = sum(classes.values()) - budget
        kept = dict(classes)
        for cls in sorted(kept, reverse=True):
            if over <= 0:
                break
            cut = min(over, kept[cls])
            kept[cls] -= cut
            over -= cut
        supply[tenant_id] = {cls: n for cls, n in kept.items() if n}
    return replace(queue, supply=supply)


async def settle_lease(
    driver: Driver,
    conn: AsyncConnection,
    plan: LeasePlan,
    *,
    pool: str,
    got: Mapping[tuple[uuid.UUID, int], int],
) -> None:
    """Write back what the lease took: the passes and virtual times of the contended
    classes (less what was granted and not taken) and the rate buckets drawn on."""
    alloc = plan.allocation
    alloc.settle(got)
    if alloc.fair.passes:
        await conn.execute(
            driver.upsert(
                fair_shares,
                [
                    {"pool": pool, "priority": cls, "tenant_id": t, "pass": p}
                    for (cls, t), p in sorted(alloc.fair.passes.items())
                ],
                ["pass"],
            )
        )
    if alloc.fair.clocks:
        await conn.execute(
            driver.upsert(
                fair_clocks,
                [
                    {"pool": pool, "priority": cls, "vtime": v}
                    for cls, v in sorted(alloc.fair.clocks.items())
                ],
                ["vtime"],
            )
        )
    if plan.buckets:
        taken: dict[uuid.UUID, int] = {}
        for (t, _), n in got.items():
            taken[t] = taken.get(t, 0) + n
        await conn.execute(
            driver.upsert(
                rate_buckets,
                [
                    {
                        "name": dispatch_bucket(t),
                        "tokens": level - taken.get(t, 0),
                        "stamp": plan.now,
                    }
                    for t, (_, level) in sorted(plan.buckets.items())
                ],
                ["tokens", "stamp"],
            )
        )


async def _fair_state(
    conn: AsyncConnection, pool: str, classes: Sequence[int], tenants: Sequence[uuid.UUID]
) -> FairState:
    state = FairState()
    if not classes:
        return state
    rows = await conn.execute(
        sa.select(fair_shares.c.priority, fair_shares.c.tenant_id, fair_shares.c["pass"]).where(
            fair_shares.c.pool == pool,
            fair_shares.c.priority.in_(classes),
            fair_shares.c.tenant_id.in_(tenants),
        )
    )
    for cls, tenant_id, pass_ in rows:
        state.passes[(cls, tenant_id)] = pass_
    clocks = await conn.execute(
        sa.select(fair_clocks.c.priority, fair_clocks.c.vtime).where(
            fair_clocks.c.pool == pool, fair_clocks.c.priority.in_(classes)
        )
    )
    state.clocks.update({cls: vtime for cls, vtime in clocks})
    return state


async def _holding(
    driver: Driver, conn: AsyncConnection, tenants: Sequence[uuid.UUID]
) -> dict[uuid.UUID, int]:
    """The runs each tenant holds leased or running: RUNNING, or reserved for a worker
    — ahead of an instant (DISPATCHED) or of a gate (PENDING: it begins the moment the
    gate opens, and no lease is asked then) — each read by a tenant-led index, so the
    count costs what the tenant holds. A
    workflow run is RUNNING while its nodes run, but no worker holds it: only its node
    runs count (counted, a limit of 1 would hold back its every node, for good)."""
    if not tenants:
        return {}
    running = sa.select(runs.c.tenant_id).where(
        driver.id_in(runs.c.tenant_id, tenants),
        runs.c.state == RunState.RUNNING.value,
        runs.c.pool != WORKFLOW_POOL,
    )
    reserved = sa.select(runs.c.tenant_id).where(
        driver.id_in(runs.c.tenant_id, tenants),
        runs.c.reserved_token.isnot(None),
        runs.c.state.in_([RunState.DISPATCHED.value, RunState.PENDING.value]),
    )
    both = sa.union_all(running, reserved).subquery()
    rows = await conn.execute(
        sa.select(both.c.tenant_id, sa.func.count()).group_by(both.c.tenant_id)
    )
    return {t: n for t, n in rows}


async def _buckets(
    driver: Driver, conn: AsyncConnection, names: Sequence[str]
) -> dict[str, tuple[float, datetime]]:
    if not names:
        return {}
    rows = await conn.execute(
        sa.select(rate_buckets.c.name, rate_buckets.c.tokens, rate_buckets.c.stamp).where(
            rate_buckets.c.name.in_(names)
        )
    )
    return {name: (tokens, stamp) for name, tokens, stamp in rows}


async def _ready_count(
    conn: AsyncConnection, pool: str, cap: int, tenant_id: uuid.UUID | None = None
) -> int:
    """The ready runs of ``pool`` (of one tenant's), counted by the ready index up to
    ``cap``: never the whole queue."""
    pick = sa.select(runs.c.id).where(runs.c.pool == pool, sa.text(READY))
    if tenant_id is not None:
        pick = pick.where(runs.c.tenant_id == tenant_id)
    ready = pick.limit(cap).subquery()
    return int((await conn.execute(sa.select(sa.func.count()).select_from(ready))).scalar() or 0)


class AdmissionMixin(SqlCore):
    async def tenants_held(
        self, tenant_ids: Sequence[uuid.UUID], *, now: datetime | None = None
    ) -> dict[uuid.UUID, str]:
        if not tenant_ids:
            return {}
        async with self._read() as conn:
            at = await self._now(conn, now)
            rows = await conn.execute(
                sa.select(tenants.c.id, tenants.c.limits).where(
                    self.driver.id_in(tenants.c.id, list(tenant_ids))
                )
            )
            limits = {t: dict(lim) for t, lim in rows}
            capped = sorted(t for t, lim in limits.items() if lim.get("max_concurrent_runs"))
            rated = {t: b for t, lim in limits.items() if (b := _rate_of(lim)) is not None}
            holding = await _holding(self.driver, conn, capped)
            stored = await _buckets(self.driver, conn, [dispatch_bucket(t) for t in rated])
        held: dict[uuid.UUID, str] = {}
        for t in capped:
            cap = int(limits[t]["max_concurrent_runs"])
            if holding.get(t, 0) >= cap:
                held[t] = (
                    f"held by the tenant's limit {LIMIT_CONCURRENCY} ({cap} runs leased or "
                    "running); leased when one of them ends"
                )
        for t, bucket in sorted(rated.items()):
            tokens, stamp = stored.get(dispatch_bucket(t), (None, None))
            level = bucket.level(tokens, stamp, at)
            if t not in held and level < 1:
                held[t] = (
                    f"held by the tenant's limit {LIMIT_RATE} ({bucket.rate:g} runs a second); "
                    f"the next may go in {bucket.wait(level):.2f} s"
                )
        return held

    async def runs_releasable(self, *, run_ids: Sequence[uuid.UUID]) -> list[Releasable]:
        out: list[Releasable] = []
        async with self._read() as conn:
            for i in range(0, len(run_ids), 10_000):  # SQLite's bound on parameters
                chunk = list(run_ids[i : i + 10_000])
                rows = await conn.execute(
                    sa.select(
                        runs.c.id,
                        runs.c.shard,
                        runs.c.fire_at,
                        runs.c.tenant_id,
                        runs.c.pool,
                        runs.c.priority,
                        tenants.c.limits,
                    )
                    .join(tenants, tenants.c.id == runs.c.tenant_id)
                    .where(
                        self.driver.id_in(runs.c.id, chunk),
                        runs.c.state == RunState.SCHEDULED.value,
                    )
                )
                out += [
                    Releasable(
                        run=DueRun(id=r.id, shard=r.shard, fire_at=r.fire_at),
                        tenant_id=r.tenant_id,
                        pool=r.pool,
                        priority=r.priority,
                        weight=float(r.limits.get("weight") or 1.0),
                        ready_cap=_ready_cap(r.limits),
                    )
                    for r in rows
                ]
        return out

    async def runs_ready_counts(
        self, *, pool: str, caps: Mapping[uuid.UUID, int]
    ) -> dict[uuid.UUID, int]:
        out: dict[uuid.UUID, int] = {}
        if not caps:
            return out
        async with self._read() as conn:
            for tenant_id, cap in sorted(caps.items()):
                out[tenant_id] = await _ready_count(conn, pool, cap, tenant_id)
        return out

    async def pools_room(
        self,
        *,
        pools: Sequence[str],
        buffer: int,
        worker_ttl: float = 30.0,
        now: datetime | None = None,
    ) -> dict[str, int]:
        if not pools:
            return {}
        async with self._read() as conn:
            # The clock read in the statement where the database can: no round trip.
            at = await self._statement_now(conn, now)
            slots = dict(
                (
                    await conn.execute(
                        sa.select(workers.c.pool, sa.func.sum(workers.c.capacity))
                        .where(workers.c.pool.in_(list(pools)), workers_live(at, worker_ttl))
                        .group_by(workers.c.pool)
                    )
                ).all()
            )
            room: dict[str, int] = {}
            for pool in pools:
                target = max(buffer, 2 * int(slots.get(pool) or 0))
                room[pool] = max(0, target - await _ready_count(conn, pool, target))
        return room
