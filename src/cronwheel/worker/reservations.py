"""Reservations on the worker side: runs leased ahead of their instant, started just
before it, and begun at it by this worker's own clock.

A reservation takes a slot from the moment it is leased (the run will need one at its
instant), runs nothing and is not heartbeaten: it lapses on its own at its instant plus
the run's heartbeat timeout. Shortly before the instant, by the server's clock as the
last lease answers gave it, every reservation then due is started in one ``start``
call (up to 1,000 each, several at once): a started one is *armed* — the server counts
it RUNNING from its instant, and the worker holds it (heartbeats it, learns of a cancel
request for it) with everything its handler needs made ready — and its handler begins
when the instant comes, with no round trip and little work left at that moment. A
refused one (cancelled, paused, lapsed) is dropped and frees its slot, and one answered
``not_yet`` (our clock ran ahead of the server's) is tried again a little later. A
worker shutting down hands back its reservations, armed or not.

How long before the instant a start goes out (its *lead*) follows what starts have
cost: twice the round trip of a small one, plus what each reservation of a large one
took times the number due at that instant, never more than the server allows
(``start_ahead_max``; 0: at the instant). A burst's (at least ``_BURST`` runs at one
instant) go as early as the server allows: every worker starts its share at once, so
what one worker measured of its own starts says little of how long all of them take.
A cancel or pause that reaches the server before the start wins; after it, it is a
cancel of a running run — which still wins if the worker learns of it (by its cancels
long-poll or a heartbeat) before the instant.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from cronwheel.client import ApiError
from cronwheel.worker.held import Held
from cronwheel.worker.outbox import Backoff, log_event, wait_event
from cronwheel.worker.protocol import Lease, Started, WorkerProtocol

__all__ = ["NOT_YET_SECONDS", "START_BATCH", "Reservations"]

log = logging.getLogger("cronwheel.worker")

# An item answered ``not_yet`` is tried again this much later.
NOT_YET_SECONDS = 0.005
START_BATCH = 1000  # items per start request: the server's limit
# A start goes out with the reservations due up to this much after the first one, so
# that runs due one by one (steady load) are started a few at a time: at 1,000 runs/s
# over four workers, 50 ms made the starts fewer and the handlers' p99 54 -> 7 ms
# (10 ms had left a start request per run or two, and the API's queue their tail).
_GATHER_SECONDS = 0.05
# Start requests out at once: a burst's batches all go before its instant, not each
# after the last one's answer.
_IN_FLIGHT = 8
# What a start costs before any was measured: a round trip, and per reservation.
_ROUND_TRIP = 0.005
_PER_ITEM = 0.0002
_LEAD_MIN = 0.002  # the least lead, whatever the estimates say
_WEIGHT = 0.2  # of the latest measure in the moving estimates
# After a burst began here (at least _BURST runs at one instant), what the worker
# reports waits this long: the other workers are beginning theirs on the same machines,
# and results (which may wait) would compete with them for the API and the database.
_BURST = 100
_BURST_QUIET = 1.5
# A burst's runs begin this many at a time, the loop let through between: the first
# handlers begin at once rather than after every task of the burst was made.
_BEGIN_CHUNK = 100


class Reservations:
    """The reservations a worker holds, and the loop that starts them ahead of their
    instant and begins them at it."""

    def __init__(
        self,
        protocol: WorkerProtocol,
        *,
        prepare: Callable[[Lease], Held],
        begin_many: Callable[[list[Held]], None],
        on_drop: Callable[[Lease], None],
        backoff_max: float,
    ) -> None:
        self.protocol = protocol
        self.prepare = prepare  # a reservation started: the worker holds its attempt
        self.begin_many = begin_many  # their instant came: the handlers may begin
        self.on_drop = on_drop  # a reservation that will never start here
        self.backoff_max = backoff_max
        self.start_ahead_max = 0.0  # the server's: how early a start may go out
        self.held: dict[int, Lease] = {}  # not started yet, by fencing token
        # Started, waiting for their instant: by instant, with the one timer that
        # begins them all.
        self._armed: dict[datetime, tuple[asyncio.TimerHandle, list[Held]]] = {}
        self._armed_count = 0
        # (instant, token), the instant in seconds of the server's clock: a burst's
        # reservations share one exactly, however they were reckoned here.
        self._due: list[tuple[float, int]] = []
        self._at_instant: dict[datetime, int] = {}  # reservations due per instant
        self._changed = asyncio.Event()
        self._in_flight = 0  # start requests out
        self._round_trip = _ROUND_TRIP
        self._per_item = _PER_ITEM
        self._quiet_until = 0.0  # (monotonic) see _BURST_QUIET
        # Once an instant's starts began to go out, the rest of them go at once: the
        # lead was reckoned for all of them.
        self._sending_until = 0.0

    def busy(self) -> bool:
        """Runs are about to begin, or being started: what the worker reports can wait."""
        if self._in_flight > 0 or self._armed_count or time.monotonic() < self._quiet_until:
            return True
        return bool(
            self._due and self._due[0][0] - self._lead_first() <= self.protocol.server_now()
        )

    def __len__(self) -> int:
        return len(self.held) + self._armed_count

    def add(self, lease: Lease) -> None:
        assert lease.not_before is not None
        self.held[lease.fencing_token] = lease
        self._push(lease.not_before.timestamp(), lease)
        self._changed.set()

    def _push(self, when: float, lease: Lease) -> None:
        """Start ``lease`` its lead before ``when`` (seconds, server time)."""
        assert lease.not_before is not None
        heapq.heappush(self._due, (when, lease.fencing_token))
        self._at_instant[lease.not_before] = self._at_instant.get(lease.not_before, 0) + 1

    def _local(self, instant: datetime) -> float:
        """``instant`` (server time) on our monotonic clock."""
        wall = instant.timestamp() - self.protocol.clock_offset
        return time.monotonic() + (wall - time.time())

    def _lead(self, many: int) -> float:
        """How long before their instant the starts of ``many`` reservations due
        together go out (see the module's notes)."""
        if self.start_ahead_max <= 0:
            return 0.0
        if many >= _BURST:
            # What a burst's starts cost depends on every worker starting theirs at
            # once, and on the store: as early as the server allows.
            return self.start_ahead_max
        lead = 2 * self._round_trip + many * self._per_item + _LEAD_MIN
        return min(self.start_ahead_max, lead)

    def _lead_first(self) -> float:
        """The lead of the first reservation due (the heap's top is held)."""
        lease = self.held.get(self._due[0][1])
        if lease is None or lease.not_before is None:
            return 0.0
        return self._lead(self._at_instant.get(lease.not_before, 1))

    def _measured(self, seconds: float, items: int) -> None:
        """A start of ``items`` took ``seconds``: the estimates the lead follows."""
        if items >= 100:
            self._per_item += _WEIGHT * (seconds / items - self._per_item)
        else:
            self._round_trip += _WEIGHT * (seconds - self._round_trip)

    def take_all(self) -> tuple[list[Lease], list[Held]]:
        """Every reservation still held, forgotten here, and every armed attempt that
        has not begun: a worker stopping hands them back."""
        leases = list(self.held.values())
        armed = [held for _, helds in self._armed.values() for held in helds]
        for timer, _ in self._armed.values():
            timer.cancel()
        self.held.clear()
        self._armed.clear()
        self._armed_count = 0
        self._due.clear()
        self._at_instant.clear()
        return leases, armed

    async def run(self, worker_id: Callable[[], str | None]) -> None:
        """Start reservations as their instants come near, until cancelled.
        ``worker_id`` tells the worker's current id (it changes when the worker
        registers again). Up to ``_IN_FLIGHT`` start requests are out at once, so a
        burst's later batches do not wait for the earlier ones' answers."""
        gate = asyncio.Semaphore(_IN_FLIGHT)
        backoff = Backoff(self.backoff_max)
        requests: set[asyncio.Task[None]] = set()
        try:
            while True:
                self._changed.clear()
                while self._due and self._due[0][1] not in self.held:
                    heapq.heappop(self._due)  # handed back meanwhile
                if not self._due:
                    await self._changed.wait()
                    continue
                first = self._due[0][0]
                if first > self._sending_until:
                    delay = first - self._lead_first() - self.protocol.server_now()
                    if delay > 0:
                        await wait_event(self._changed, delay)
                        continue
                    self._sending_until = first + _GATHER_SECONDS
                await gate.acquire()
                batch = self._pop_due(self._sending_until)
                current = worker_id()
                if not batch or current is None:
                    gate.release()
                    self._retry(batch, NOT_YET_SECONDS)
                    await asyncio.sleep(NOT_YET_SECONDS)
                    continue
                task = asyncio.create_task(self._start(current, batch, gate, backoff))
                requests.add(task)
                task.add_done_callback(requests.discard)
        finally:
            for task in requests:
                task.cancel()
            await asyncio.gather(*requests, return_exceptions=True)

    async def _start(
        self, worker_id: str, batch: list[Lease], gate: asyncio.Semaphore, backoff: Backoff
    ) -> None:
        self._in_flight += 1
        sent = time.monotonic()
        try:
            answer = await self.protocol.start(worker_id, [lease.fencing_token for lease in batch])
        except ApiError as exc:
            retry = backoff.next_delay()
            log_event(
                logging.WARNING,
                "worker.start_failed",
                error=str(exc),
                reservations=len(batch),
                retry_in=f"{retry:.2f}",
            )
            self._retry(batch, retry)
            return
        finally:
            self._in_flight -= 1
            gate.release()
        self._measured(time.monotonic() - sent, len(batch))
        backoff.reset()
        self._settle(batch, answer)

    def _pop_due(self, until: float) -> list[Lease]:
        """Up to a batch of the reservations due by ``until`` (seconds, server time)."""
        batch: list[Lease] = []
        while self._due and self._due[0][0] <= until and len(batch) < START_BATCH:
            _, token = heapq.heappop(self._due)
            lease = self.held.get(token)
            if lease is not None:
                self._forget(lease)
                batch.append(lease)
        return batch

    def _forget(self, lease: Lease) -> None:
        assert lease.not_before is not None
        left = self._at_instant.get(lease.not_before, 0) - 1
        if left > 0:
            self._at_instant[lease.not_before] = left
        else:
            self._at_instant.pop(lease.not_before, None)

    def _retry(self, batch: list[Lease], delay: float) -> None:
        """Try ``batch`` again after ``delay``, but only while each reservation holds:
        past its expiry it may be another worker's, and is dropped."""
        now = self.protocol.server_now()
        for lease in batch:
            if lease.lease_expires_at.timestamp() <= now + delay:
                self._drop(lease, "its reservation lapsed before it could be started")
            else:
                # Its start goes out ``delay`` from now (its lead is taken off ``when``).
                assert lease.not_before is not None
                when = self.protocol.server_now() + delay + self._lead(1)
                self._push(max(when, lease.not_before.timestamp()), lease)
        self._changed.set()

    def _settle(self, batch: list[Lease], answer: Started) -> None:
        by_token = {lease.fencing_token: lease for lease in batch}
        # (An answer without its instant would be a server bug: our reckoning of it.)
        at = answer.started_at or datetime.fromtimestamp(self.protocol.server_now(), UTC)
        for token in answer.started:
            lease = self.held.pop(token, None)
            if lease is None:
                continue
            instant = lease.not_before
            assert instant is not None
            held = self.prepare(lease.started(at))
            armed = self._armed.get(instant)
            if armed is None:
                wait = self._local(instant) - time.monotonic()
                if wait <= 0:
                    self.begin_many([held])
                    continue
                timer = asyncio.get_running_loop().call_later(wait, self._begin_at, instant)
                armed = self._armed[instant] = (timer, [])
            armed[1].append(held)
            self._armed_count += 1
        for token in answer.refused:
            lease = by_token.get(token)
            if lease is not None:
                self._drop(lease, "refused: cancelled, paused or lapsed")
        answered = {*answer.started, *answer.refused}
        # Due later by the server's clock (ours ran ahead), or missing from the answer.
        self._retry(
            [lease for lease in batch if lease.fencing_token not in answered], NOT_YET_SECONDS
        )

    def _begin_at(self, instant: datetime) -> None:
        """The instant of armed reservations came: their handlers may begin. (Not before
        it: an event loop's timers may fire up to a millisecond early — uvloop's count
        whole milliseconds — and are then set again for what is left.)"""
        early = self._local(instant) - time.monotonic()
        if early > 0:
            loop = asyncio.get_running_loop()
            _, waiting = self._armed[instant]
            self._armed[instant] = (loop.call_later(early, self._begin_at, instant), waiting)
            return
        _, begun = self._armed.pop(instant)
        self._armed_count -= len(begun)
        if len(begun) >= _BURST:
            self._quiet_until = time.monotonic() + _BURST_QUIET
        self._begin_chunks(begun)

    def _begin_chunks(self, helds: list[Held]) -> None:
        self.begin_many(helds[:_BEGIN_CHUNK])
        if len(helds) > _BEGIN_CHUNK:
            asyncio.get_running_loop().call_soon(self._begin_chunks, helds[_BEGIN_CHUNK:])

    def _drop(self, lease: Lease, why: str) -> None:
        if self.held.pop(lease.fencing_token, None) is None:
            return
        log_event(
            logging.INFO,
            "worker.reservation_dropped",
            run_id=lease.run_id,
            attempt_id=lease.attempt_id,
            reason=why,
        )
        self.on_drop(lease)
