"""Splitting a failed batch down to its poison rows (scheduler/isolation.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cronwheel.domain.errors import StoreUnavailableError
from cronwheel.scheduler.isolation import QuarantineBudget, isolate


class Batch:
    """A step over integers that fails whenever a batch holds a poison one, and records
    every call it saw (as the store would see them)."""

    def __init__(self, poison: set[int], error: Exception | None = None) -> None:
        self.poison = poison
        self.error = error or ValueError("refused")
        self.calls: list[list[int]] = []
        self.quarantined: list[int] = []

    async def step(self, items: Sequence[int]) -> list[int]:
        self.calls.append(list(items))
        if self.poison & set(items):
            raise self.error
        return list(items)

    async def quarantine(self, item: int, exc: Exception) -> None:
        assert exc is self.error
        self.quarantined.append(item)


async def test_a_clean_batch_is_one_step() -> None:
    batch = Batch(poison=set())
    assert await isolate(
        range(8), batch.step, batch.quarantine, budget=QuarantineBudget(5)
    ) == list(range(8))
    assert batch.calls == [list(range(8))]


@pytest.mark.parametrize("poison", [{0}, {7}, {3}, {2, 5}])
async def test_the_poison_rows_alone_are_quarantined(poison: set[int]) -> None:
    batch = Batch(poison)
    done = await isolate(list(range(8)), batch.step, batch.quarantine, budget=QuarantineBudget(5))
    assert sorted(done) == sorted(set(range(8)) - poison)
    assert sorted(batch.quarantined) == sorted(poison)
    # About 2·log2(8) extra steps per poison row, never one per row.
    assert len(batch.calls) <= 1 + 2 * 3 * len(poison)


async def test_a_single_failing_row_is_quarantined() -> None:
    batch = Batch({4})
    assert await isolate([4], batch.step, batch.quarantine, budget=QuarantineBudget(5)) == []
    assert batch.quarantined == [4]


async def test_every_row_failing_alike_is_not_the_rows_fault() -> None:
    """A bug fails every row: nothing is quarantined and the error goes up as before."""
    batch = Batch(set(range(8)))
    with pytest.raises(ValueError, match="refused"):
        await isolate(list(range(8)), batch.step, batch.quarantine, budget=QuarantineBudget(5))
    assert batch.quarantined == []


async def test_an_unavailable_store_is_never_blamed_on_a_row() -> None:
    batch = Batch({3}, StoreUnavailableError("down"))
    with pytest.raises(StoreUnavailableError):
        await isolate(list(range(8)), batch.step, batch.quarantine, budget=QuarantineBudget(5))
    assert batch.quarantined == []
    assert batch.calls == [list(range(8))]  # not split either


async def test_past_its_budget_a_pass_leaves_poison_rows_for_later() -> None:
    batch = Batch({1, 4, 6})
    budget = QuarantineBudget(2)
    done = await isolate(list(range(8)), batch.step, batch.quarantine, budget=budget)
    assert sorted(done) == [0, 2, 3, 5, 7]
    assert len(batch.quarantined) == 2
    assert budget.left == 0
