"""The database's clock in the hands of a test: a store whose every time-sensitive call
runs at an instant the test sets, so a test moves time instead of waiting for it.

The store contract makes this possible: every time-sensitive method takes ``now``, and
None means the database clock. The API (and anything else handed this store) calls
them without ``now``; here each such call gets the test's instant instead, and
``db_now()`` and ``db_now_estimate()`` answer it too. Start the clock far from the real
one, so that any path still reading the real clock fails the test's assertions on time.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, cast

from cronwheel.store import Store

__all__ = ["ManualClock", "clocked"]


class ManualClock:
    """An instant that stands still until the test moves it (forward only)."""

    def __init__(self, start: datetime) -> None:
        self._now = start

    def __call__(self) -> datetime:
        return self._now

    def move_to(self, instant: datetime) -> None:
        assert instant >= self._now, f"time runs forward: {instant} is before {self._now}"
        self._now = instant

    def advance(self, seconds: float) -> None:
        self.move_to(self._now + timedelta(seconds=seconds))


class _ClockedStore:
    def __init__(self, store: Store, clock: Callable[[], datetime]) -> None:
        self._store = store
        self._clock = clock

    async def db_now(self) -> datetime:
        return self._clock()

    async def db_now_estimate(self) -> datetime:
        return self._clock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not inspect.iscoroutinefunction(attr):
            return attr
        now = inspect.signature(attr).parameters.get("now")
        if now is None:
            return attr
        assert now.kind is inspect.Parameter.KEYWORD_ONLY, f"{name}: now is keyword-only"

        @functools.wraps(attr)
        async def at_the_clock(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("now") is None:  # None: the database clock, which is ours
                kwargs["now"] = self._clock()
            return await attr(*args, **kwargs)

        return at_the_clock


def clocked(store: Store, clock: Callable[[], datetime]) -> Store:
    """``store`` with ``clock`` as its database clock."""
    return cast(Store, _ClockedStore(store, clock))
