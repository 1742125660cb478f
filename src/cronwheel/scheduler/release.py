"""Capacity-aware release: a burst's runs go to the ready queue as fast as the pool's
workers can take them — P0 first, then tenants by their weights — not all at once.

::

    due window ──pop (a burst: >= dispatch_lead_burst runs)──▶ backlog, by pool,
                                                                class and tenant
    each pass:  room(pool) = max(dispatch_buffer, 2 * live slots) - ready runs
                backlog ──take(room): P0 first, stride by weight──▶ fire

A run waiting in the backlog is SCHEDULED in the database, exactly as in the due
window: a cancel, pause or shard hand-over finds it there, and firing re-checks
everything. So the ready queue holds about two rounds of the pool's work, however
large the burst, and a P0 run due in the middle of a 100,000-run flood is fired ahead
of the flood's remaining runs instead of behind them. Every scheduler node releases
for its own shards against the same pool: with N nodes holding a pool's backlog, the
ready queue may reach N times its room — bounded, where a flood is not.

The fair-share state of the release is the node's own (``domain/admission.py``'s
stride scheduling, in memory): it shapes the order of release only. Leasing enforces
the shares and limits for every node at once (``store/sql/admission.py``).
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable, Mapping

from cronwheel.domain.admission import FairState, TenantQueue, allocate
from cronwheel.domain.model import DueRun
from cronwheel.store.values import Releasable

__all__ = ["Backlog"]


class Backlog:
    def __init__(self) -> None:
        # pool -> (tenant, class) -> runs, oldest first
        self._queues: dict[str, dict[tuple[uuid.UUID, int], deque[DueRun]]] = {}
        self._weights: dict[uuid.UUID, float] = {}
        self._ready_caps: dict[uuid.UUID, int] = {}  # limited tenants (Releasable.ready_cap)
        self._fair: dict[str, FairState] = {}
        self._ids: set[uuid.UUID] = set()

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._ids

    def add(self, held: Iterable[Releasable]) -> None:
        for h in sorted(held, key=lambda h: h.run.fire_at):
            if h.run.id in self._ids:
                continue
            self._ids.add(h.run.id)
            self._weights[h.tenant_id] = h.weight
            if h.ready_cap is None:
                self._ready_caps.pop(h.tenant_id, None)
            else:
                self._ready_caps[h.tenant_id] = h.ready_cap
            queues = self._queues.setdefault(h.pool, {})
            queues.setdefault((h.tenant_id, h.priority), deque()).append(h.run)

    def pools(self) -> list[str]:
        return sorted(self._queues)

    def depth(self) -> dict[str, dict[tuple[uuid.UUID, int], int]]:
        """What waits, by pool, then (tenant, class)."""
        return {
            pool: {key: len(runs) for key, runs in queues.items()}
            for pool, queues in self._queues.items()
        }

    def waiting_class(self, cls: int) -> bool:
        """Whether a run of priority class ``cls`` waits, in any pool."""
        return any(c == cls for queues in self._queues.values() for _, c in queues)

    def limited(self, pool: str) -> dict[uuid.UUID, int]:
        """The ready caps of the limited tenants waiting in ``pool``."""
        waiting = {t for t, _ in self._queues.get(pool, {})}
        return {t: cap for t, cap in self._ready_caps.items() if t in waiting}

    def take(
        self, pool: str, room: int, ready: Mapping[uuid.UUID, int] | None = None
    ) -> list[DueRun]:
        """Up to ``room`` runs of ``pool``: P0 first, then each class shared among its
        tenants by weight; a limited tenant only up to its ready cap, less the runs
        of its already ready (``ready``)."""
        queues = self._queues.get(pool)
        if not queues or room <= 0:
            return []
        supply: dict[uuid.UUID, dict[int, int]] = {}
        for (tenant_id, cls), runs in queues.items():
            supply.setdefault(tenant_id, {})[cls] = len(runs)
        fair = self._fair.setdefault(pool, FairState())
        alloc = allocate(
            [
                TenantQueue(
                    t,
                    classes,
                    weight=self._weights[t],
                    room=(
                        None
                        if t not in self._ready_caps
                        else max(0, self._ready_caps[t] - (ready or {}).get(t, 0))
                    ),
                )
                for t, classes in supply.items()
            ],
            budget=room,
            fair=fair,
        )
        fair.passes.update(alloc.fair.passes)
        fair.clocks.update(alloc.fair.clocks)
        out: list[DueRun] = []
        for (tenant_id, cls), n in sorted(alloc.grants.items(), key=lambda g: (g[0][1], g[0][0])):
            runs = queues[(tenant_id, cls)]
            for _ in range(n):
                run = runs.popleft()
                self._ids.discard(run.id)
                out.append(run)
            if not runs:
                del queues[(tenant_id, cls)]
        if not queues:
            del self._queues[pool]
        return out

    def drop_shards(self, shards: set[int]) -> None:
        """Forget the runs of shards this node no longer owns (they stay SCHEDULED for
        the shards' new owners)."""
        if not shards:
            return
        for pool in list(self._queues):
            queues = self._queues[pool]
            for key in list(queues):
                kept = deque(r for r in queues[key] if r.shard not in shards)
                for r in queues[key]:
                    if r.shard in shards:
                        self._ids.discard(r.id)
                if kept:
                    queues[key] = kept
                else:
                    del queues[key]
            if not queues:
                del self._queues[pool]
