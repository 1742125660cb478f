"""Reservations on the worker side: runs leased ahead of their instant, held until it
comes, then started in one request for everything due together.

A reservation takes a slot from the moment it is leased (the run will need one at its
instant), runs nothing and is not heartbeaten: it lapses on its own at its instant plus
the run's heartbeat timeout. At the instant, by the server's clock as the last lease
answer gave it, every reservation then due is started in one ``start`` call; a started
one becomes an ordinary attempt, a refused one (cancelled, paused, lapsed) is dropped
and frees its slot, and one answered ``not_yet`` (our clock ran ahead) waits a little
longer. A worker shutting down hands its reservations back.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from cronwheel.client import ApiError
from cronwheel.worker.outbox import Backoff, log_event, wait_event
from cronwheel.worker.protocol import Lease, Started, WorkerProtocol

__all__ = ["Reservations"]

log = logging.getLogger("cronwheel.worker")

# An item answered ``not_yet`` is tried again this much later.
_NOT_YET_SECONDS = 0.005
_START_BATCH = 1000  # items per start request: the server's limit
# A start request for fewer than a batch waits this long after its first run fell due
# for others to join it: runs due one by one (steady load) are started some at a time,
# not each in a request of its own.
_LINGER_SECONDS = 0.01
# Start requests out at once: a burst's batches all go at its instant, not each after
# the last one's answer (by then this worker is busy running what that one started).
_IN_FLIGHT = 8


class Reservations:
    """The reservations a worker holds, and the loop that starts them at their instant."""

    def __init__(
        self,
        protocol: WorkerProtocol,
        *,
        on_start: Callable[[Lease], None],
        on_drop: Callable[[Lease], None],
        backoff_max: float,
    ) -> None:
        self.protocol = protocol
        self.on_start = on_start  # a started reservation, now an ordinary attempt
        self.on_drop = on_drop  # a reservation that will never start here
        self.backoff_max = backoff_max
        self.held: dict[int, Lease] = {}  # by fencing token
        self._due: list[tuple[float, int]] = []  # (monotonic start time, token)
        self._changed = asyncio.Event()
        self._in_flight = 0  # start requests out

    def busy(self) -> bool:
        """Runs are due to start, or being started: what the worker reports can wait."""
        return self._in_flight > 0 or bool(self._due and self._due[0][0] <= time.monotonic())

    def __len__(self) -> int:
        return len(self.held)

    def add(self, lease: Lease) -> None:
        assert lease.not_before is not None
        self.held[lease.fencing_token] = lease
        heapq.heappush(self._due, (self._local(lease.not_before), lease.fencing_token))
        self._changed.set()

    def _local(self, instant: datetime) -> float:
        """``instant`` (server time) on our monotonic clock."""
        wall = instant.timestamp() - self.protocol.clock_offset
        return time.monotonic() + (wall - time.time())

    def take_all(self) -> list[Lease]:
        """Every reservation still held, forgotten here: a worker stopping hands them
        back."""
        leases = list(self.held.values())
        self.held.clear()
        self._due.clear()
        return leases

    async def run(self, worker_id: Callable[[], str | None]) -> None:
        """Start reservations as their instants come, until cancelled. ``worker_id``
        tells the worker's current id (it changes when the worker registers again).
        Up to ``_IN_FLIGHT`` start requests are out at once, so a burst's later batches
        do not wait for the earlier ones' answers; a full batch goes at once, a smaller
        one ``_LINGER_SECONDS`` after its first run fell due."""
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
                delay = self._due[0][0] - time.monotonic()
                if delay > 0:
                    await wait_event(self._changed, delay)
                    continue
                first_due = self._due[0][0]
                await gate.acquire()
                batch = self._pop_due()
                linger = first_due + _LINGER_SECONDS - time.monotonic()
                if 0 < len(batch) < _START_BATCH and linger > 0:
                    # A few runs due: give the next ones a moment to join them.
                    gate.release()
                    for lease in batch:
                        heapq.heappush(self._due, (first_due, lease.fencing_token))
                    await wait_event(self._changed, linger)
                    continue
                current = worker_id()
                if not batch or current is None:
                    gate.release()
                    self._retry(batch, _NOT_YET_SECONDS)
                    await asyncio.sleep(_NOT_YET_SECONDS)
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
        backoff.reset()
        self._settle(batch, answer)

    def _pop_due(self) -> list[Lease]:
        until = time.monotonic()
        batch: list[Lease] = []
        while self._due and self._due[0][0] <= until and len(batch) < _START_BATCH:
            _, token = heapq.heappop(self._due)
            lease = self.held.get(token)
            if lease is not None:
                batch.append(lease)
        return batch

    def _retry(self, batch: list[Lease], delay: float) -> None:
        """Try ``batch`` again after ``delay``, but only while each reservation holds:
        past its expiry it may be another worker's, and is dropped."""
        now = time.time() + self.protocol.clock_offset
        for lease in batch:
            if lease.lease_expires_at.timestamp() <= now + delay:
                self._drop(lease, "its reservation lapsed before it could be started")
            else:
                heapq.heappush(self._due, (time.monotonic() + delay, lease.fencing_token))
        self._changed.set()

    def _settle(self, batch: list[Lease], answer: Started) -> None:
        by_token = {lease.fencing_token: lease for lease in batch}
        # (An answer without its instant would be a server bug: our reckoning of it.)
        at = answer.started_at or datetime.fromtimestamp(
            time.time() + self.protocol.clock_offset, UTC
        )
        for token in answer.started:
            lease = self.held.pop(token, None)
            if lease is not None:
                self.on_start(lease.started(at))
        for token in answer.refused:
            lease = by_token.get(token)
            if lease is not None:
                self._drop(lease, "refused: cancelled, paused or lapsed")
        answered = {*answer.started, *answer.refused}
        # Due later by the server's clock (ours ran ahead), or missing from the answer.
        self._retry(
            [lease for lease in batch if lease.fencing_token not in answered], _NOT_YET_SECONDS
        )

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
