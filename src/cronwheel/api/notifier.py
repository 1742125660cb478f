"""The wake-up fan-outs that let long-polls answer as soon as there is something for
them: a lease as soon as a run is ready (:class:`ReadyNotifier`), a worker's cancels
long-poll as soon as a run it is running is asked to stop (:class:`CancelNotifier`).

Each is one subscription to one channel per app, fanned out to the long-polls waiting
on the key a notice names (a pool, a worker). Notices are only hints: a long-poll also
reads the store when it starts and when its wait ends, and what it misses reaches the
worker by another call (a lease by its re-poll, a cancel by the next heartbeat)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable
from datetime import datetime
from typing import Generic, TypeVar

from cronwheel.clock import Clock
from cronwheel.store.base import Store, Subscription
from cronwheel.store.notices import (
    CHANNEL_CANCELS,
    CHANNEL_GATES,
    CHANNEL_RUNS_READY,
    parse_ready_notice,
    parse_worker_notice,
)
from cronwheel.store.values import LeaseShare

__all__ = ["CancelNotifier", "GateNotifier", "ReadyNotifier", "Ticket", "Wakeups", "WorkerNotifier"]

log = logging.getLogger("cronwheel.api")

K = TypeVar("K", bound=Hashable)


class Ticket(asyncio.Event):
    """What the long-polls waiting on one key wait on. Once set, the long-polls it
    woke together are a cohort, which may share what woke them (``ReadyNotifier``: a
    large batch of ready runs, :meth:`claim`)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0  # long-polls blocked on it; once set, the cohort it woke
        self._share: LeaseShare | None = None
        self._alone = False

    def claim(self) -> LeaseShare | None:
        """For a lease long-poll it woke: the share it leases under, the same for the
        whole cohort (None: it woke alone, and so does one that joins after)."""
        if self._share is None and (self._alone or self.waiting < 2):
            self._alone = True
            return None
        if self._share is None:
            self._share = LeaseShare(among=self.waiting)
        return self._share


class Wakeups(ABC, Generic[K]):
    """Long-polls waiting on keys, woken by the notices of ``channel``.

    A waiter takes a *ticket* (an event) before it reads the store, so a notice that
    lands between its empty read and its wait still wakes it."""

    channel: str
    name: str  # in the log events of the subscription

    def __init__(self, store: Store) -> None:
        self._store = store
        self._tickets: dict[K, Ticket] = {}
        self._task: asyncio.Task[None] | None = None
        self._subscription: Subscription | None = None
        self._waiting = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        """Closed: long-polls answer at once instead of waiting (the app is stopping)."""
        return self._closed

    @property
    def waiting(self) -> int:
        """How many long-polls are blocked right now."""
        return self._waiting

    def _ticket(self, key: K) -> Ticket:
        self._start()
        event = self._tickets.get(key)
        if event is None:
            event = self._tickets[key] = Ticket()
        return event

    async def wait(self, ticket: Ticket, timeout: float) -> None:
        self._waiting += 1
        ticket.waiting += 1
        woken = False
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await ticket.wait()
            woken = ticket.is_set()
        finally:
            self._waiting -= 1
            if not woken:  # timed out or cancelled: not of the cohort
                ticket.waiting -= 1

    def _wake_keys(self, keys: Iterable[K] | None) -> None:
        """Wake the waiters of ``keys`` (every waiter when None)."""
        for key in list(self._tickets) if keys is None else keys:
            event = self._tickets.pop(key, None)
            if event is not None:
                event.set()

    def _start(self) -> None:
        if self._task is not None and self._task.done():
            self._task = None  # it died: start another
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(
                self._listen(), name=f"cronwheel-api-{self.name}-notifier"
            )

    async def _listen(self) -> None:
        while True:
            try:
                if self._subscription is None:
                    self._subscription = self._store.subscribe(self.channel)
                await self._between_waits()
                payloads = await self._subscription.wait(5.0)
                if payloads:
                    await self._on_notices(payloads)
            except asyncio.CancelledError:
                raise
            except Exception:
                # Waiters still read the store when they start and when their wait
                # ends; retry the subscription later.
                log.warning(
                    "%s subscription failed",
                    self.name,
                    exc_info=True,
                    extra={"event": f"api.{self.name}_subscription_failed"},
                )
                self._drop_subscription()
                await asyncio.sleep(1.0)

    async def _between_waits(self) -> None:
        """What the listener does every few seconds, notices or not."""

    @abstractmethod
    async def _on_notices(self, payloads: list[str]) -> None: ...

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
        self._wake_keys(None)


class ReadyNotifier(Wakeups[tuple[str, bool]]):
    """Lease long-polls, woken by :data:`CHANNEL_RUNS_READY` per pool; they also re-poll
    the store on a timer. A notice of runs dispatched ahead of their instant wakes the
    pool's waiters at that instant, by the database's clock (the offset is measured as
    the scheduler does), and at once those that lease ahead (reservations).
    """

    channel = CHANNEL_RUNS_READY
    name = "ready"
    # Seconds between offset measurements. Workers begin reserved runs by the time
    # this process tells them, and each reading narrows the earlier ones (``Clock``):
    # a first one taken while the process was busy is made good within seconds.
    CLOCK_CHECK = 5.0

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self._clock = Clock()
        self._next_clock = 0.0
        self._timers: dict[tuple[str, datetime], asyncio.TimerHandle] = {}

    def ticket(self, pool: str, *, ahead: bool = False) -> Ticket:
        """What a waiter on ``pool`` waits on; ``ahead``: it leases ahead, so runs
        dispatched ahead of their instant wake it at once."""
        return self._ticket((pool, ahead))

    async def now(self) -> datetime:
        """The database's time as this process reckons it: the local clock corrected
        by an offset measured at most ``CLOCK_CHECK`` seconds ago."""
        await self._check_clock()
        return self._clock.now()

    def wake(self, pools: list[str] | None = None, *, only_ahead: bool = False) -> None:
        """Wake the waiters of ``pools`` (every waiter when None); ``only_ahead``: only
        those that lease ahead."""
        self._wake_keys(
            None
            if pools is None
            else [(p, a) for p in pools for a in ((True,) if only_ahead else (False, True))]
        )

    async def _between_waits(self) -> None:
        await self._check_clock()  # leases tell workers the time by it

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

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        await super().close()


class WorkerNotifier(Wakeups[uuid.UUID]):
    """Long-polls of one worker each, woken by notices naming the worker."""

    def ticket(self, worker_id: uuid.UUID) -> Ticket:
        """What the long-polls of ``worker_id`` wait on."""
        return self._ticket(worker_id)

    def wake(self, worker_ids: Iterable[uuid.UUID] | None = None) -> None:
        """Wake the long-polls of ``worker_ids`` (every one when None)."""
        self._wake_keys(worker_ids)

    async def _on_notices(self, payloads: list[str]) -> None:
        workers: set[uuid.UUID] = set()
        for payload in payloads:
            try:
                workers.add(parse_worker_notice(payload))
            except ValueError:
                self.wake()  # unreadable: everyone looks
                return
        self.wake(workers)


class CancelNotifier(WorkerNotifier):
    """Workers' cancels long-polls, woken by :data:`CHANNEL_CANCELS` when a run one of
    them is running is asked to stop — through this API node or any other."""

    channel = CHANNEL_CANCELS
    name = "cancels"


class GateNotifier(WorkerNotifier):
    """Workers' gates long-polls, woken by :data:`CHANNEL_GATES` when the gate of a node
    one of them holds opens — through this API node or any other."""

    channel = CHANNEL_GATES
    name = "gates"
