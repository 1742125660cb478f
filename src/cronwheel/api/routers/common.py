"""What the routers share: the app's state, id parsing, small caches and the wake-up
fan-out that lets lease long-polls answer as soon as a run is ready."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar, cast

from fastapi import Request

from cronwheel.api.auth import KeyCache
from cronwheel.api.metrics import RunsByStateRefresher
from cronwheel.clock import Clock
from cronwheel.domain.errors import NotFoundError, PayloadTooLargeError
from cronwheel.domain.model import Worker
from cronwheel.settings import Settings
from cronwheel.store.base import CHANNEL_RUNS_READY, Store, Subscription, parse_ready_notice

__all__ = [
    "ApiState",
    "BoundedCache",
    "ReadyNotifier",
    "api_state",
    "check_json_size",
    "parse_id",
]

log = logging.getLogger("cronwheel.api")

K = TypeVar("K")
V = TypeVar("V")


def parse_id(value: str, what: str) -> uuid.UUID:
    """A path id; anything that is not a UUID is simply not found (never a 500)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFoundError(f"no {what} {value!r}") from None


def check_json_size(value: Any, *, limit: int, field: str) -> None:
    """Reject ``value`` when its compact JSON form exceeds ``limit`` bytes."""
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    if size > limit:
        raise PayloadTooLargeError(
            f"{field} is {size} bytes of JSON; the limit is {limit}", field=field
        )


class BoundedCache(Generic[K, V]):
    """An LRU map for facts that never change once true (a worker's registration, the
    tenant of an attempt), so entries need no expiry, only a bound."""

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


class ReadyNotifier:
    """One subscription to :data:`CHANNEL_RUNS_READY` per app, fanned out to every lease
    long-poll waiting on the pool named in the notification.

    A waiter takes a *ticket* (an event) before it tries to lease, so a notification
    that lands between its empty lease and its wait still wakes it. Notifications are
    only hints: waiters re-poll the store on a timer as well. A notice of runs
    dispatched ahead of their instant wakes the pool's waiters at that instant, by the
    database's clock (the offset is measured as the scheduler does).
    """

    CLOCK_CHECK = 30.0  # seconds between offset measurements

    def __init__(self, store: Store) -> None:
        self._store = store
        self._tickets: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None
        self._subscription: Subscription | None = None
        self._waiting = 0
        self._closed = False
        self._clock = Clock()
        self._next_clock = 0.0
        self._timers: dict[tuple[str, datetime], asyncio.TimerHandle] = {}

    @property
    def closed(self) -> bool:
        """Closed: long-polls answer at once instead of waiting (the app is stopping)."""
        return self._closed

    @property
    def waiting(self) -> int:
        """How many long-polls are blocked right now."""
        return self._waiting

    def ticket(self, pool: str) -> asyncio.Event:
        self._start()
        event = self._tickets.get(pool)
        if event is None:
            event = self._tickets[pool] = asyncio.Event()
        return event

    async def wait(self, ticket: asyncio.Event, timeout: float) -> None:
        self._waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await ticket.wait()
        finally:
            self._waiting -= 1

    def wake(self, pools: list[str] | None = None) -> None:
        """Wake the waiters of ``pools`` (every waiter when None)."""
        names = list(self._tickets) if pools is None else pools
        for name in names:
            event = self._tickets.pop(name, None)
            if event is not None:
                event.set()

    def _start(self) -> None:
        if self._task is not None and self._task.done():
            self._task = None  # it died: start another
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(
                self._listen(), name="cronwheel-api-ready-notifier"
            )

    async def _listen(self) -> None:
        while True:
            try:
                if self._subscription is None:
                    self._subscription = self._store.subscribe(CHANNEL_RUNS_READY)
                payloads = await self._subscription.wait(5.0)
                if payloads:
                    await self._on_notices(payloads)
            except asyncio.CancelledError:
                raise
            except Exception:
                # Waiters still re-poll on their timer; retry the subscription later.
                log.warning(
                    "ready subscription failed",
                    exc_info=True,
                    extra={"event": "api.ready_subscription_failed"},
                )
                self._drop_subscription()
                await asyncio.sleep(1.0)

    async def _on_notices(self, payloads: list[str]) -> None:
        now_pools: list[str] = []
        ahead: list[tuple[str, datetime]] = []
        for payload in payloads:
            pool, instants = parse_ready_notice(payload)
            if not pool:
                self.wake()  # unreadable: everyone looks
            elif not instants:
                now_pools.append(pool)
            else:
                ahead += [(pool, instant) for instant in instants]
        if now_pools:
            self.wake(now_pools)
        if not ahead:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._next_clock:
            try:
                await self._clock.measure(self._store)
                self._next_clock = loop.time() + self.CLOCK_CHECK
            except Exception:  # keep the last offset; measure again next time
                log.warning(
                    "clock offset not measured", exc_info=True, extra={"event": "api.clock_failed"}
                )
        for key in ahead:
            if key in self._timers:
                continue
            delay = (key[1] - self._clock.now()).total_seconds()
            self._timers[key] = loop.call_later(max(0.0, delay), self._fire_timer, key)

    def _fire_timer(self, key: tuple[str, datetime]) -> None:
        self._timers.pop(key, None)
        self.wake([key[0]])

    def _drop_subscription(self) -> None:
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                self._subscription.close()
            self._subscription = None

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._drop_subscription()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self.wake()


@dataclass
class ApiState:
    """Everything a request handler needs, kept on ``app.state.api``."""

    settings: Settings
    store: Store
    key_cache: KeyCache
    notifier: ReadyNotifier
    runs_by_state: RunsByStateRefresher
    workers: BoundedCache[uuid.UUID, Worker] = field(default_factory=lambda: BoundedCache(10_000))
    # Long-polls re-poll the store this often even without a notification.
    lease_poll_interval: float = 1.0


def api_state(request: Request) -> ApiState:
    return cast(ApiState, request.app.state.api)
