"""The admission rules (domain/admission.py) on their own: priority, the P0 reserve,
tenant limits, and weighted fair share over many leases."""

from __future__ import annotations

import uuid
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from cronwheel.domain.admission import (
    LIMIT_CONCURRENCY,
    LIMIT_RATE,
    FairState,
    TenantQueue,
    allocate,
    reserved_slots,
)

A = uuid.UUID(int=1)
B = uuid.UUID(int=2)
C = uuid.UUID(int=3)


def test_p0_is_served_before_any_lower_class() -> None:
    alloc = allocate([TenantQueue(A, {2: 100}), TenantQueue(B, {0: 3})], budget=5, reserve=0)
    assert alloc.grants == {(B, 0): 3, (A, 2): 2}


def test_lower_classes_leave_the_reserve_free() -> None:
    alloc = allocate([TenantQueue(A, {2: 100})], budget=10, reserve=2)
    assert alloc.grants == {(A, 2): 8}
    # P0 may take the reserved slots.
    alloc = allocate([TenantQueue(A, {2: 100}), TenantQueue(B, {0: 100})], budget=10, reserve=2)
    assert alloc.grants == {(B, 0): 10}
    # With fewer free slots than the reserve, lower classes get nothing.
    assert allocate([TenantQueue(A, {1: 5})], budget=2, reserve=2).grants == {}


def test_reserved_slots_round_down() -> None:
    assert reserved_slots(10, 0.1) == 1
    assert reserved_slots(1, 0.1) == 0
    assert reserved_slots(10, 0.0) == 0
    assert reserved_slots(7, 1.0) == 7


def test_a_tenant_at_its_concurrency_limit_is_held_and_others_get_its_share() -> None:
    alloc = allocate([TenantQueue(A, {2: 100}, room=0), TenantQueue(B, {2: 100})], budget=10)
    assert alloc.grants == {(B, 2): 10}
    assert alloc.held == {A: LIMIT_CONCURRENCY}


def test_room_and_tokens_bound_what_a_tenant_is_given() -> None:
    alloc = allocate([TenantQueue(A, {1: 50}, room=3)], budget=10)
    assert alloc.grants == {(A, 1): 3}
    assert alloc.held == {A: LIMIT_CONCURRENCY}
    alloc = allocate([TenantQueue(A, {1: 50}, tokens=4)], budget=10)
    assert alloc.grants == {(A, 1): 4}
    assert alloc.held == {A: LIMIT_RATE}
    # The limits span classes: room left after P0 is what lower classes may use.
    alloc = allocate([TenantQueue(A, {0: 2, 3: 50}, room=5)], budget=10)
    assert alloc.grants == {(A, 0): 2, (A, 3): 3}


def test_a_tenant_that_wants_less_than_its_limit_is_not_held() -> None:
    alloc = allocate([TenantQueue(A, {2: 2}, room=5, tokens=5)], budget=10)
    assert alloc.grants == {(A, 2): 2}
    assert alloc.held == {}


def _shares(weights: dict[uuid.UUID, float], leases: int, budget: int) -> Counter[uuid.UUID]:
    fair = FairState()
    got: Counter[uuid.UUID] = Counter()
    for _ in range(leases):
        alloc = allocate(
            [TenantQueue(t, {2: 10_000}, weight=w) for t, w in weights.items()],
            budget=budget,
            fair=fair,
        )
        fair.passes.update(alloc.fair.passes)
        fair.clocks.update(alloc.fair.clocks)
        for (t, _), n in alloc.grants.items():
            got[t] += n
    return got


def test_weights_1_and_3_share_a_quarter_and_three_quarters() -> None:
    for budget in (1, 2, 7, 100):
        got = _shares({A: 1.0, B: 3.0}, leases=400, budget=budget)
        total = got[A] + got[B]
        assert abs(got[A] / total - 0.25) < 0.01, (budget, got)


@given(st.lists(st.floats(0.1, 100), min_size=2, max_size=5), st.integers(1, 20))
def test_shares_follow_the_weights(weights: list[float], budget: int) -> None:
    tenants = {uuid.UUID(int=i + 1): w for i, w in enumerate(weights)}
    leases = 200
    got = _shares(tenants, leases=leases, budget=budget)
    total = sum(weights)
    slots = leases * budget
    for t, w in tenants.items():
        # Stride scheduling is exact within one slot per tenant.
        assert abs(got[t] - slots * w / total) <= len(tenants) + 1


def test_an_idle_tenant_coming_back_cannot_claim_the_time_it_was_away() -> None:
    fair = FairState()
    for _ in range(100):  # A and B compete; C is away
        alloc = allocate([TenantQueue(A, {2: 99}), TenantQueue(B, {2: 99})], budget=4, fair=fair)
        fair.passes.update(alloc.fair.passes)
        fair.clocks.update(alloc.fair.clocks)
    got: Counter[uuid.UUID] = Counter()
    for _ in range(30):  # C comes back: an equal share from now on, not 200 slots of catch-up
        alloc = allocate([TenantQueue(t, {2: 99}) for t in (A, B, C)], budget=3, fair=fair)
        fair.passes.update(alloc.fair.passes)
        fair.clocks.update(alloc.fair.clocks)
        for (t, _), n in alloc.grants.items():
            got[t] += n
    assert max(got.values()) - min(got.values()) <= 2, got


def test_settle_gives_back_what_was_not_taken() -> None:
    fair = FairState()
    alloc = allocate([TenantQueue(A, {2: 9}), TenantQueue(B, {2: 9})], budget=4, fair=fair)
    before = dict(alloc.fair.passes)
    alloc.settle({(A, 2): 1, (B, 2): 2})
    assert alloc.fair.passes[(2, A)] == before[(2, A)] - 1.0
    assert alloc.fair.passes[(2, B)] == before[(2, B)]


def test_a_tenant_alone_keeps_no_state() -> None:
    alloc = allocate([TenantQueue(A, {2: 9})], budget=4)
    assert alloc.grants == {(A, 2): 4}
    assert alloc.fair.passes == {} and alloc.contended == set()
