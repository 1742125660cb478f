"""The app's state, which every request handler reads (``api_state(request)``): the
settings, the store, the notifier and the caches the routers share."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

from fastapi import Request

from cronwheel.api.auth import KeyCache
from cronwheel.api.creation import CreateBatcher
from cronwheel.api.key_rates import SharedKeyRates
from cronwheel.api.metrics import RunsByStateRefresher
from cronwheel.api.notifier import CancelNotifier, GateNotifier, ReadyNotifier
from cronwheel.api.operations import OperationRunner
from cronwheel.domain.model import Worker
from cronwheel.settings import Settings
from cronwheel.store.base import Store

__all__ = ["ApiState", "BoundedCache", "StartsFirst", "api_state"]

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """An LRU map for facts that never change once true (a worker's registration, the
    tenant of an attempt), so entries need no expiry, only a bound. (A worker's
    deregistration is put in by the node that served it; other nodes learn of it from
    the store, which refuses the worker by itself.)"""

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self._max:
            self._data.popitem(last=False)


@dataclass
class ApiState:
    """Everything a request handler needs, kept on ``app.state.api``."""

    settings: Settings
    store: Store
    key_cache: KeyCache
    notifier: ReadyNotifier
    runs_by_state: RunsByStateRefresher
    key_rates: SharedKeyRates
    workers: BoundedCache[uuid.UUID, Worker] = field(default_factory=lambda: BoundedCache(10_000))
    # Long-polls re-poll the store this often even without a notification.
    lease_poll_interval: float = 1.0
    starts: StartsFirst = field(default_factory=lambda: StartsFirst())
    # Single creates of a tenant arriving together are stored together.
    creates: CreateBatcher = field(init=False)
    # Carries out bulk operations (started with the app).
    operations: OperationRunner = field(init=False)
    # Wakes the workers' cancels long-polls, and their gates long-polls.
    cancels: CancelNotifier = field(init=False)
    gates: GateNotifier = field(init=False)

    def __post_init__(self) -> None:
        self.creates = CreateBatcher(self.store)
        self.operations = OperationRunner(self.store)
        self.cancels = CancelNotifier(self.store)
        self.gates = GateNotifier(self.store)


class StartsFirst:
    """At a burst's instant, starting reserved runs goes before recording finished
    ones: a batch of completions or failures waits (up to ``max_wait`` seconds) while
    any start request is being served, so the runs still waiting to start are not
    queued behind the results of those that already ran."""

    def __init__(self, max_wait: float = 2.0, statements: int = 32) -> None:
        self.max_wait = max_wait
        self._serving = 0
        self._idle = asyncio.Event()
        self._idle.set()
        # Start statements at once, at most: more would only queue inside the database,
        # and open pool connections at the busiest moment.
        self._statements = asyncio.Semaphore(statements)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Around one start request's statement (waits for a statement slot)."""
        self._serving += 1
        self._idle.clear()
        try:
            async with self._statements:
                yield
        finally:
            self._serving -= 1
            if not self._serving:
                self._idle.set()

    async def wait(self) -> None:
        if self._serving:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), self.max_wait)


def api_state(request: Request) -> ApiState:
    return cast(ApiState, request.app.state.api)
