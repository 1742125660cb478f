"""The worker's outbox: completions, failures and releases waiting to be reported,
sent in batches (one request per ~10 ms, at once when the batch is large), and the
small tools the worker's loops share."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cronwheel.client import ApiError
from cronwheel.worker.protocol import Completion, Failure, Outcome, TokenRef, WorkerProtocol

__all__ = ["FATAL_STATUSES", "Backoff", "Outbox", "WorkerStats", "log_event", "wait_event"]

log = logging.getLogger("cronwheel.worker")

FATAL_STATUSES = frozenset({401, 403})  # retrying cannot fix the credentials
_FINAL_FLUSH_SECONDS = 10.0


def log_event(level: int, event: str, **fields: Any) -> None:
    """A structured log line: ``event k=v …`` with the fields also as ``extra``."""
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    log.log(level, f"{event} {text}".rstrip(), extra={"event": event, **fields})


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait for ``event`` up to ``timeout`` seconds; whether it was set.

    Not ``asyncio.wait_for``: on Python 3.11 it can swallow a cancellation that
    arrives as the wait ends, leaving a loop that was told to stop running forever.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()
    return event.is_set()


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with full jitter, for retrying a failed request."""

    maximum: float
    initial: float = 0.5
    failures: int = field(default=0)

    def next_delay(self) -> float:
        self.failures += 1
        return random.uniform(0, min(self.maximum, self.initial * 2 ** (self.failures - 1)))

    def reset(self) -> None:
        self.failures = 0


@dataclass(slots=True)
class WorkerStats:
    """Counters of one worker (over all its sessions)."""

    leased: int = 0
    waited: int = 0  # leased while every slot was busy: held waiting for one (prefetch)
    succeeded: int = 0
    failed: int = 0
    released: int = 0
    rejected: int = 0  # outcomes the server refused (stale token: the lease was lost)
    lost: int = 0  # leases the server said were no longer ours


_Item = Completion | Failure | TokenRef


T = TypeVar("T")

_BATCH_MAX = 1000  # items of one kind per batch request: the server's limit
# Statuses after which a batch is sent again later as it is (the others of 4xx mean the
# server refuses it: its items are then tried one by one).
_RETRY_STATUSES = FATAL_STATUSES | {429}
_MAX_DEFER = 2.0
_DEFER_POLL = 0.01


def _split(items: list[T]) -> tuple[list[T], list[T]]:
    return items[:_BATCH_MAX], items[_BATCH_MAX:]


class Outbox:
    """Outcomes waiting to be reported. ``on_settled(attempt_id)`` is called once the
    server has answered for an attempt (accepted or refused): it is no longer held."""

    def __init__(
        self,
        protocol: WorkerProtocol,
        stats: WorkerStats,
        *,
        flush_delay: float,
        flush_size: int,
        backoff_max: float,
        on_settled: Callable[[str], None],
        defer_to: Callable[[], bool] | None = None,
    ) -> None:
        self.protocol = protocol
        # While this says so (runs are waiting to start), outcomes wait, up to
        # _MAX_DEFER: at a burst's instant the starts go first.
        self.defer_to = defer_to
        self.stats = stats
        self.flush_delay = flush_delay
        self.flush_size = flush_size
        self.backoff_max = backoff_max
        self.on_settled = on_settled
        self.lock = asyncio.Lock()  # one flush at a time; held while a request is out
        self._completions: list[Completion] = []
        self._failures: list[Failure] = []
        self._releases: list[TokenRef] = []
        self._changed = asyncio.Event()
        # Set while an outcome that must not wait is queued (a workflow's node: it
        # readies the nodes after it): the queue goes at once, neither gathered into a
        # batch nor deferred.
        self._hurry = asyncio.Event()

    def add(self, item: _Item) -> None:
        if isinstance(item, Completion):
            self._completions.append(item)
        elif isinstance(item, Failure):
            self._failures.append(item)
        else:
            self._releases.append(item)
        if not isinstance(item, TokenRef) and item.urgent:
            self._hurry.set()
        self._changed.set()

    def pending(self) -> int:
        return len(self._completions) + len(self._failures) + len(self._releases)

    async def run(self) -> None:
        """Flush whenever something is queued, until cancelled."""
        backoff = Backoff(self.backoff_max)
        while True:
            await self._changed.wait()
            if self.pending() < self.flush_size and not self._hurry.is_set():
                await wait_event(self._hurry, self.flush_delay)  # gather a batch
            await self._defer()
            self._changed.clear()
            try:
                flushed = await self.flush_once()
            except Exception:  # a bug must not silence every later outcome
                log.exception("worker.flush_error", extra={"event": "worker.flush_error"})
                flushed = False
            if flushed:
                backoff.reset()
            else:
                await asyncio.sleep(backoff.next_delay())
                self._changed.set()

    def _note_hurry(self) -> None:
        if any(i.urgent for queue in (self._completions, self._failures) for i in queue):
            self._hurry.set()
        else:
            self._hurry.clear()

    async def _defer(self) -> None:
        if self.defer_to is None or self._hurry.is_set():
            return
        end = time.monotonic() + _MAX_DEFER
        # Polled: the condition turns true by the clock (a start falls due), not by an
        # event. An outcome that must not wait, queued meanwhile, ends the wait.
        while (  # noqa: ASYNC110
            self.defer_to() and not self._hurry.is_set() and time.monotonic() < end
        ):
            await asyncio.sleep(_DEFER_POLL)

    async def flush_once(self) -> bool:
        """Send what is queued in one request (up to the server's limit of each kind;
        the rest on the next flush). False when it has to be tried again."""
        async with self.lock:
            completions, self._completions = _split(self._completions)
            failures, self._failures = _split(self._failures)
            releases, self._releases = _split(self._releases)
            self._note_hurry()
            if self.pending():
                self._changed.set()  # more than one request's worth: flush again
            if not (completions or failures or releases):
                return True
            try:
                out = await self.protocol.batch(
                    completions=completions, failures=failures, releases=releases
                )
            except ApiError as exc:
                # A refusal of the batch as such (not 429: rate limited, try again later).
                if 400 <= exc.status < 500 and exc.status not in _RETRY_STATUSES:
                    await self._flush_singly([*completions, *failures, *releases], exc)
                    return True
                self._completions[:0] = completions
                self._failures[:0] = failures
                self._releases[:0] = releases
                self._note_hurry()
                log_event(
                    logging.WARNING, "worker.flush_failed", error=str(exc), pending=self.pending()
                )
                return False
            self._settle(out.completions, "succeeded")
            self._settle(out.failures, "failed")
            self._settle(out.releases, "released")
            return True

    async def _flush_singly(self, items: list[_Item], first_error: ApiError) -> None:
        """A batch the server refused as a whole: send each item on its own, so one bad
        item (a result too large, say) cannot hold back the others."""
        log_event(logging.WARNING, "worker.batch_rejected", error=str(first_error))
        for item in items:
            try:
                if isinstance(item, Completion):
                    out, kind = (
                        (await self.protocol.batch(completions=[item])).completions,
                        "succeeded",
                    )
                elif isinstance(item, Failure):
                    out, kind = (await self.protocol.batch(failures=[item])).failures, "failed"
                else:
                    out, kind = (await self.protocol.batch(releases=[item])).releases, "released"
            except ApiError as exc:
                if exc.status == 429:  # not a refusal of the item: back in the queue
                    self.add(item)
                    continue
                if isinstance(item, Completion) and 400 <= exc.status < 500:
                    # The server will not take this result: report why, as a failure.
                    self.add(
                        Failure(
                            item.attempt_id,
                            item.fencing_token,
                            f"the server refused the handler's result: {exc}",
                            retryable=False,
                            urgent=item.urgent,
                        )
                    )
                    continue
                log_event(
                    logging.ERROR,
                    "worker.outcome_dropped",
                    attempt_id=item.attempt_id,
                    error=str(exc),
                )
                self.on_settled(item.attempt_id)
                continue
            self._settle(out, kind)

    def _settle(self, outcomes: list[Outcome], kind: str) -> None:
        for outcome in outcomes:
            if outcome.ok:
                if kind == "succeeded":
                    self.stats.succeeded += 1
                elif kind == "failed":
                    self.stats.failed += 1
                else:
                    self.stats.released += 1
            else:
                self.stats.rejected += 1
                log_event(
                    logging.WARNING,
                    "worker.outcome_rejected",
                    attempt_id=outcome.attempt_id,
                    outcome=kind,
                    error=outcome.error,
                )
            self.on_settled(outcome.attempt_id)

    async def close(self) -> None:
        """Flush what is left, trying for a while if the server is out of reach."""
        deadline = time.monotonic() + _FINAL_FLUSH_SECONDS
        backoff = Backoff(min(self.backoff_max, 2.0))
        while self.pending():
            if await self.flush_once():
                continue
            if time.monotonic() >= deadline:
                log_event(
                    logging.ERROR,
                    "worker.outcomes_lost",
                    pending=self.pending(),
                    note="the server retries these runs when their leases expire",
                )
                return
            await asyncio.sleep(backoff.next_delay())
