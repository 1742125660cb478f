"""Carrying out bulk operations (``domain/bulk.py``) in an API process.

::

    accepted here (wake) ─┐
    notice from any node ─┼──▶ claim open operations nobody holds (up to ``capacity``;
    every 5 s (poll) ─────┘        each tenant's oldest before anyone's second)
                                   │
                                   ▼
                      a step of the held operation whose turn it is ────┐
                        (Turns: tenants in turn, a tenant's ops in turn;│
                        up to ``lanes`` tenants' steps at once)         │
                        done: dropped                                   │
                        lease lost: another node has it, dropped        │
                        a step fails: FAILED, with a message fit for    │
                          the tenant (the details in the log), dropped  │
                      the leases of all held renewed every ttl/3        │
                                   ▲────────────────────────────────────┘

Every API node runs one; the lease (``ttl``) makes one node carry each operation, and
another take it over when that node stops (after the lease lapses: within ``ttl`` plus
``poll``). The operation the node itself accepted is claimed at once, without waiting
for its notice; the poll costs one read when nothing is open.

Why turns: a step is one transaction of at most ``STEP`` rows, soonest due first, so
what matters for "no selected run dispatched 5 s after the 202" is that every operation
gets its next step soon, whatever else is under way. Carried out one after the other, a
cancel of 100,000 runs (15 s) kept every operation accepted after it waiting; in turns,
a new operation's first step comes after at most one step of each other tenant. And
since a step of one tenant's operation touches none of another's rows, two go at once
(``lanes``), each on its own connection: another tenant's operation then costs a large
one little of its pace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Container, Iterable
from dataclasses import dataclass

from cronwheel.clock import Clock
from cronwheel.domain.bulk import LeaseLostError, Operation, OperationState
from cronwheel.domain.errors import CronwheelError, StoreUnavailableError
from cronwheel.store.base import Store
from cronwheel.store.notices import CHANNEL_OPERATIONS

__all__ = ["OperationRunner", "Turns", "failure_message"]

log = logging.getLogger("cronwheel.api")


def failure_message(exc: Exception, operation_id: uuid.UUID) -> str:
    """What a failed operation says to the tenant's clients (``error``): a refusal the
    API would have answered them anyway (a limit of theirs, say) as it is; anything
    else only as an internal error, its text (names of tables, constraints, hosts)
    kept for the server's log, which the message points to."""
    if isinstance(exc, CronwheelError) and exc.status < 500:
        return f"{exc.code}: {exc.message}"[:2000]
    return (
        "stopped by an internal error; what its steps did stays done. The server's log "
        f"has the details (event operation_failed, operation {operation_id})"
    )


@dataclass(slots=True)
class _Held:
    op: Operation
    stepped: int = -1  # the turn of its last step (-1: none yet)


class Turns:
    """Whose step is next among the operations one node holds: fair between tenants,
    and quick to begin a new operation.

    The tenant served longest ago goes next (one that just arrived first of all); of
    its operations, one not begun yet, oldest first, else the one stepped longest ago.
    So a tenant with ten operations open gets the same share of steps as a tenant with
    one, and a new operation's first step — the runs due soonest — waits at most one
    step of every other tenant whose operations this node holds. I/O-free."""

    def __init__(self) -> None:
        self._held: dict[uuid.UUID, _Held] = {}
        self._served: dict[uuid.UUID, int] = {}  # tenant -> the turn it last had
        self._turn = 0

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, operation_id: object) -> bool:
        return operation_id in self._held

    def add(self, op: Operation) -> bool:
        """Hold ``op`` (claimed); False when it was held already (claimed again after
        its lease lapsed): its place in turn stays."""
        held = self._held.get(op.id)
        if held is not None:
            held.op = op
            return False
        self._held[op.id] = _Held(op)
        return True

    def update(self, op: Operation) -> None:
        """``op`` as its last step left it (if still held: its lease may have been found
        lost while the step was under way)."""
        held = self._held.get(op.id)
        if held is not None:
            held.op = op

    def drop(self, operation_id: uuid.UUID) -> None:
        held = self._held.pop(operation_id, None)
        if held is None:
            return
        tenant = held.op.tenant_id
        if not any(h.op.tenant_id == tenant for h in self._held.values()):
            # Gone from the node: a tenant coming back starts afresh, at the front.
            self._served.pop(tenant, None)

    def keep(self, operation_ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
        """Drop every held operation not in ``operation_ids`` (its lease renewed): the
        ones dropped."""
        kept = set(operation_ids)
        lost = [i for i in self._held if i not in kept]
        for operation_id in lost:
            self.drop(operation_id)
        return lost

    def next(self, busy: Container[uuid.UUID] = ()) -> Operation | None:
        """The operation to step now (its turn taken), or None when none is held but
        of the ``busy`` tenants (those with a step under way)."""
        by_tenant: dict[uuid.UUID, list[_Held]] = {}
        for held in self._held.values():
            if held.op.tenant_id not in busy:
                by_tenant.setdefault(held.op.tenant_id, []).append(held)
        if not by_tenant:
            return None
        tenant = min(
            by_tenant,
            key=lambda t: (
                self._served.get(t, -1),
                min(h.op.created_at for h in by_tenant[t]),
            ),
        )
        chosen = min(
            by_tenant[tenant],
            key=lambda h: (h.stepped >= 0, h.stepped, h.op.created_at, h.op.id),
        )
        self._turn += 1
        chosen.stepped = self._served[tenant] = self._turn
        return chosen.op


class OperationRunner:
    def __init__(
        self,
        store: Store,
        *,
        ttl: float = 10.0,
        poll: float = 5.0,
        capacity: int = 32,
        lanes: int = 2,
        owner: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        """``capacity``: the operations this node holds at once (the rest wait for
        another node, or for one of these to end); ``lanes``: the steps (of different
        tenants) under way at once."""
        self.store = store
        self.ttl = ttl
        self.poll = poll
        self.capacity = capacity
        self.lanes = lanes
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.clock = clock or Clock()
        self.turns = Turns()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next_look = 0.0  # monotonic: when to look for operations unasked
        self._next_renew = 0.0

    def wake(self) -> None:
        """Look for an operation now (one was accepted here)."""
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="cronwheel-operations")

    async def close(self) -> None:
        """Stop: the operations under way are left to their leases (another node, or
        this one when it starts again, goes on with them)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), 2.0)

    async def claim(self) -> int:
        """Claim open operations nobody holds, up to ``capacity`` held: how many."""
        self._wake.clear()
        self._next_look = _monotonic() + self.poll
        took = 0
        while len(self.turns) < self.capacity:
            op = await self.store.operations_claim(
                owner=self.owner, ttl=self.ttl, now=self.clock.store_now()
            )
            if op is None:
                break
            if self.turns.add(op):
                took += 1
                log.info(
                    "operation claimed",
                    extra={
                        "event": "operation_claimed",
                        "operation": str(op.id),
                        "action": op.action,
                        "tenant": str(op.tenant_id),
                    },
                )
        return took

    async def renew(self) -> None:
        """Extend the leases of every operation held, in one statement: a node holding
        many steps each less often than ``ttl``. Those it no longer holds are dropped."""
        self._next_renew = _monotonic() + self.ttl / 3
        held = await self.store.operations_renew(
            owner=self.owner, ttl=self.ttl, now=self.clock.store_now()
        )
        for operation_id in self.turns.keep(held):
            log.warning(
                "operation lease lost",
                extra={"event": "operation_lost", "operation": str(operation_id)},
            )

    async def step(self, op: Operation | None = None) -> Operation | None:
        """One step of ``op``, by default the held operation whose turn it is: the
        operation after it (None: none held, or it was lost)."""
        op = op or self.turns.next()
        if op is None:
            return None
        try:
            op = await self.store.operations_step(
                op.id, owner=self.owner, ttl=self.ttl, now=self.clock.store_now()
            )
        except LeaseLostError:
            self.turns.drop(op.id)
            log.warning(
                "operation lease lost", extra={"event": "operation_lost", "operation": str(op.id)}
            )
            return None
        except StoreUnavailableError:
            raise  # the database is away: held still, stepped again when it is back
        except Exception as exc:
            self.turns.drop(op.id)
            log.exception(
                "operation failed", extra={"event": "operation_failed", "operation": str(op.id)}
            )
            await self.store.operations_fail(
                op.id,
                owner=self.owner,
                error=failure_message(exc, op.id),
                now=self.clock.store_now(),
            )
            return None
        if op.state is OperationState.RUNNING:
            self.turns.update(op)
            return op
        self.turns.drop(op.id)
        log.info(
            "operation done",
            extra={
                "event": "operation_done",
                "operation": str(op.id),
                "matched": op.matched,
                "changed": op.changed,
            },
        )
        return op

    async def look(self) -> None:
        """Claim operations if woken, holding none, or the poll is due; renew the
        leases held when due."""
        now = _monotonic()
        if self._wake.is_set() or not self.turns or now >= self._next_look:
            await self.claim()
        if self.turns and now >= self._next_renew:
            await self.renew()

    async def run_once(self) -> bool:
        """:meth:`look`, then one step. False when no operation is held."""
        await self.look()
        if not self.turns:
            return False
        await self.step()
        return True

    async def _run(self) -> None:
        """Steps of up to ``lanes`` tenants at once, each on its connection (they touch
        rows of different tenants); a tenant's own steps one at a time."""
        listening = asyncio.create_task(self._listen(), name="cronwheel-operations-notices")
        under_way: dict[asyncio.Task[Operation | None], uuid.UUID] = {}
        try:
            while True:
                try:
                    await self.look()
                except Exception:
                    log.warning(
                        "operations pass failed",
                        exc_info=True,
                        extra={"event": "operations_error"},
                    )
                while len(under_way) < self.lanes:
                    op = self.turns.next(busy=set(under_way.values()))
                    if op is None:
                        break
                    under_way[asyncio.create_task(self.step(op))] = op.tenant_id
                woken = asyncio.ensure_future(self._wake.wait())
                ended, _ = await asyncio.wait(
                    {*under_way, woken},
                    timeout=None if under_way else self.poll,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                woken.cancel()
                failed = False
                for task in [t for t in under_way if t in ended]:
                    del under_way[task]
                    if task.exception() is not None:
                        failed = True
                        log.warning(
                            "operation step failed",
                            exc_info=task.exception(),
                            extra={"event": "operations_error"},
                        )
                if failed:
                    # The database away, most likely: the operation stays held, and is
                    # stepped again in a moment rather than at once.
                    await asyncio.sleep(1.0)
        finally:
            listening.cancel()
            for task in under_way:
                task.cancel()
            await asyncio.gather(listening, *under_way, return_exceptions=True)

    async def _listen(self) -> None:
        """Notices of operations accepted on any node wake the loop (between steps
        too: a new operation joins the turns at once)."""
        subscription = self.store.subscribe(CHANNEL_OPERATIONS)
        try:
            while True:
                if await subscription.wait(self.poll):
                    self._wake.set()
        finally:
            subscription.close()


def _monotonic() -> float:
    return asyncio.get_running_loop().time()
