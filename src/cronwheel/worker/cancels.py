"""Hearing of cancels as soon as they are asked, not at the next heartbeat.

A cancel of a running run reaches its worker with the heartbeat that follows it —
seconds later (every ``heartbeat_interval``, 10 s by default). While it holds attempts
the worker also keeps one *cancels long-poll* open (``POST /v1/workers/{id}/cancels``),
which the server answers as soon as a run it is running is asked to stop, through any
API node::

    nothing held ──an attempt held──▶ (_HOLD_FIRST s, still held?) ──▶ long-poll ──┐
         ▲                                                                          │
         └──────── answered: each cancel is told to its handler, as a heartbeat's ◀┘
                   ``cancel_requested`` is; poll again while anything is held

It is not the lease long-poll: that one is not open while every slot is busy — just
when handlers run long, the ones a cancel matters for — and one open while slots
free up would have to be cut off each time one does.

- **What it costs.** Nothing while the worker holds nothing (an idle worker makes no
  request more), and nothing for runs over within ``_HOLD_FIRST``; a busy worker, one
  request per long-poll (``lease_wait``, 20 s) and one per cancel.
- **Heartbeats stay the truth.** A cancel whose notice is lost (or a server that does
  not offer the long-poll: its registration says so) still reaches the handler by the
  next heartbeat. Telling a handler twice changes nothing.
- **Known ones.** Each request names the tokens whose cancel the worker already has
  (the server leaves them out), or it would be answered at once again and again while
  their handlers wind down. A cancel of an attempt the worker does not hold yet — its
  lease answer still on the way — is kept for ``_EARLY_SECONDS`` and told to the
  handler when the attempt arrives.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from cronwheel.client import ApiError
from cronwheel.worker.held import Held
from cronwheel.worker.outbox import Backoff, log_event
from cronwheel.worker.protocol import TokenRef, WorkerProtocol

__all__ = ["Cancels"]

# A long-poll opens once an attempt has been held this long: runs over sooner never
# cost one, and a cancel of a longer one still arrives within about this much of the
# handler's start.
_HOLD_FIRST = 0.25
_EARLY_SECONDS = 60.0  # how long a cancel of an attempt not received yet is kept


class Cancels:
    """The cancels long-poll of one worker session."""

    def __init__(
        self,
        protocol: WorkerProtocol,
        *,
        held: Callable[[], Mapping[str, Held]],
        on_cancel: Callable[[Held], None],
        backoff_max: float,
    ) -> None:
        self.protocol = protocol
        self.held = held  # the attempts the worker holds, by attempt id
        self.on_cancel = on_cancel  # tell a held attempt's handler to stop
        self.backoff_max = backoff_max
        # Set from the registration: whether the server offers the long-poll, and how
        # long one may wait.
        self.offered = False
        self.wait = 0.0
        self._holding = asyncio.Event()
        self._early: dict[int, float] = {}  # token -> when it is forgotten (monotonic)

    def holding(self, held: Held) -> bool:
        """``held`` is newly held: the long-poll opens if it is not open yet. Returns
        whether its cancel was heard already (then tell its handler)."""
        self._holding.set()
        return self._early.pop(held.lease.fencing_token, None) is not None

    async def run(self, worker_id: Callable[[], str | None]) -> None:
        """Keep the long-poll open while anything is held, until cancelled."""
        backoff = Backoff(self.backoff_max)
        while True:
            if not self.held():
                self._holding.clear()
                await self._holding.wait()
                await asyncio.sleep(_HOLD_FIRST)
                continue
            ident = worker_id()
            if not self.offered or self.wait <= 0 or ident is None:
                return  # heartbeats only
            try:
                heard = await self.protocol.cancels(ident, wait=self.wait, known=self._known())
            except ApiError as exc:
                # A 404 or 410 too: the lease loop registers again, and the next poll
                # names the new id.
                delay = backoff.next_delay()
                log_event(
                    logging.WARNING,
                    "worker.cancels_failed",
                    error=str(exc),
                    retry_in=f"{delay:.2f}",
                )
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            for ref in heard:
                self._hear(ref)

    def _known(self) -> list[int]:
        now = time.monotonic()
        self._early = {token: until for token, until in self._early.items() if until > now}
        told = [h.lease.fencing_token for h in self.held().values() if h.ctx.cancel_requested]
        return [*told, *self._early]

    def _hear(self, ref: TokenRef) -> None:
        held = self.held().get(ref.attempt_id)
        if held is None:
            # Its lease answer may still be on the way: told when it arrives.
            self._early[ref.fencing_token] = time.monotonic() + _EARLY_SECONDS
        elif not held.ctx.cancel_requested:
            self.on_cancel(held)
