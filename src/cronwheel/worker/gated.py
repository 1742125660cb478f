"""Gated reservations on the worker side: workflow nodes held before their upstream
nodes end, begun the moment their gate opens, and started after.

A lease asking for ``gated`` may bring nodes still PENDING whose upstream nodes are
all under way (``docs/reservations.md``). The worker holds them, runs nothing, and
keeps one *gates long-poll* open (``POST /v1/workers/{id}/gates``) naming them. The
upstream node's completion opens their gates in its own transaction, and the server
answers the long-poll at once, with each opened node's payload (its upstream results
in it). The handlers' contexts are made while the gates are shut, so that at the
opening each node only takes its payload::

    held ──gate opened──▶ handler begins (as a slot frees) ──▶ start sent ──┐
      │                                                                       │
      └──gone (lapsed, skipped, cancelled)──▶ dropped        started ◀───────┘
                                                (refused: the handler is stopped,
                                                 nothing is reported)

Beginning before the start is recorded is the point: the start (the node's attempt,
its transitions) is written while the handler already runs, not on the path from the
upstream's end to the node's first statement. Until the start is answered, the
attempt is not heartbeaten and its outcome waits (``Held.start``); a refused start
(the node was cancelled in that moment, or the reservation lapsed) stops the handler
and reports nothing.

An unopened reservation lapses after the node's heartbeat timeout (the server then
lets any worker reserve it again): the worker forgets it then, and the lease loop may
take it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

import orjson

from cronwheel.client import ApiError
from cronwheel.worker.held import Held
from cronwheel.worker.outbox import Backoff, log_event
from cronwheel.worker.protocol import Lease, WorkerProtocol
from cronwheel.worker.reservations import NOT_YET_SECONDS, START_BATCH

__all__ = ["Gated"]

_GATES_MAX = 10_000  # tokens per gates long-poll: the server's limit
_PREPARE_CHUNK = 100  # handler contexts made per turn of the event loop
# A start refused as the worker's own (it is gone: 404, 410): its nodes are not ours.
_GONE_STATUSES = frozenset({404, 410})


class Gated:
    """The gated reservations a worker holds, and the loop that hears of their gates."""

    def __init__(
        self,
        protocol: WorkerProtocol,
        *,
        prepare: Callable[[Lease], Held],
        begin: Callable[[list[Held]], None],
        started: Callable[[list[int]], None],
        refused: Callable[[list[int]], None],
        on_drop: Callable[[Lease, bool], None],
        backoff_max: float,
    ) -> None:
        self.protocol = protocol
        self.prepare = prepare  # a handler's context, made while the gate is shut
        self.begin = begin  # gates opened: the handlers may begin
        self.started = started  # their starts were recorded: tokens
        self.refused = refused  # their starts were refused: tokens
        self.on_drop = on_drop  # a reservation that will never begin here
        self.backoff_max = backoff_max
        self.wait = 20.0  # seconds a long-poll may wait (the session sets it)
        self.held: dict[int, Lease] = {}  # by fencing token
        # Their handlers' contexts, made a batch at a time while the gates are shut: at
        # the opening each only takes its payload.
        self._prepared: dict[int, Held] = {}
        self._unprepared: deque[int] = deque()
        self._changed = asyncio.Event()
        self._starts: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self.held)

    def add(self, lease: Lease) -> None:
        assert lease.gated
        self.held[lease.fencing_token] = lease
        self._changed.set()
        if not self._unprepared:
            asyncio.get_running_loop().call_soon(self._prepare_some)
        self._unprepared.append(lease.fencing_token)

    def _prepare_some(self) -> None:
        """Make the contexts of up to ``_PREPARE_CHUNK`` reservations still held, the
        loop let through between chunks (a lease answer's other runs begin first)."""
        for _ in range(min(_PREPARE_CHUNK, len(self._unprepared))):
            token = self._unprepared.popleft()
            lease = self.held.get(token)
            if lease is not None and token not in self._prepared:
                self._prepared[token] = self.prepare(lease)
        if self._unprepared:
            asyncio.get_running_loop().call_soon(self._prepare_some)

    def take_all(self) -> list[Lease]:
        """Every reservation still held, forgotten here: a worker stopping hands them
        back."""
        leases = list(self.held.values())
        self.held.clear()
        self._prepared.clear()
        self._unprepared.clear()
        return leases

    def _drop(self, token: int, why: str, *, hand_back: bool = False) -> None:
        self._prepared.pop(token, None)
        lease = self.held.pop(token, None)
        if lease is None:
            return
        log_event(
            logging.DEBUG,
            "worker.gated_dropped",
            run_id=lease.run_id,
            attempt_id=lease.attempt_id,
            reason=why,
        )
        self.on_drop(lease, hand_back)

    def _drop_lapsed(self) -> None:
        now = self.protocol.server_now()
        for token, lease in list(self.held.items()):
            if lease.lease_expires_at.timestamp() <= now:
                self._drop(token, "its reservation lapsed before its gate opened", hand_back=True)

    async def run(self, worker_id: Callable[[], str | None]) -> None:
        """Hear of gates while reservations are held, until cancelled. A long-poll in
        flight is cut off when more reservations arrive, and sent again naming them
        too: a gate of theirs may open before the old one's wait ends."""
        backoff = Backoff(self.backoff_max)
        try:
            while True:
                self._changed.clear()
                self._drop_lapsed()
                current = worker_id()
                if not self.held or current is None:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0 if self.held else None):
                            await self._changed.wait()
                    continue
                tokens = list(self.held)[:_GATES_MAX]
                soonest = min(lease.lease_expires_at.timestamp() for lease in self.held.values())
                wait = max(0.0, min(self.wait, soonest - self.protocol.server_now()))
                poll = asyncio.create_task(self.protocol.gates(current, tokens, wait=wait))
                more = asyncio.create_task(self._changed.wait())
                try:
                    await asyncio.wait({poll, more}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    more.cancel()
                if not poll.done():
                    poll.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ApiError):
                        await poll
                    continue
                try:
                    heard = poll.result()
                except ApiError as exc:
                    delay = backoff.next_delay()
                    log_event(
                        logging.WARNING,
                        "worker.gates_failed",
                        error=str(exc),
                        held=len(tokens),
                        retry_in=f"{delay:.2f}",
                    )
                    await asyncio.sleep(delay)
                    continue
                backoff.reset()
                for token in heard.gone:
                    self._drop(token, "gone: lapsed, handed back, skipped or cancelled")
                opened: list[Held] = []
                for group, payload, at in heard.opened:
                    # Each handler its own payload, as a lease answer's: one may change it.
                    encoded = orjson.dumps(payload)
                    for token in group:
                        lease = self.held.pop(token, None)
                        if lease is not None:
                            held = self._prepared.pop(token, None) or self.prepare(lease)
                            lease.open(at, orjson.loads(encoded))
                            held.begin_at(lease)
                            opened.append(held)
                if opened:
                    self.begin(opened)
                    self._start(current, [held.lease for held in opened])
        finally:
            for task in self._starts:
                task.cancel()
            await asyncio.gather(*self._starts, return_exceptions=True)

    def _start(self, worker_id: str, leases: list[Lease]) -> None:
        """Record the starts of nodes begun, a batch per request, all at once."""
        for i in range(0, len(leases), START_BATCH):
            task = asyncio.create_task(self._start_batch(worker_id, leases[i : i + START_BATCH]))
            self._starts.add(task)
            task.add_done_callback(self._starts.discard)

    async def settle(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the starts still out (a worker stopping)."""
        if self._starts:
            await asyncio.wait(set(self._starts), timeout=timeout)

    async def _start_batch(self, worker_id: str, leases: list[Lease]) -> None:
        """Start ``leases`` (begun, their gates opened), retrying what fails until each
        one's time is up (its lease from the opening): past it, its node may be another
        worker's, and its start is taken as refused."""
        backoff = Backoff(self.backoff_max)
        tokens = [lease.fencing_token for lease in leases]
        # A third of the heartbeat timeout kept for the first heartbeat after it.
        end = min(
            lease.lease_expires_at.timestamp() - lease.heartbeat_timeout / 3 for lease in leases
        )
        while tokens:
            try:
                answer = await self.protocol.start(worker_id, tokens)
            except ApiError as exc:
                delay = backoff.next_delay()
                if exc.status in _GONE_STATUSES or self.protocol.server_now() + delay >= end:
                    self.refused(tokens)  # the worker is gone, or the time is up
                    return
                log_event(
                    logging.WARNING,
                    "worker.gated_start_failed",
                    error=str(exc),
                    count=len(tokens),
                    retry_in=f"{delay:.2f}",
                )
                await asyncio.sleep(delay)
                continue
            if answer.started:
                self.started(answer.started)
            answered = {*answer.started, *answer.not_yet}
            # Refused, or missing from the answer: not ours.
            gone = [t for t in tokens if t not in answered]
            if gone:
                self.refused(gone)
            tokens = [t for t in tokens if t in set(answer.not_yet)]
            if tokens and self.protocol.server_now() + NOT_YET_SECONDS >= end:
                self.refused(tokens)
                return
            if tokens:
                await asyncio.sleep(NOT_YET_SECONDS)
