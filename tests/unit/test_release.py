"""The scheduler's backlog of a burst (scheduler/release.py): P0 first, tenants by
weight, each tenant's runs oldest first; shards handed over leave it."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

from cronwheel.domain.model import DueRun
from cronwheel.scheduler.release import Backlog
from cronwheel.store.values import Releasable

T0 = datetime(2030, 1, 1, tzinfo=UTC)
A, B = uuid.UUID(int=1), uuid.UUID(int=2)


def _runs(
    tenant: uuid.UUID,
    n: int,
    *,
    priority: int = 2,
    weight: float = 1.0,
    shard: int = 0,
    pool: str = "default",
    ready_cap: int | None = None,
) -> list[Releasable]:
    return [
        Releasable(
            run=DueRun(id=uuid.uuid4(), shard=shard, fire_at=T0 + timedelta(milliseconds=i)),
            tenant_id=tenant,
            pool=pool,
            priority=priority,
            weight=weight,
            ready_cap=ready_cap,
        )
        for i in range(n)
    ]


def test_p0_runs_are_released_before_a_flood_of_lower_ones() -> None:
    backlog = Backlog()
    flood = _runs(A, 1000)
    billing = _runs(B, 5, priority=0)
    backlog.add(flood + billing)
    first = backlog.take("default", 10)
    assert [r.id for r in first[:5]] == [h.run.id for h in billing]
    assert [r.id for r in first[5:]] == [h.run.id for h in flood[:5]]  # oldest first
    assert len(backlog) == 995


def test_tenants_are_released_by_weight() -> None:
    backlog = Backlog()
    light, heavy = _runs(A, 1000, weight=1), _runs(B, 1000, weight=3)
    backlog.add(light + heavy)
    owner = {h.run.id: h.tenant_id for h in light + heavy}
    got: Counter[uuid.UUID] = Counter()
    for _ in range(100):
        got.update(owner[r.id] for r in backlog.take("default", 4))
    assert got == {A: 100, B: 300}


def test_a_run_is_held_once_and_pools_are_kept_apart() -> None:
    backlog = Backlog()
    runs = _runs(A, 3) + _runs(A, 2, pool="gpu")
    backlog.add(runs)
    backlog.add(runs[:2])
    assert len(backlog) == 5
    assert backlog.pools() == ["default", "gpu"]
    assert len(backlog.take("gpu", 10)) == 2
    assert backlog.pools() == ["default"]
    assert backlog.take("default", 0) == [] and backlog.take("nowhere", 5) == []


def test_shards_handed_over_leave_the_backlog() -> None:
    backlog = Backlog()
    backlog.add(_runs(A, 3, shard=1) + _runs(A, 4, shard=2))
    backlog.drop_shards({2})
    assert len(backlog) == 3
    assert {r.shard for r in backlog.take("default", 10)} == {1}
    assert not backlog


def test_a_limited_tenant_is_released_only_as_far_as_it_can_take_runs() -> None:
    """A tenant capped at 5 runs at once gets at most 5 ready, less those already
    ready: the rest of the room goes to the others, never to runs no worker may take."""
    backlog = Backlog()
    capped, free = _runs(A, 100, ready_cap=5), _runs(B, 100)
    backlog.add(capped + free)
    assert backlog.limited("default") == {A: 5}
    owner = {h.run.id: h.tenant_id for h in capped + free}
    first = Counter(owner[r.id] for r in backlog.take("default", 40, {A: 0}))
    assert first == {A: 5, B: 35}
    second = Counter(owner[r.id] for r in backlog.take("default", 40, {A: 3}))
    assert second == {A: 2, B: 38}
