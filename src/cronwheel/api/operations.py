"""Carrying out bulk operations (``domain/bulk.py``) in an API process.

::

    accepted here (wake) ─┐
    notice from any node ─┼──▶ claim the oldest open operation nobody holds ──▶ none: wait
    every 5 s (poll) ─────┘        │                                            (wake, poll)
                                   ▼
                      steps until done, the lease renewed by each ──▶ claim the next
                        lease lost: another node has it ── stop here
                        a step fails: the operation FAILED, with the error

Every API node runs one; the lease (``ttl``) makes one node carry each operation, and
another take it over when that node stops (after the lease lapses: within ``ttl`` plus
``poll``). The operation the node itself accepted is claimed at once, without waiting
for its notice; the poll costs one read when nothing is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket

from cronwheel.domain.bulk import LeaseLostError, OperationState
from cronwheel.domain.errors import StoreUnavailableError, describe_error
from cronwheel.store.base import Store
from cronwheel.store.notices import CHANNEL_OPERATIONS

__all__ = ["OperationRunner"]

log = logging.getLogger("cronwheel.api")


class OperationRunner:
    def __init__(
        self, store: Store, *, ttl: float = 10.0, poll: float = 5.0, owner: str | None = None
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.poll = poll
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Look for an operation now (one was accepted here)."""
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="cronwheel-operations")

    async def close(self) -> None:
        """Stop: an operation under way is left to its lease (another node, or this one
        when it starts again, goes on with it)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), 2.0)

    async def run_once(self) -> bool:
        """Claim one open operation and carry it out (or as far as this node holds
        it); False when there was none."""
        op = await self.store.operations_claim(owner=self.owner, ttl=self.ttl)
        if op is None:
            return False
        log.info(
            "operation claimed",
            extra={"event": "operation_claimed", "operation": str(op.id), "action": op.action},
        )
        try:
            while op.state is OperationState.RUNNING:
                op = await self.store.operations_step(op.id, owner=self.owner, ttl=self.ttl)
        except LeaseLostError:
            log.warning(
                "operation lease lost", extra={"event": "operation_lost", "operation": str(op.id)}
            )
        except StoreUnavailableError:
            raise  # the database is away: the lease lapses, and a node takes it again
        except Exception as exc:
            log.exception(
                "operation failed", extra={"event": "operation_failed", "operation": str(op.id)}
            )
            await self.store.operations_fail(op.id, owner=self.owner, error=describe_error(exc))
        else:
            log.info(
                "operation done",
                extra={
                    "event": "operation_done",
                    "operation": str(op.id),
                    "matched": op.matched,
                    "changed": op.changed,
                },
            )
        return True

    async def _run(self) -> None:
        subscription = self.store.subscribe(CHANNEL_OPERATIONS)
        try:
            while True:
                self._wake.clear()
                try:
                    if await self.run_once():
                        continue
                except Exception:
                    log.warning(
                        "operations pass failed",
                        exc_info=True,
                        extra={"event": "operations_error"},
                    )
                heard = asyncio.ensure_future(subscription.wait(self.poll))
                woken = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait({heard, woken}, return_when=asyncio.FIRST_COMPLETED)
                for pending in (heard, woken):
                    pending.cancel()
        finally:
            subscription.close()
