"""Finding the poison row of a failed batch, so that the rest of the pass goes on.

A step of a scheduler pass (fire a batch, expire a batch) runs as one transaction. When
it fails for a reason the store could not pin on one row — the database refused a
statement — the batch is split in halves and each half tried again, down to single
rows; a single row that still fails is quarantined (``store/sql/quarantine.py``) and
every other row of the batch is processed as usual::

    [ a b c d e f g h ] ✗
      [ a b c d ] ✓   [ e f g h ] ✗
                        [ e f ] ✓   [ g h ] ✗
                                      [ g ] ✓  [ h ] ✗ → quarantine h

A poison row costs about 2·log2(batch) extra transactions once; after that it is out.

Two failures are never blamed on a row. A store that is unavailable (lost
connection, lock conflict: :class:`StoreUnavailableError`) fails the whole pass, to be
retried as before. And a failure that is not the rows' at all — every row of a batch
failing alike, as a bug would make them — quarantines nothing: the error is raised as it
always was. A pass also quarantines at most ``budget`` rows; a failing row past it is
left as it is, for a later pass.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from cronwheel.domain.errors import StoreUnavailableError

__all__ = ["QuarantineBudget", "isolate"]

log = logging.getLogger("cronwheel.scheduler")

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class QuarantineBudget:
    """How many rows one pass may still quarantine."""

    left: int

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


async def isolate(
    items: Sequence[T],
    step: Callable[[Sequence[T]], Awaitable[list[R]]],
    quarantine: Callable[[T, Exception], Awaitable[None]],
    *,
    budget: QuarantineBudget,
) -> list[R]:
    """``step(items)``; when it fails, ``step`` on each half, and so on down to single
    items, each of which that still fails goes to ``quarantine``. Returns what every
    successful ``step`` returned."""
    if not items:
        return []
    try:
        return await step(items)
    except StoreUnavailableError:
        raise
    except Exception as exc:
        if len(items) <= 1:
            first_error = exc
        else:
            log.warning(
                "batch failed: isolating the row",
                extra={"event": "batch_isolating", "rows": len(items), "error": repr(exc)},
            )
            first_error = None
    if first_error is not None:
        await _quarantine_one(items[0], first_error, quarantine, budget)
        return []
    split: _Split[T, R] = _Split()
    await split.run(items, step)
    if not split.succeeded and len(split.failed) > 1:
        raise split.failed[0][1]  # every row alike: not the rows' fault
    for item, error in split.failed:
        await _quarantine_one(item, error, quarantine, budget)
    return split.results


async def _quarantine_one(
    item: T,
    error: Exception,
    quarantine: Callable[[T, Exception], Awaitable[None]],
    budget: QuarantineBudget,
) -> None:
    if budget.take():
        await quarantine(item, error)
    else:
        log.error(
            "quarantine budget of this pass spent: row left for a later pass",
            extra={"event": "quarantine_deferred", "error": repr(error)},
        )


class _Split(Generic[T, R]):
    """Halves a failed batch down to its failing rows."""

    def __init__(self) -> None:
        self.results: list[R] = []
        self.succeeded = 0
        self.failed: list[tuple[T, Exception]] = []

    async def run(
        self, items: Sequence[T], step: Callable[[Sequence[T]], Awaitable[list[R]]]
    ) -> None:
        middle = len(items) // 2
        for half in (items[:middle], items[middle:]):
            try:
                self.results += await step(half)
                self.succeeded += len(half)
            except StoreUnavailableError:
                raise
            except Exception as exc:
                if len(half) == 1:
                    self.failed.append((half[0], exc))
                else:
                    await self.run(half, step)
