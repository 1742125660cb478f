"""The gates of workflow nodes that workers reserved ahead of their upstream nodes'
end (gated reservations, ``docs/reservations.md``), for both drivers.

A node whose upstream nodes are all under way may be reserved while still PENDING.
When its upstream nodes make it ready, its gate *opens* instead: nothing of the node
is written then. The opening is recorded on its workflow run's row (``runs.gates``),
one row however many nodes open at once — a 1,000-node fan-out's opening costs the
upstream's completion one row, where making the nodes ready rewrites a thousand — as

    {"tokens": {reservation token: group}, "groups": [{"at": …, "payload": …}]}

each group being nodes opened together with one payload (their upstream results in
it). A node's gate is open while it is PENDING under the very reservation an entry
names (tokens are never reused): an entry whose reservation went (lapsed, handed back,
the node cancelled, skipped or retried) means nothing, and is dropped at the next
write.

Every path that takes a reservation off a node and leaves it waiting — a lapse, a
hand-back — locks its workflow run first (:func:`lock_nodes`), as advancing does, so an
opening and the reservation's end are never interleaved: a node whose gate opened is
made ready by that path (:func:`release`), and one whose gate had not is left waiting.
An opened gate gives its holder the node's heartbeat timeout from the opening to start
it, whatever was left of the reservation (:func:`lapsed`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.states import JobState, RunState
from cronwheel.store.driver import Driver
from cronwheel.store.rows import event_row
from cronwheel.store.schema import NO_RESERVATION, PARKED_FIRE_AT, jobs, runs

__all__ = ["Gates", "Opened", "lapsed", "lock_nodes", "opened_of", "release"]

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
        # By token as text, as stored: read for a few nodes, never all parsed.
        self.tokens: dict[str, int] = {}
        self.groups: list[Opened] = []
        if isinstance(value, dict):
            self.groups = [
                Opened(datetime.fromisoformat(g["at"]), g["payload"]) for g in value["groups"]
            ]
            self.tokens = value["tokens"]

    def opened(self, token: int | None) -> Opened | None:
        """The open gate of the node PENDING under reservation ``token`` (None: not
        open)."""
        group = None if token is None else self.tokens.get(str(token))
        return None if group is None else self.groups[group]

    def open(self, tokens: Iterable[int], at: datetime, payload: dict[str, Any]) -> None:
        """Open the gates of the nodes reserved under ``tokens``, together."""
        self.groups.append(Opened(at, payload))
        group = len(self.groups) - 1
        self.tokens.update(dict.fromkeys(map(str, tokens), group))

    def value(self, live: Iterable[int]) -> dict[str, Any] | None:
        """The JSON to store, keeping only the tokens ``live`` (their nodes still
        PENDING under them) and the groups they are of (None: none)."""
        keep = {k: self.tokens[k] for k in map(str, live) if k in self.tokens}
        if not keep:
            return None
        used = sorted(set(keep.values()))
        renumber = {g: i for i, g in enumerate(used)}
        return {
            "tokens": {k: renumber[g] for k, g in keep.items()},
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
        opened = None if gates is None else gates.opened(n.reserved_token)
        if opened is not None:
            out[n.id] = opened
    return out


async def lock_nodes(
    driver: Driver,
    conn: AsyncConnection,
    which: sa.ColumnElement[bool],
    *,
    skip_locked: bool = False,
) -> list[Any]:
    """Lock the PENDING reserved nodes ``which`` selects, their
    workflow runs first, in id order, then the nodes, in id order (see the module's
    notes), and return the nodes as read then: ``id``, ``workflow_run_id``,
    ``reserved_token``, ``reserved_attempt``, ``reserved_until``, ``heartbeat_timeout``. With
    ``skip_locked``, what another transaction holds is passed over (left for later)."""
    waiting = sa.and_(
        which,
        runs.c.state == _PENDING,
        runs.c.reserved_token.is_not(None),
        runs.c.workflow_run_id.is_not(None),
    )
    found = sa.select(runs.c.id, runs.c.workflow_run_id).where(waiting)
    candidates = (await conn.execute(found)).all()
    if not candidates:
        return []
    owners = (
        await conn.execute(
            sa.select(runs.c.id)
            .where(driver.id_in(runs.c.id, sorted({c.workflow_run_id for c in candidates})))
            .order_by(runs.c.id)
            .with_for_update(skip_locked=skip_locked)
        )
    ).scalars()
    locked = set(owners)
    ids = [c.id for c in candidates if c.workflow_run_id in locked]
    if not ids:
        return []
    return list(
        (
            await conn.execute(
                sa.select(
                    runs.c.id,
                    runs.c.workflow_run_id,
                    runs.c.reserved_token,
                    runs.c.reserved_attempt,
                    runs.c.reserved_until,
                    runs.c.heartbeat_timeout,
                )
                .where(driver.id_in(runs.c.id, ids), waiting)
                .order_by(runs.c.id)
                .with_for_update(skip_locked=skip_locked)
            )
        ).all()
    )


def lapsed(nodes: Sequence[Any], opened: Mapping[uuid.UUID, Opened], at: datetime) -> list[Any]:
    """Of ``nodes`` (as :func:`lock_nodes` reads them) whose reservation ended by its
    time, those whose holder's time is really up at ``at``: an opened gate gives its
    holder the node's heartbeat timeout from the opening, whatever was left of the
    reservation (the worker reckons its attempt's lease from there)."""
    out = []
    for n in nodes:
        gate = opened.get(n.id)
        end = n.reserved_until
        if gate is not None:
            end = max(end, gate.at + timedelta(seconds=n.heartbeat_timeout))
        if end < at:
            out.append(n)
    return out


async def release(
    core: _Core,
    conn: AsyncConnection,
    nodes: Sequence[Any],
    *,
    at: datetime,
    actor: str | None,
    reason: str,
) -> list[str]:
    """Take the reservations off the PENDING nodes ``nodes`` (as :func:`lock_nodes`
    reads them, under their workflow runs' locks): one whose gate opened is made ready
    for any worker — DISPATCHED, due since the opening, with the payload it gave; or
    SCHEDULED and parked when its workflow is paused now, as advancing would have made
    it — and one whose gate had not waits on, for any worker to reserve. Returns the
    pools of those made ready (to notify)."""
    if not nodes:
        return []
    opened = await opened_of(core.driver, conn, nodes)
    waiting = [n.id for n in nodes if n.id not in opened]
    if waiting:
        await conn.execute(
            runs.update()
            .where(core.driver.id_in(runs.c.id, waiting), runs.c.state == _PENDING)
            .values(**NO_RESERVATION)
        )
    on_hold = await _on_hold(core.driver, conn, [n for n in nodes if n.id in opened])
    pools: set[str] = set()
    events: list[dict[str, Any]] = []
    for (gate, held), ids in _by_gate(opened, on_hold).items():
        target = RunState.SCHEDULED if held else RunState.DISPATCHED
        rows = await conn.execute(
            runs.update()
            .where(core.driver.id_in(runs.c.id, ids), runs.c.state == _PENDING)
            .values(
                state=target.value,
                fire_at=PARKED_FIRE_AT if held else gate.at,
                dispatched_at=None if held else at,
                payload=gate.payload,
                reason="job paused" if held else None,
                **NO_RESERVATION,
            )
            .returning(runs.c.id, runs.c.tenant_id, runs.c.job_id, runs.c.pool)
        )
        for r in rows:
            if not held:
                pools.add(r.pool)
            events.append(
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=r.tenant_id,
                    job_id=r.job_id,
                    run_id=r.id,
                    from_state=_PENDING,
                    to_state=target.value,
                    actor=actor,
                    reason="job paused" if held else reason,
                )
            )
    await core._insert_events(conn, events)
    return sorted(pools)


async def _on_hold(driver: Driver, conn: AsyncConnection, nodes: Sequence[Any]) -> set[uuid.UUID]:
    """Of ``nodes``, those whose workflow is paused and whose workflow run was not
    triggered (a trigger asked for it to run now, pause or not)."""
    owners = sorted({n.workflow_run_id for n in nodes})
    if not owners:
        return set()
    held = {
        r.id
        for r in await conn.execute(
            sa.select(runs.c.id)
            .select_from(runs.join(jobs, jobs.c.id == runs.c.job_id))
            .where(
                driver.id_in(runs.c.id, owners),
                runs.c.origin != "trigger",
                jobs.c.state == JobState.PAUSED.value,
            )
        )
    }
    return {n.id for n in nodes if n.workflow_run_id in held}


def _by_gate(
    opened: Mapping[uuid.UUID, Opened], on_hold: set[uuid.UUID]
) -> dict[tuple[Opened, bool], list[uuid.UUID]]:
    """Nodes grouped by the opening they share, and held or not (one UPDATE each)."""
    groups: dict[tuple[Opened, bool], list[uuid.UUID]] = {}
    for run_id, gate in opened.items():
        groups.setdefault((gate, run_id in on_hold), []).append(run_id)
    return groups
