"""Group commit for single creates: the ``POST /v1/jobs`` of one tenant that arrive
while that tenant's earlier creates are being stored are stored together, in one
``jobs_create_many`` (one statement, one commit), and each request still gets its own
answer::

    request ──▶ validated, first due instant computed
                                                  │
         ``in_flight`` store calls of the tenant? ── no ──▶ stored now, by the request itself
                                                  yes
                                                  ▼
         queued until a call finishes, then all queued at once (up to 1,000)
                                                  │
              the batch stored ──▶ each request answered with its own job and run
              the batch refused ─▶ each request stored alone, in arrival order:
                                   each gets its own answer or its own error

Nothing waits on a timer: a lone client's create is stored at once, and under load the
batches grow by themselves with the time a store call takes. A batch that fails for
any reason (an idempotency conflict, the tenant's ``max_pending_runs``, a key used
twice in the batch) is replayed one create at a time, so what one request gets never
depends on what others sent: the same jobs are created, and the same errors raised,
as if each had come alone. ``in_flight`` store calls of one tenant may run at once
(the others queue). One by default: with the machine's cores busy, the larger batches
that one call in flight gathers cost the API and PostgreSQL about a third less CPU per
create than two calls' smaller ones (``bench/ingest.py``, 8 clients: 640 to 700 against
450 to 530 creates/s); with cores to spare, a second call keeps a connection busy while
the next batch fills.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime

from cronwheel.domain.model import Job, NewJob, Run
from cronwheel.store.base import Store

__all__ = ["CreateBatcher", "Created"]

Created = tuple[Job, Run | None, bool]


@dataclass
class _Waiting:
    job: NewJob
    now: datetime
    answer: asyncio.Future[Created] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class CreateBatcher:
    """Stores single creates, coalescing a tenant's concurrent ones. See the module's
    docstring."""

    def __init__(self, store: Store, *, max_batch: int = 1000, in_flight: int = 1) -> None:
        self._store = store
        self._max_batch = max_batch
        self._in_flight = in_flight
        self._queued: dict[uuid.UUID, list[_Waiting]] = {}
        self._running: dict[uuid.UUID, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # How many creates each of the latest batches stored (tests read it).
        self.batch_sizes: deque[int] = deque(maxlen=1000)

    async def create(self, tenant_id: uuid.UUID, job: NewJob, *, now: datetime) -> Created:
        """Store ``job`` (its first due instant computed at ``now``) for the tenant, as
        ``jobs_create_many`` would alone: ``(job, first run, created)``, or its error."""
        if self._running.get(tenant_id, 0) < self._in_flight and tenant_id not in self._queued:
            # Nothing to wait for: stored by this request itself, no hop to another task.
            self._enter(tenant_id)
            try:
                self.batch_sizes.append(1)
                [created] = await self._store.jobs_create_many(tenant_id, jobs=[job], now=now)
                return created
            finally:
                self._leave(tenant_id)
        waiting = _Waiting(job, now)
        self._queued.setdefault(tenant_id, []).append(waiting)
        return await waiting.answer

    def _enter(self, tenant_id: uuid.UUID) -> None:
        self._running[tenant_id] = self._running.get(tenant_id, 0) + 1

    def _leave(self, tenant_id: uuid.UUID) -> None:
        """A store call of the tenant ended: start storing what queued meanwhile."""
        left = self._running[tenant_id] - 1
        if left:
            self._running[tenant_id] = left
        else:
            del self._running[tenant_id]
        if tenant_id in self._queued and left < self._in_flight:
            self._enter(tenant_id)
            task = asyncio.create_task(self._drain(tenant_id), name="cronwheel-create-batch")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _drain(self, tenant_id: uuid.UUID) -> None:
        try:
            queued = self._queued.pop(tenant_id, [])
            batch, rest = queued[: self._max_batch], queued[self._max_batch :]
            if rest:
                self._queued[tenant_id] = rest
            await self._store_batch(tenant_id, batch)
        finally:
            self._leave(tenant_id)

    async def _store_batch(self, tenant_id: uuid.UUID, batch: list[_Waiting]) -> None:
        # A request whose client went away before its turn is not stored.
        live = [w for w in batch if not w.answer.done()]
        if not live:
            return
        self.batch_sizes.append(len(live))
        if len(live) > 1:
            try:
                made = await self._store.jobs_create_many(
                    tenant_id, jobs=[w.job for w in live], now=min(w.now for w in live)
                )
            except Exception:
                pass  # each on its own below, for its own answer
            else:
                for w, created in zip(live, made, strict=True):
                    _answer(w, created)
                return
        for w in live:
            if w.answer.done():
                continue
            try:
                [created] = await self._store.jobs_create_many(tenant_id, jobs=[w.job], now=w.now)
            except Exception as exc:
                if not w.answer.done():
                    w.answer.set_exception(exc)
            else:
                _answer(w, created)


def _answer(waiting: _Waiting, created: Created) -> None:
    if not waiting.answer.done():
        waiting.answer.set_result(created)
