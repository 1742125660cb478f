"""What the end-to-end tests read back: every run's recorded transitions."""

from __future__ import annotations

import uuid
from collections import defaultdict

from cronwheel.store import Store

__all__ = ["transitions"]

Transition = tuple[str | None, str | None]


async def transitions(store: Store, tenant_id: uuid.UUID) -> dict[uuid.UUID, list[Transition]]:
    """Each run of the tenant: its ``(from_state, to_state)`` pairs, oldest first."""
    out: dict[uuid.UUID, list[Transition]] = defaultdict(list)
    cursor = None
    while True:
        page = await store.events_list(tenant_id, cursor=cursor, limit=5000)
        for e in page.items:
            if e.kind == "run.transition" and e.run_id is not None:
                out[e.run_id].append((e.from_state, e.to_state))
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor
