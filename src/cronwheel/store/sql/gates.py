"""The gates of workflow nodes that workers reserved ahead of their upstream nodes'
end (gated reservations, ``docs/reservations.md``), for both drivers.

A node whose upstream nodes are all under way may be reserved while still PENDING.
When its upstream nodes make it ready, its gate *opens* instead: nothing of the node
is written then. The opening is recorded on its workflow run's row (``runs.gates``),
one row however many nodes open at once — a 1,000-node fan-out's opening costs the
upstream's completion one row, where making the nodes ready rewrites a thousand — as

    {"nodes": {run id: [reservation token, group]}, "groups": [{"at": …, "payload": …}]}

each group being nodes opened together with one payload (their upstream results in
it). A node's gate is open while it is PENDING under the very reservation its entry
names: an entry whose reservation went (lapsed, handed back, the node cancelled,
skipped or retried) means nothing, and is dropped at the next write.

Every path that takes a reservation off a PENDING node locks its workflow run first
(:func:`lock_owners`), as advancing does, so an opening and the reservation's end are
never interleaved: a node whose gate opened is made ready by that path
(:func:`release`), and one whose gate had not is left waiting.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.states import RunState
from cronwheel.store.driver import Driver
from cronwheel.store.rows import event_row
from cronwheel.store.schema import runs

__all__ = ["Gates", "Opened", "lock_owners", "opened_of", "release"]

_PENDING = RunState.PENDING.value


class _Core(Protocol):
    driver: Driver

    async def _insert_events(
        self, conn: AsyncConnection, rows: Sequence[dict[str, Any]]
    ) -> None: ...


@dataclass(frozen=True, slots=True, eq=False)  # one per opening: told apart by identity
class Opened:
    """A node's open gate: when it opened, and the payload the node runs with."""

    at: datetime
    payload: dict[str, Any]


class Gates:
    """One workflow run's open gates, as ``runs.gates`` holds them."""

    def __init__(self, value: Any = None) -> None:
        self.nodes: dict[uuid.UUID, tuple[int, int]] = {}
        self.groups: list[Opened] = []
        if isinstance(value, dict):
            self.groups = [
                Opened(datetime.fromisoformat(g["at"]), g["payload"]) for g in value["groups"]
            ]
            self.nodes = {uuid.UUID(k): (int(t), int(g)) for k, (t, g) in value["nodes"].items()}

    def opened(self, run_id: uuid.UUID, token: int | None) -> Opened | None:
        """The open gate of node ``run_id`` while it is PENDING under reservation
        ``token`` (None: not open)."""
        entry = self.nodes.get(run_id)
        if entry is None or token is None or entry[0] != token:
            return None
        return self.groups[entry[1]]

    def open(self, held: Mapping[uuid.UUID, int], at: datetime, payload: dict[str, Any]) -> None:
        """Open the gates of the nodes ``held`` (run id -> reservation token) together."""
        self.groups.append(Opened(at, payload))
        group = len(self.groups) - 1
        self.nodes.update({run_id: (token, group) for run_id, token in held.items()})

    def value(self, live: Iterable[uuid.UUID]) -> dict[str, Any] | None:
        """The JSON to store, keeping only the nodes ``live`` (still PENDING under
        their entry's reservation) and the groups they are of (None: none)."""
        keep = {run_id: self.nodes[run_id] for run_id in live if run_id in self.nodes}
        if not keep:
            return None
        used = sorted({g for _, g in keep.values()})
        renumber = {g: i for i, g in enumerate(used)}
        return {
            "nodes": {str(k): [t, renumber[g]] for k, (t, g) in keep.items()},
            "groups": [
                {"at": self.groups[g].at.isoformat(), "payload": self.groups[g].payload}
                for g in used
            ],
        }


async def opened_of(
    driver: Driver, conn: AsyncConnection, nodes: Sequence[Any]
) -> dict[uuid.UUID, Opened]:
    """Of ``nodes`` (rows with ``id``, ``workflow_run_id``, ``reserved_token``: PENDING
    nodes as read), those whose gate is open, by run id: one read of their workflow
    runs' gates."""
    owners = sorted({n.workflow_run_id for n in nodes if n.workflow_run_id is not None})
    if not owners:
        return {}
    found = {
        r.id: Gates(r.gates)
        for r in await conn.execute(
            sa.select(runs.c.id, runs.c.gates).where(
                driver.id_in(runs.c.id, owners), runs.c.gates.is_not(None)
            )
        )
    }
    out: dict[uuid.UUID, Opened] = {}
    for n in nodes:
        gates = found.get(n.workflow_run_id)
        opened = None if gates is None else gates.opened(n.id, n.reserved_token)
        if opened is not None:
            out[n.id] = opened
    return out


async def lock_owners(
    driver: Driver,
    conn: AsyncConnection,
    node_ids: Sequence[uuid.UUID],
    *,
    skip_locked: bool = False,
) -> set[uuid.UUID]:
    """Lock the workflow runs of the PENDING nodes ``node_ids``, in id order, before a
    reservation of theirs is taken off (see the module's notes). Returns the workflow
    runs locked (with ``skip_locked``, those another transaction holds are passed over:
    leave their nodes alone)."""
    owners = sa.select(runs.c.workflow_run_id).where(
        driver.id_in(runs.c.id, list(node_ids)),
        runs.c.state == _PENDING,
        runs.c.workflow_run_id.is_not(None),
    )
    locked = await conn.execute(
        sa.select(runs.c.id)
        .where(runs.c.id.in_(owners.scalar_subquery()))
        .order_by(runs.c.id)
        .with_for_update(skip_locked=skip_locked)
    )
    return set(locked.scalars())


async def release(
    core: _Core,
    conn: AsyncConnection,
    nodes: Sequence[Any],
    *,
    at: datetime,
    actor: str | None,
    reason: str,
) -> list[str]:
    """Take the reservations off the PENDING nodes ``nodes`` (rows with ``id``,
    ``workflow_run_id``, ``reserved_token``, as read under their workflow runs' locks):
    one whose gate opened is made ready for any worker — DISPATCHED, due since the
    opening, with the payload it gave — and one whose gate had not waits on, for any
    worker to reserve. Returns the pools of those made ready (to notify)."""
    if not nodes:
        return []
    opened = await opened_of(core.driver, conn, nodes)
    waiting = [n.id for n in nodes if n.id not in opened]
    unreserved = {
        "reserved_by": None,
        "reserved_attempt": None,
        "reserved_token": None,
        "reserved_until": None,
    }
    if waiting:
        await conn.execute(
            runs.update()
            .where(core.driver.id_in(runs.c.id, waiting), runs.c.state == _PENDING)
            .values(**unreserved)
        )
    pools: set[str] = set()
    events: list[dict[str, Any]] = []
    for gate, ids in _by_gate(opened).items():
        rows = await conn.execute(
            runs.update()
            .where(core.driver.id_in(runs.c.id, ids), runs.c.state == _PENDING)
            .values(
                state=RunState.DISPATCHED.value,
                fire_at=gate.at,
                dispatched_at=at,
                payload=gate.payload,
                reason=None,
                **unreserved,
            )
            .returning(runs.c.id, runs.c.tenant_id, runs.c.job_id, runs.c.pool)
        )
        for r in rows:
            pools.add(r.pool)
            events.append(
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=r.tenant_id,
                    job_id=r.job_id,
                    run_id=r.id,
                    from_state=_PENDING,
                    to_state=RunState.DISPATCHED.value,
                    actor=actor,
                    reason=reason,
                )
            )
    await core._insert_events(conn, events)
    return sorted(pools)


def _by_gate(opened: Mapping[uuid.UUID, Opened]) -> dict[Opened, list[uuid.UUID]]:
    """Nodes grouped by the opening they share (one UPDATE per group)."""
    groups: dict[Opened, list[uuid.UUID]] = {}
    for run_id, gate in opened.items():
        groups.setdefault(gate, []).append(run_id)
    return groups
