"""The worker's async core: one session of a :class:`~cronwheel.worker.Worker`.

Three loops share the attempts the worker holds::

    lease loop ──lease(max = free slots ──▶ waiting ──a free slot──▶ handler tasks ──▶ outbox
        ▲  long-poll,      + prefetch)          (highest class       │                  │
        │  one request                           first)              │   flusher: one batch
        └────────────── a slot frees up ◀────────────────────────────┘   request per ~10 ms
                                                                         (at once when big)
    heartbeater: ONE batch request per interval for every held attempt; learns of
    cancel requests and of lost leases
    cancels long-poll: open while attempts are held; learns of a cancel request as soon
    as it is made (``cancels.py``)

An attempt stays *held* from its lease until the server has acknowledged its outcome,
so a completion delayed by a network error keeps its lease alive meanwhile.

Prefetch: while every slot is busy, a worker whose handlers are short also holds a few
leased runs *waiting* for a slot — about what its slots finish in ``_PREFETCH_HORIZON``
seconds (concurrency times the horizon over the handlers' mean duration, known from
the first handler that ends), at most ``prefetch`` — so that a slot that frees up
starts the next run at once instead of after a lease round trip; with every slot busy,
the worker leases again once half of the waiting runs have started, so its leases stay
a few large ones rather than one per freed slot. A waiting run is
heartbeaten like a running one, a cancel request drops it, and shutdown hands it back.
Handlers that run long (over ``concurrency`` times the horizon) finish few runs a
second: their worker prefetches nothing and leaves the pool's runs to idle workers. A
pool that keeps slots for P0 gets no prefetch (a waiting lower-class run would take a
kept slot).

Shutdown (stop set): leasing ends at once; running handlers get the grace period to
finish; the ones still running are cancelled (async) or abandoned (sync) and their
attempts *released* — handed back without counting as a try; everything is flushed;
last, the worker deregisters, so the server releases any run it leased to us that we
never received (a long-poll answer cut off by the stop).
Network errors never end a session: each loop logs, backs off and tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from cronwheel.client import ApiError
from cronwheel.worker.cancels import Cancels
from cronwheel.worker.gated import Gated
from cronwheel.worker.held import (
    CancelReason,
    DeadlineExceeded,
    Held,
    format_error,
    handler_is_async,
)
from cronwheel.worker.logship import LogShipConfig, LogShipper
from cronwheel.worker.outbox import (
    FATAL_STATUSES,
    Backoff,
    Outbox,
    WorkerStats,
    log_event,
    wait_event,
)
from cronwheel.worker.progress import heartbeats
from cronwheel.worker.protocol import Completion, Failure, Lease, TokenRef, WorkerProtocol
from cronwheel.worker.reservations import Reservations
from cronwheel.worker.tasks import (
    TASK_LOGGER,
    Handler,
    NonRetryableError,
    TaskContext,
    TaskRegistry,
)
from cronwheel.worker.webhook import WebhookFailure

__all__ = ["SessionConfig", "WorkerSession"]

log = logging.getLogger("cronwheel.worker")
T = TypeVar("T")

_REGISTER_AGAIN = frozenset({(404, "not_found"), (410, "worker_deregistered")})
_P0_POLL_SECONDS = 0.1  # how often a worker with only its P0 slots free asks for P0 runs
_LEASE_MAX = 1000  # the most runs one lease request may ask for (the server's limit)
# The most gated reservations one lease takes (more with the next): the workers woken by
# a layer's arming share its nodes, and each begins its share when the gate opens. One
# worker taking a 1,000-node fan-out alone began it in 22-38 ms; two, 11-26 each.
_GATED_SHARE = 250
_BEAT_MAX = 1000  # the most heartbeats one batch request may carry (the server's limit)
_IDLE_POLL_SECONDS = 1.0
# Prefetch holds about what the handlers finish in this many seconds (see above): enough
# to cover a lease round trip, short enough that a waiting run barely waits.
_PREFETCH_HORIZON = 0.2
_DURATION_WEIGHT = 0.2  # of the latest handler in the mean duration (a moving average)
# Deregistering must never hold up a shutdown: past this, leases expire on their own.
_DEREGISTER_SECONDS = 3.0
# At shutdown, how long the starts of nodes begun at their gate are waited for.
_START_SETTLE_SECONDS = 5.0
# Reservations beyond the free slots (see the module's notes): at most this many by
# default, about what the slots begin in _RESERVE_HORIZON seconds once the handlers'
# duration is known; started ones still waiting for a slot _HAND_BACK_CHECK seconds
# after they could begin are handed back if the slots' pace would not begin them
# within _RESERVE_HORIZON.
_RESERVE_DEFAULT = 10_000
_RESERVE_HORIZON = 2.0
_HAND_BACK_CHECK = 0.5


@dataclass(frozen=True, slots=True)
class SessionConfig:
    pool: str
    capabilities: tuple[str, ...]
    tags: tuple[str, ...]
    concurrency: int
    name: str | None
    grace_period: float
    lease_wait: float
    flush_delay: float
    flush_size: int
    heartbeat_interval: float | None
    backoff_max: float
    log_shipping: LogShipConfig = field(default_factory=LogShipConfig)
    # Lease runs due within this many seconds as reservations started at their instant
    # (None: as far ahead as the server allows; 0: never).
    lease_ahead: float | None = None
    # The most leased runs held waiting for a slot (None: twice ``concurrency``; 0: none).
    prefetch: int | None = None
    # The most reservations held beyond the free slots (None: _RESERVE_DEFAULT; 0: each
    # reservation holds a slot).
    reserve: int | None = None


class _Stopped(Exception):
    """Internal: a wait was interrupted by the stop signal."""


class WorkerSession:
    def __init__(
        self,
        config: SessionConfig,
        registry: TaskRegistry,
        protocol: WorkerProtocol,
        stats: WorkerStats,
        *,
        stop: asyncio.Event,
        force: asyncio.Event,
        drain: bool,
        webhook: Callable[[Lease], Handler] | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.webhook = webhook  # the handler of a webhook lease, when this worker calls them
        self.protocol = protocol
        self.stats = stats
        self.stop = stop
        self.force = force
        self.drain = drain
        self.worker_id: str | None = None
        self.heartbeat_interval = config.heartbeat_interval or 10.0
        self.lease_wait = config.lease_wait
        self.held: dict[str, Held] = {}
        self.running = 0
        # Leased runs waiting for a slot: (priority, arrival, held), highest class first.
        self._waiting: list[tuple[int, int, Held]] = []
        self._arrivals = itertools.count()
        self._duration: float | None = None  # handlers' mean duration (s), once one ended
        self._slot_free = asyncio.Event()
        self._held_changed = asyncio.Event()
        self.lease_ahead = 0.0
        self._begun = 0  # handlers begun, ever: the pace of the slots
        self._async_tasks: dict[str, bool] = {}  # task name -> its handler is async
        self._reserved_waiting = 0  # started reservations waiting for a slot
        self._watching: asyncio.TimerHandle | None = None  # see _watch_reserved
        self.reservations = Reservations(
            protocol,
            prepare=self._hold,
            begin_many=self._arrive_reserved,
            on_drop=lambda _lease: self._slot_free.set(),
            backoff_max=config.backoff_max,
        )
        self.gated = Gated(
            protocol,
            prepare=self._prepare,
            begin=self._gates_opened,
            started=self._gated_started,
            refused=self._gated_refused,
            on_drop=self._gated_dropped,
            backoff_max=config.backoff_max,
        )
        self._gates_poll = False  # the server holds nodes ahead of their gate for us
        self._opening: dict[int, Held] = {}  # begun at their gate, start not answered
        self.outbox = Outbox(
            protocol,
            stats,
            flush_delay=config.flush_delay,
            flush_size=config.flush_size,
            backoff_max=config.backoff_max,
            on_settled=self._settled,
            defer_to=self._busy,
        )
        self._executor = ThreadPoolExecutor(
            max_workers=config.concurrency, thread_name_prefix="cronwheel-task"
        )
        self.cancels = Cancels(
            protocol,
            held=lambda: self.held,
            on_cancel=self._cancel_requested,
            backoff_max=config.backoff_max,
        )
        self._task_log = logging.getLogger(TASK_LOGGER)
        self.logs = LogShipper(protocol, config.log_shipping)
        self._starter: asyncio.Task[None] | None = None

    # -- the session -----------------------------------------------------------------

    async def run(self) -> None:
        try:
            if not await self._register():
                return
            self.logs.start()
            background = [
                asyncio.create_task(self.outbox.run(), name="cronwheel-flush"),
                asyncio.create_task(self._heartbeat_loop(), name="cronwheel-heartbeat"),
                asyncio.create_task(
                    self.cancels.run(lambda: self.worker_id), name="cronwheel-cancels"
                ),
            ]
            self._starter = asyncio.create_task(
                self.reservations.run(lambda: self.worker_id), name="cronwheel-start"
            )
            background.append(self._starter)
            background.append(
                asyncio.create_task(self.gated.run(lambda: self.worker_id), name="cronwheel-gates")
            )
            try:
                await self._lease_loop()
                await self._wind_down()
            finally:
                # Outcomes still waiting for their attempts' last log lines are queued now.
                await self.logs.close()
                # Holding the lock, the flusher is never cut off mid-request (which would
                # leave its items neither sent nor queued).
                async with self.outbox.lock:
                    for task in background:
                        task.cancel()
                    await asyncio.gather(*background, return_exceptions=True)
                await self.outbox.close()
            await self._deregister()
        finally:
            for held in self.held.values():  # only left when the session itself is cancelled
                if held.task is not None and not held.task.done():
                    held.task.cancel()
            self._executor.shutdown(wait=False, cancel_futures=True)
        log_event(
            logging.INFO,
            "worker.stopped",
            worker_id=self.worker_id,
            succeeded=self.stats.succeeded,
            failed=self.stats.failed,
            released=self.stats.released,
        )

    async def _register(self) -> bool:
        backoff = Backoff(self.config.backoff_max)
        cfg = self.config
        while not self.stop.is_set():
            try:
                reg = await self.protocol.register(
                    pool=cfg.pool,
                    capabilities=cfg.capabilities,
                    tags=cfg.tags,
                    capacity=cfg.concurrency,
                    name=cfg.name,
                    # The server leases us runs of our handlers' tasks only (a worker
                    # calling webhooks only declares none: it takes no task runs).
                    tasks=None if self.protocol.webhooks_only else self.registry.names(),
                )
            except ApiError as exc:
                if exc.status in FATAL_STATUSES or exc.status in (400, 404, 422):
                    raise  # a wrong key, URL or setting: retrying cannot help
                delay = backoff.next_delay()
                log_event(
                    logging.WARNING,
                    "worker.register_failed",
                    error=str(exc),
                    retry_in=f"{delay:.2f}",
                )
                with contextlib.suppress(_Stopped):
                    await self._sleep(delay)
                continue
            self.worker_id = reg.worker_id
            if cfg.heartbeat_interval is None:
                self.heartbeat_interval = reg.heartbeat_interval
            if reg.lease_wait_max is not None:
                self.lease_wait = min(cfg.lease_wait, reg.lease_wait_max)
            self.lease_ahead = min(
                reg.lease_ahead_max if cfg.lease_ahead is None else cfg.lease_ahead,
                reg.lease_ahead_max,
            )
            self.reservations.start_ahead_max = reg.start_ahead_max
            self.cancels.offered = reg.cancels_poll
            self.cancels.wait = self.lease_wait
            self.gated.wait = self.lease_wait
            self._gates_poll = reg.gates_poll
            log_event(
                logging.INFO,
                "worker.registered",
                worker_id=reg.worker_id,
                pool=cfg.pool,
                concurrency=cfg.concurrency,
                tasks=",".join(self.registry.names()),
            )
            return True
        return False

    async def _deregister(self) -> None:
        """The last step of a graceful shutdown, best effort: the server releases
        whatever it still counts as ours — above all a run leased by a long-poll that
        was cut off as we stopped, which we never received. Without this it would stay
        RUNNING until its heartbeat timeout and count as a failed try."""
        if self.worker_id is None:
            return
        try:
            async with asyncio.timeout(_DEREGISTER_SECONDS):
                released = await self.protocol.deregister(
                    self.worker_id, timeout=_DEREGISTER_SECONDS
                )
        except Exception as exc:  # best effort: nothing here may break the shutdown
            log_event(
                logging.WARNING,
                "worker.deregister_failed",
                worker_id=self.worker_id,
                error=str(exc) or type(exc).__name__,
                note="runs leased but never received are retried when their leases expire",
            )
            return
        log_event(logging.INFO, "worker.deregistered", worker_id=self.worker_id, released=released)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but raise :class:`_Stopped` as soon as stop is set."""
        await wait_event(self.stop, seconds)
        if self.stop.is_set():
            raise _Stopped

    async def _until_stopped(self, aw: Awaitable[T]) -> T:
        """Await ``aw`` unless stop comes first (then cancel it and raise _Stopped)."""
        work = asyncio.ensure_future(aw)
        stopper = asyncio.create_task(self.stop.wait())
        try:
            await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if work.done():
            return work.result()  # a lease that raced the stop is still honoured
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
        raise _Stopped

    # -- leasing ---------------------------------------------------------------------

    async def _lease_loop(self) -> None:
        backoff = Backoff(self.config.backoff_max)
        assert self.worker_id is not None
        while not self.stop.is_set():
            self._slot_free.clear()
            # Reservations beyond what the slots begin in a short while hold a slot each
            # for the moment their runs start; the others ride on the slots' pace.
            extra = self._reserve_extra()
            free = max(0, self.config.concurrency - self.running - self._reserved_over(extra))
            room = free + max(0, extra - self._ahead_held())
            prefetch = self._prefetch()
            want = free + prefetch - len(self._waiting)
            # With every slot busy, lease for the prefetch only once half of it has
            # started: a few larger leases, not one request per run that frees a slot.
            if want <= 0 or (free == 0 and len(self._waiting) > prefetch // 2):
                await self._wait_slot()
                continue
            # With only the slots kept for P0 free, a long-poll could only bring a P0 run,
            # and would still be waiting when a slot frees up: ask without waiting, and
            # again when a slot frees or after a short pause (a P0 run that came).
            reserved = self.protocol.p0_reserved_slots
            p0_only = reserved > 0 and free <= reserved
            wait = 0.0 if self.drain or p0_only else self.lease_wait
            # Reservations only with room for them: a prefetched run must not wait.
            ahead = 0.0 if self.drain or p0_only or room <= 0 else self.lease_ahead
            want = min(want, _LEASE_MAX)
            reserve = min(max(0, room - want), _LEASE_MAX) if ahead > 0 else 0
            # And workflow nodes whose upstream nodes are under way, within the same
            # allowance: held gated, begun the moment their gate opens.
            gated = 0
            if self._gates_poll and ahead > 0:
                gated = min(max(0, extra - self._ahead_held() - reserve), _GATED_SHARE)
            try:
                leases = await self._until_stopped(
                    self.protocol.lease(
                        self.worker_id,
                        max=want,
                        wait=wait,
                        ahead=ahead,
                        reserve=reserve,
                        gated=gated,
                    )
                )
            except _Stopped:
                return
            except ApiError as exc:
                if exc.status in FATAL_STATUSES:
                    log_event(logging.ERROR, "worker.unauthorized", error=str(exc))
                # The server forgot this worker (404: a reset database) or retired its id
                # (410: deregistered by someone else): register again, as a new worker.
                forgotten = (exc.status, exc.code) in _REGISTER_AGAIN
                if forgotten and not await self._register():
                    return
                delay = backoff.next_delay()
                log_event(
                    logging.WARNING, "worker.lease_failed", error=str(exc), retry_in=f"{delay:.2f}"
                )
                try:
                    await self._sleep(delay)
                except _Stopped:
                    return
                continue
            backoff.reset()
            self._receive(
                *(lease for lease in leases if lease.not_before is None and not lease.gated)
            )
            for lease in leases:
                if lease.gated:
                    self.gated.add(lease)
                elif lease.not_before is not None:
                    self.reservations.add(lease)
            if not leases and self.drain:
                if self.running == 0 and not self._ahead_held():
                    # Nothing more for us — unless we asked with slots taken: a pool keeps
                    # some of them for P0 runs, so ask once more with all of them free.
                    if free >= self.config.concurrency:
                        return
                    continue
                await self._wait_slot()
            elif not leases and p0_only:
                await self._wait_slot(timeout=_P0_POLL_SECONDS)
            elif not leases and wait == 0:
                # A server that allows no long-poll: poll now and then, not in a tight loop.
                try:
                    await self._sleep(_IDLE_POLL_SECONDS)
                except _Stopped:
                    return

    async def _wait_slot(self, timeout: float | None = None) -> None:
        """Until a slot frees up, the worker stops, or ``timeout`` seconds pass."""
        stopper = asyncio.create_task(self.stop.wait())
        slot = asyncio.create_task(self._slot_free.wait())
        try:
            await asyncio.wait(
                {stopper, slot}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopper.cancel()
            slot.cancel()

    def _prefetch(self) -> int:
        """How many leased runs may wait here for a slot now (see the module's notes)."""
        cap = 2 * self.config.concurrency if self.config.prefetch is None else self.config.prefetch
        if cap <= 0 or self.protocol.p0_reserved_slots > 0 or self._ahead_held():
            return 0
        if self._duration is None:
            return 0  # how long handlers take is not known yet
        finish = self.config.concurrency * _PREFETCH_HORIZON / max(self._duration, 1e-6)
        return min(cap, int(finish))

    def _reserve_extra(self) -> int:
        """How many reservations may be held beyond the free slots now: about what the
        slots begin in _RESERVE_HORIZON seconds, the configured most while the
        handlers' duration is not known (what cannot begin in time is handed back)."""
        cap = _RESERVE_DEFAULT if self.config.reserve is None else self.config.reserve
        if cap <= 0 or self.protocol.p0_reserved_slots > 0:
            return 0
        if self._duration is None:
            return cap
        pace = self.config.concurrency * _RESERVE_HORIZON / max(self._duration, 1e-6)
        return min(cap, int(pace))

    def _reserved_over(self, extra: int) -> int:
        """The reservations beyond ``extra`` (the allowance of _reserve_extra): each
        holds a slot."""
        return max(0, self._ahead_held() - extra)

    def _ahead_held(self) -> int:
        """Reservations held, of runs due ahead and of nodes ahead of their gate."""
        return len(self.reservations) + len(self.gated)

    def _ended(self, took: float) -> None:
        """A handler ran ``took`` seconds: the mean duration prefetch follows."""
        if self._duration is None:
            self._duration = took
        else:
            self._duration += _DURATION_WEIGHT * (took - self._duration)

    def _receive(self, *leases: Lease) -> None:
        """Runs leased: held from now on, each run as soon as a slot is free."""
        if leases:
            self._arrive([self._hold(lease) for lease in leases])

    def _arrive(self, helds: list[Held]) -> None:
        """Held runs that may begin (leased, or started reservations whose instant
        came): each runs as soon as a slot is free, the highest class first."""
        for held in helds:
            heapq.heappush(self._waiting, (held.lease.priority, next(self._arrivals), held))
        self._fill_slots()
        self.stats.waited += sum(1 for held in helds if held.task is None and not held.reported)

    def _arrive_reserved(self, helds: list[Held]) -> None:
        """Started reservations whose instant came: they begin as slots free up, and
        are watched (see _watch_reserved)."""
        for held in helds:
            held.reserved = True
        self._reserved_waiting += len(helds)
        self._arrive(helds)
        if self._watching is None and any(h.task is None for h in helds):
            self._watch_later()

    def _gates_opened(self, helds: list[Held]) -> None:
        """Gates of nodes held here opened (their contexts made as they were reserved):
        each is held as an attempt from now on and begins as a slot frees (at once, with
        one free), before its start is recorded (the gated loop sends it now)."""
        loop = asyncio.get_running_loop()
        for held in helds:
            self._take(held)
            held.start = loop.create_future()
            self._opening[held.lease.fencing_token] = held
            self.logs.hold(held.lease.attempt_id, True)
        self._arrive_reserved(helds)

    def _gated_dropped(self, lease: Lease, hand_back: bool) -> None:
        """A gated reservation that will not begin here; ``hand_back``: its time ran
        out here, and its gate may have opened unheard: let it go at once rather than
        at the server's next sweep."""
        if hand_back:
            self.outbox.add(TokenRef(lease.attempt_id, lease.fencing_token))
        self._slot_free.set()

    def _gated_started(self, tokens: list[int]) -> None:
        for token in tokens:
            held = self._opening.pop(token, None)
            if held is not None and held.start is not None and not held.start.done():
                held.start.set_result(True)
                self.logs.hold(held.lease.attempt_id, False)
        self._held_changed.set()  # heartbeats count them from now

    def _gated_refused(self, tokens: list[int]) -> None:
        for token in tokens:
            held = self._opening.pop(token, None)
            if held is None or held.start is None or held.start.done():
                continue
            held.start.set_result(False)
            self.logs.discard(held.lease.attempt_id)
            if not held.reported:
                self._lose(held, "its start was refused: cancelled, or its reservation lapsed")
            # Handed back all the same: a start that went through unanswered (or that
            # was given up on) ends, and a reservation still held is let go at once.
            self.outbox.add(held.ref)

    def _busy(self) -> bool:
        """Runs are about to begin, being started, or started and waiting for a slot:
        what the worker reports can wait (the outbox defers, up to a bound)."""
        return self._reserved_waiting > 0 or self.reservations.busy()

    def _watch_reserved(self, begun: int, since: float) -> None:
        """Hand back the started reservations still waiting for a slot that the pace
        the slots began runs at since ``since`` would not begin within
        _RESERVE_HORIZON: released, they go to a worker with a free slot at once."""
        self._watching = None
        pace = (self._begun - begun) / max(time.monotonic() - since, 1e-6)
        keep = int(pace * _RESERVE_HORIZON)
        order = sorted(self._waiting)
        late = [
            held
            for _, _, held in order[keep:]
            if held.reserved and held.task is None and not held.reported
        ]
        for held in late:
            held.reported = True
            self.outbox.add(held.ref)
        self._reserved_waiting -= len(late)
        if late:
            gone = {id(held) for held in late}
            self._waiting = [entry for entry in order if id(entry[2]) not in gone]
            log_event(logging.INFO, "worker.reservations_handed_back", count=len(late))
            self._slot_free.set()  # the lease loop reckons its room again
        if any(h.reserved and h.task is None for _, _, h in self._waiting):
            self._watch_later()

    def _watch_later(self) -> None:
        """Look at the started reservations waiting for a slot _HAND_BACK_CHECK from
        now, judging the slots' pace over that span."""
        self._watching = asyncio.get_running_loop().call_later(
            _HAND_BACK_CHECK, self._watch_reserved, self._begun, time.monotonic()
        )

    def _fill_slots(self) -> None:
        """Start waiting runs while slots are free. (The lease loop keeps a slot for each
        reservation beyond the allowance of _reserve_extra by leasing nothing into it:
        counting them here too would let an allowance that shrank — a first handler
        that looked slow on a busy loop — keep every slot idle.)"""
        while self._waiting and not self.stop.is_set() and self.running < self.config.concurrency:
            _, _, held = heapq.heappop(self._waiting)
            if held.reserved:
                self._reserved_waiting -= 1
            if held.reported or held.lease.attempt_id not in self.held:
                continue  # dropped while it waited: cancelled, or its lease lost
            self._run(held)

    def _hold(self, lease: Lease) -> Held:
        return self._take(self._prepare(lease))

    def _prepare(self, lease: Lease) -> Held:
        """``lease`` with its handler's context made, not held yet."""
        adapter = self.logs.adapter(
            self._task_log,
            {
                "run_id": lease.run_id,
                "attempt_id": lease.attempt_id,
                "attempt": lease.attempt,
                "task": lease.task,
            },
            fencing_token=lease.fencing_token,
        )
        return Held(lease=lease, ctx=TaskContext.of(lease, adapter))

    def _take(self, held: Held) -> Held:
        """Hold ``held``'s attempt from now on: heartbeaten, cancellable."""
        self.stats.leased += 1
        self.held[held.lease.attempt_id] = held
        self._held_changed.set()
        if self.cancels.holding(held):  # cancelled before its lease answer arrived
            self._cancel_requested(held)
        return held

    def _run(self, held: Held) -> None:
        lease = held.lease
        if lease.task:
            handler = self.registry.get(lease.task)
            is_async = self._async_tasks.get(lease.task)
            if is_async is None:  # asked once per task: inspect is slow next to a noop
                is_async = self._async_tasks[lease.task] = handler is not None and handler_is_async(
                    handler
                )
        else:
            handler = None if self.webhook is None else self.webhook(lease)
            is_async = handler is not None and handler_is_async(handler)
        held.is_async = is_async
        self.running += 1
        self._begun += 1
        held.task = asyncio.create_task(
            self._execute(held, handler), name=f"cronwheel-run-{lease.run_id}"
        )

    # -- executing -------------------------------------------------------------------

    async def _execute(self, held: Held, handler: Handler | None) -> None:
        lease, ctx = held.lease, held.ctx
        outcome: Completion | Failure | None = None
        started = time.monotonic()
        try:
            if handler is None:
                what = f"task {lease.task!r}" if lease.task else "a webhook run"
                outcome = held.failure(
                    f"no handler for {what} on this worker "
                    f"(it has: {', '.join(self.registry.names()) or 'none'})",
                    retryable=False,
                )
            else:
                result = await held.call(handler, self._executor)
                outcome = held.completion(result)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if held.cancel_reason is None or task is None:
                raise  # the session itself is being torn down
            task.uncancel()
            if held.cancel_reason == "cancel_requested":
                # The store ends a run whose cancel was requested as CANCELLED, whatever
                # its attempt reports; a failure keeps the attempt's record truthful.
                outcome = held.failure(
                    "cancelled on request: the handler was stopped", retryable=False
                )
        except WebhookFailure as exc:
            outcome = held.failure(str(exc), retryable=exc.retryable, retry_after=exc.retry_after)
        except TimeoutError as exc:
            if isinstance(exc, DeadlineExceeded):
                outcome = held.failure(f"deadline exceeded after {exc.seconds:.1f} s")
            else:
                outcome = held.failure(format_error(exc))
        except NonRetryableError as exc:
            outcome = held.failure(format_error(exc), retryable=False)
        except Exception as exc:
            outcome = held.failure(format_error(exc))
        finally:
            held.finished = True
            self.running -= 1
            if not held.ctx.cancel_requested:
                # One stopped early (cancelled, its lease lost) tells nothing of how long
                # its task takes: counted, a mass cancel would make long handlers look
                # short, and prefetch would hold runs behind busy slots.
                self._ended(time.monotonic() - started)
            self._slot_free.set()
            self._fill_slots()
        took = time.monotonic() - started
        if held.start is not None and not await held.start:
            return  # begun at its gate and refused at its start: not ours to report
        if outcome is None or held.reported:
            return
        held.reported = True
        if isinstance(outcome, Completion):
            ctx.log.debug("succeeded in %.3f s", took, extra={"event": "task.succeeded"})
        else:
            ctx.log.warning(
                "failed in %.3f s: %s",
                took,
                outcome.error.splitlines()[0],
                extra={"event": "task.failed", "retryable": outcome.retryable},
            )
        # The server keeps log lines only while the attempt is live: they go first.
        self.logs.then(lease.attempt_id, functools.partial(self.outbox.add, outcome))

    def _settled(self, attempt_id: str) -> None:
        self.held.pop(attempt_id, None)
        self._held_changed.set()

    # -- heartbeats ------------------------------------------------------------------

    def _heartbeat_period(self) -> float:
        period = self.heartbeat_interval
        for held in self.held.values():
            period = min(period, held.lease.heartbeat_timeout / 3)
            if held.lease.progress_timeout is not None:
                # A report must reach the server well before its progress deadline.
                period = min(period, held.lease.progress_timeout / 4)
        return max(period, 0.05)

    async def _heartbeat_loop(self) -> None:
        last = time.monotonic()
        while True:
            self._held_changed.clear()
            due = last + self._heartbeat_period()
            if not self.held:
                await self._held_changed.wait()
                last = time.monotonic()  # a fresh lease needs no beat yet
                continue
            delay = due - time.monotonic()
            if delay > 0:
                await wait_event(self._held_changed, delay)
                continue
            last = time.monotonic()
            try:
                await self._beat()
            except Exception:  # a bug must not let every lease expire
                log.exception("worker.heartbeat_error", extra={"event": "worker.heartbeat_error"})

    async def _beat(self) -> None:
        refs, reports = heartbeats(
            (h.lease, h.ctx.unsent_progress) for h in self.held.values() if not h.unstarted
        )
        outcomes = []
        try:
            # The server takes up to _BEAT_MAX items a request.
            for i in range(0, len(refs), _BEAT_MAX):
                out = await self.protocol.batch(heartbeats=refs[i : i + _BEAT_MAX])
                outcomes += out.heartbeats
        except ApiError as exc:
            for unsent, report in reports:  # they go with the next beat
                unsent.restore(report)
            log_event(logging.WARNING, "worker.heartbeat_failed", error=str(exc), held=len(refs))
            return
        for outcome in outcomes:
            held = self.held.get(outcome.attempt_id)
            if held is None:
                continue
            if not outcome.ok:
                self._lose(held, outcome.error)
            elif outcome.cancel_requested and not held.ctx.cancel_requested:
                self._cancel_requested(held)

    def _cancel_requested(self, held: Held) -> None:
        held.ctx.request_cancel()
        held.ctx.log.info("cancel requested", extra={"event": "task.cancel_requested"})
        if held.task is None and not held.reported:  # waiting for a slot: never starts
            held.reported = True
            self.outbox.add(held.failure("cancelled on request before it started", retryable=False))
        else:
            self._cancel(held, "cancel_requested")

    def _lose(self, held: Held, error: str | None) -> None:
        """The server no longer counts this attempt as ours: stop it, report nothing."""
        self.stats.lost += 1
        held.ctx.lease_lost = True
        held.ctx.request_cancel()
        held.reported = True
        self.held.pop(held.lease.attempt_id, None)
        held.ctx.log.warning(
            "lease lost (%s): abandoning the attempt", error, extra={"event": "task.lease_lost"}
        )
        self._cancel(held, "lease_lost")

    @staticmethod
    def _cancel(held: Held, reason: CancelReason) -> None:
        if held.is_async and not held.finished and held.task is not None:
            held.cancel_reason = reason
            held.task.cancel()

    # -- shutdown --------------------------------------------------------------------

    async def _hand_back_reservations(self) -> None:
        """Stop starting reservations, and hand back those not started. One whose start
        was cut off in flight may have started on the server: handing back its attempt
        id and token releases that attempt just the same."""
        if self._starter is not None:
            self._starter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._starter
        reserved, armed = self.reservations.take_all()
        reserved += self.gated.take_all()
        for lease in reserved:
            self.outbox.add(TokenRef(lease.attempt_id, lease.fencing_token))
        # Started ahead, their instant not come: released like runs waiting for a slot.
        armed = [held for held in armed if not held.reported]
        for held in armed:
            held.reported = True
            self.outbox.add(held.ref)
        if reserved or armed:
            log_event(
                logging.INFO, "worker.reservations_released", count=len(reserved) + len(armed)
            )

    def _hand_back_waiting(self) -> None:
        """Hand back the runs waiting for a slot: released, not counted as a try."""
        if self._watching is not None:
            self._watching.cancel()
            self._watching = None
        waiting = [h for _, _, h in self._waiting if not h.reported and h.task is None]
        self._waiting.clear()
        self._reserved_waiting = 0
        for held in waiting:
            held.reported = True
            self.outbox.add(held.ref)
        if waiting:
            log_event(logging.INFO, "worker.waiting_released", count=len(waiting))

    async def _wind_down(self) -> None:
        await self._hand_back_reservations()
        # After the reservations: one whose start was answered meanwhile waits here too.
        self._hand_back_waiting()
        if self.running:
            log_event(
                logging.INFO,
                "worker.draining",
                running=self.running,
                grace=self.config.grace_period,
            )
            await self._wait_handlers(self.config.grace_period)
        await self._settle_opened()
        leftovers = [h for h in self.held.values() if not h.finished and not h.reported]
        if not leftovers:
            return
        for held in leftovers:
            held.reported = True  # a late result from an abandoned thread is dropped
            self.logs.then(held.lease.attempt_id, functools.partial(self.outbox.add, held.ref))
            held.ctx.request_cancel()  # a sync handler that checks it can stop now
            self._cancel(held, "shutdown")
        log_event(
            logging.WARNING,
            "worker.releasing",
            count=len(leftovers),
            note="handlers still running after the grace period",
        )
        tasks = [h.task for h in leftovers if h.is_async and h.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)

    async def _settle_opened(self) -> None:
        """Nodes begun at their gate whose starts are still out: their answers are
        waited for (a while), so that outcomes waiting on them are reported; what is
        still unanswered then is handed back (a release ends the attempt if the start
        went through, and the reservation if not)."""
        if not self._opening:
            return
        await self.gated.settle(_START_SETTLE_SECONDS)
        for token, held in list(self._opening.items()):
            del self._opening[token]
            if held.start is not None and not held.start.done():
                held.start.set_result(False)
            self.logs.discard(held.lease.attempt_id)
            if not held.reported:
                held.reported = True
                self.outbox.add(held.ref)

    async def _wait_handlers(self, grace: float) -> None:
        end = time.monotonic() + grace
        while self.running and not self.force.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return
            self._slot_free.clear()
            waiters = {
                asyncio.create_task(self._slot_free.wait()),
                asyncio.create_task(self.force.wait()),
            }
            try:
                await asyncio.wait(waiters, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
