"""The wake-up fan-out that lets lease long-polls answer as soon as a run is ready."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime

from cronwheel.clock import Clock
from cronwheel.store.base import Store, Subscription
from cronwheel.store.notices import CHANNEL_RUNS_READY, parse_ready_notice

__all__ = ["ReadyNotifier"]

log = logging.getLogger("cronwheel.api")


class ReadyNotifier:
    """One subscription to :data:`CHANNEL_RUNS_READY` per app, fanned out to every lease
    long-poll waiting on the pool named in the notification.

    A waiter takes a *ticket* (an event) before it tries to lease, so a notification
    that lands between its empty lease and its wait still wakes it. Notifications are
    only hints: waiters re-poll the store on a timer as well. A notice of runs
    dispatched ahead of their instant wakes the pool's waiters at that instant, by the
    database's clock (the offset is measured as the scheduler does), and at once those
    that lease ahead (reservations).
    """

    # Seconds between offset measurements. Workers begin reserved runs by the time
    # this process tells them, and each reading narrows the earlier ones (``Clock``):
    # a first one taken while the process was busy is made good within seconds.
    CLOCK_CHECK = 5.0

    def __init__(self, store: Store) -> None:
        self._store = store
        self._tickets: dict[tuple[str, bool], asyncio.Event] = {}
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

    def ticket(self, pool: str, *, ahead: bool = False) -> asyncio.Event:
        """What a waiter on ``pool`` waits on; ``ahead``: it leases ahead, so runs
        dispatched ahead of their instant wake it at once."""
        self._start()
        event = self._tickets.get((pool, ahead))
        if event is None:
            event = self._tickets[(pool, ahead)] = asyncio.Event()
        return event

    async def now(self) -> datetime:
        """The database's time as this process reckons it: the local clock corrected
        by an offset measured at most ``CLOCK_CHECK`` seconds ago."""
        await self._check_clock()
        return self._clock.now()

    async def wait(self, ticket: asyncio.Event, timeout: float) -> None:
        self._waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await ticket.wait()
        finally:
            self._waiting -= 1

    def wake(self, pools: list[str] | None = None, *, only_ahead: bool = False) -> None:
        """Wake the waiters of ``pools`` (every waiter when None); ``only_ahead``: only
        those that lease ahead."""
        keys = (
            list(self._tickets)
            if pools is None
            else [(p, a) for p in pools for a in ((True,) if only_ahead else (False, True))]
        )
        for key in keys:
            event = self._tickets.pop(key, None)
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
                await self._check_clock()  # leases tell workers the time by it
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
        self.wake(sorted({pool for pool, _ in ahead}), only_ahead=True)
        await self._check_clock()
        loop = asyncio.get_running_loop()
        for key in ahead:
            if key in self._timers:
                continue
            delay = (key[1] - self._clock.now()).total_seconds()
            self._timers[key] = loop.call_later(max(0.0, delay), self._fire_timer, key)

    async def _check_clock(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_clock:
            return
        self._next_clock = loop.time() + self.CLOCK_CHECK  # one measurement at a time
        try:
            await self._clock.measure(self._store)
        except Exception:  # keep the last offset; measure again soon
            self._next_clock = loop.time() + 1.0
            log.warning(
                "clock offset not measured", exc_info=True, extra={"event": "api.clock_failed"}
            )

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
