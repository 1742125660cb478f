"""Admission at lease time: which ready runs a worker's free slots go to, the one
place the rules are written (both drivers read the queue and keep the state; this
decides). docs/admission.md tells the whole story.

A lease of ``budget`` slots is shared out class by class, P0 first:

1. **Priority.** A class is served only when every class above it has nothing more
   this worker may take.
2. **P0 reserve.** Lower classes never take a worker's last ``reserve`` free slots:
   those wait for P0 runs, so a flood of lower classes never occupies every slot.
3. **Tenant limits.** A tenant is given at most ``room`` runs (its
   ``max_concurrent_runs`` less the runs it holds leased or running) and at most
   ``tokens`` (its dispatch-rate bucket). A tenant stopped by either is *held*, and
   the limit that held it is reported.
4. **Weighted fair share** within a class, by stride scheduling: each competing tenant
   has a *pass*; the slot goes to the lowest pass, which then advances by
   ``1 / weight``. Over any run of leases each tenant's share of the slots is its
   weight's share of the competitors' weights. A tenant alone takes everything; an
   idle tenant is not a competitor, so its share goes to the others at once; and
   when it comes back its pass is brought up to the class's *virtual time* (the pass
   of the last slot given), so it cannot claim the time it was away.

Work per lease is O(budget * log(tenants)), whatever the length of the queues.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "CLASSES",
    "LIMIT_CONCURRENCY",
    "LIMIT_RATE",
    "Allocation",
    "FairState",
    "TenantQueue",
    "allocate",
    "reserved_slots",
]

CLASSES = (0, 1, 2, 3)  # priority classes, P0 highest
LIMIT_CONCURRENCY = "max_concurrent_runs"
LIMIT_RATE = "max_dispatch_rate"


def reserved_slots(capacity: int, share: float) -> int:
    """The slots of a worker of ``capacity`` that lower classes leave for P0."""
    return int(capacity * share + 1e-9)


@dataclass(frozen=True, slots=True)
class TenantQueue:
    """What a tenant has waiting for this worker, and what its limits allow."""

    tenant_id: uuid.UUID
    supply: Mapping[int, int]  # class -> ready runs this worker can take (up to the budget)
    weight: float = 1.0
    room: int | None = None  # runs it may still hold (None: no concurrency limit)
    tokens: int | None = None  # runs its dispatch-rate bucket allows now (None: no limit)


@dataclass(slots=True)
class FairState:
    """The stride-scheduling state of one pool: passes by (class, tenant), and the
    virtual time of each class. Only what a lease touched is written back."""

    passes: dict[tuple[int, uuid.UUID], float] = field(default_factory=dict)
    clocks: dict[int, float] = field(default_factory=dict)


@dataclass(slots=True)
class Allocation:
    grants: dict[tuple[uuid.UUID, int], int] = field(default_factory=dict)  # (tenant, class)
    held: dict[uuid.UUID, str] = field(default_factory=dict)  # tenant -> the limit that held it
    fair: FairState = field(default_factory=FairState)  # the state to write back
    contended: set[int] = field(default_factory=set)  # classes where tenants competed
    weights: dict[uuid.UUID, float] = field(default_factory=dict)

    def given(self, tenant_id: uuid.UUID) -> int:
        return sum(n for (t, _), n in self.grants.items() if t == tenant_id)

    @property
    def total(self) -> int:
        return sum(self.grants.values())

    def settle(self, got: Mapping[tuple[uuid.UUID, int], int]) -> None:
        """Fewer runs than granted were taken (another worker locked some first):
        give the passes back what was not taken, so shares count runs, not grants."""
        for (tenant_id, cls), granted in self.grants.items():
            short = granted - got.get((tenant_id, cls), 0)
            key = (cls, tenant_id)
            if short > 0 and key in self.fair.passes:
                self.fair.passes[key] -= short / self.weights[tenant_id]


def allocate(
    queues: Iterable[TenantQueue],
    *,
    budget: int,
    reserve: int = 0,
    fair: FairState | None = None,
) -> Allocation:
    """Share ``budget`` slots among the tenants' queues (see the module's rules).
    ``fair`` is the pool's stride state as stored (absent entries start at the class's
    virtual time); the result carries the entries to store back."""
    queues = sorted(queues, key=lambda q: q.tenant_id)
    state = fair or FairState()
    out = Allocation(weights={q.tenant_id: q.weight for q in queues})
    left_room = {q.tenant_id: q.room for q in queues}
    left_tokens = {q.tenant_id: q.tokens for q in queues}
    for cls in CLASSES:
        cap = budget - out.total - (0 if cls == 0 else reserve)
        wanting = [q for q in queues if q.supply.get(cls, 0) > 0]
        if not wanting:
            continue
        if cap <= 0:
            break
        limit: dict[uuid.UUID, int] = {}
        for q in wanting:
            n = q.supply[cls]
            room, tokens = left_room[q.tenant_id], left_tokens[q.tenant_id]
            if room is not None and room < n:
                n = room
                if n <= 0:
                    out.held.setdefault(q.tenant_id, LIMIT_CONCURRENCY)
            if tokens is not None and tokens < n:
                n = tokens
                if n <= 0:
                    out.held.setdefault(q.tenant_id, LIMIT_RATE)
            if n > 0:
                limit[q.tenant_id] = n
        weights = {q.tenant_id: q.weight for q in wanting if q.tenant_id in limit}
        given = _stride(cls, limit, weights, cap, state, out)
        for tenant_id, n in given.items():
            out.grants[(tenant_id, cls)] = n
            if left_room[tenant_id] is not None:
                left_room[tenant_id] = left_room[tenant_id] - n  # type: ignore[operator]
            if left_tokens[tenant_id] is not None:
                left_tokens[tenant_id] = left_tokens[tenant_id] - n  # type: ignore[operator]
        # A tenant that took all its limit allowed, with more waiting, was held by it.
        for q in wanting:
            t = q.tenant_id
            if given.get(t, 0) < q.supply[cls] and given.get(t, 0) == limit.get(t, 0):
                if left_room[t] is not None and left_room[t] <= 0:  # type: ignore[operator]
                    out.held.setdefault(t, LIMIT_CONCURRENCY)
                elif left_tokens[t] is not None and left_tokens[t] <= 0:  # type: ignore[operator]
                    out.held.setdefault(t, LIMIT_RATE)
    return out


def _stride(
    cls: int,
    limit: Mapping[uuid.UUID, int],
    weights: Mapping[uuid.UUID, float],
    cap: int,
    state: FairState,
    out: Allocation,
) -> dict[uuid.UUID, int]:
    """Give up to ``cap`` slots of one class to its tenants (each at most its
    ``limit``), lowest pass first."""
    if not limit:
        return {}
    if len(limit) == 1:  # alone: everything, and no state to keep
        ((tenant_id, n),) = limit.items()
        return {tenant_id: min(n, cap)}
    out.contended.add(cls)
    vtime = state.clocks.get(cls, 0.0)
    heap: list[tuple[float, uuid.UUID]] = []
    for tenant_id in limit:
        # Back from idle (or new): start at the virtual time, never before it.
        heap.append((max(state.passes.get((cls, tenant_id), vtime), vtime), tenant_id))
    heapq.heapify(heap)
    given: dict[uuid.UUID, int] = {}
    passes = {t: p for p, t in heap}
    while heap and cap > 0:
        pass_, tenant_id = heapq.heappop(heap)
        given[tenant_id] = given.get(tenant_id, 0) + 1
        cap -= 1
        vtime = pass_
        passes[tenant_id] = pass_ + 1.0 / weights[tenant_id]
        if given[tenant_id] < limit[tenant_id]:
            heapq.heappush(heap, (passes[tenant_id], tenant_id))
    for tenant_id, pass_ in passes.items():
        out.fair.passes[(cls, tenant_id)] = pass_
    out.fair.clocks[cls] = max(vtime, state.clocks.get(cls, vtime))
    return given
