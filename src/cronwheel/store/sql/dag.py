"""Advancing workflow runs, for both drivers: starting a fired workflow run, and after
any of its node runs ends, making the nodes whose trigger rule now holds ready and
skipping those whose rule never can (``domain/workflow.py`` decides; this applies).

Every path that ends a node run — a worker's result or failure, the expiry sweep, a
cancel, a quarantine — calls :func:`advance` in the transaction that ends it, so the
DAG moves on with the commit that makes it possible, and a crash loses neither: both
are written or neither is. :func:`advance` locks the workflow runs it advances, so two
node runs of one workflow run ending at once are decided one after the other, each
seeing the other's outcome. It reads the workflow run's node states and decides from
them alone, so it is idempotent: running it again changes nothing.

Node runs are created PENDING with their workflow run, all at once. A node made ready
gets its upstream results in its payload and goes DISPATCHED at once (SCHEDULED and
parked while its workflow is paused); workers lease it like any run, under the
tenant's limits and priorities. A node whose payload would then be over the store's
``node_input_limit`` fails instead (OVERSIZE), and its dependents are decided as after
any failure, in the same walk of the DAG.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from cronwheel.domain.errors import ConflictError
from cronwheel.domain.new_job import json_size_over
from cronwheel.domain.states import (
    AWAIT,
    CONCLUDE,
    OVERSIZE,
    READY,
    REOPEN,
    REWIND,
    START,
    TERMINAL_STATES,
    UNSATISFIED,
    JobState,
    RunState,
)
from cronwheel.domain.workflow import (
    UPSTREAM_DONE,
    Dag,
    DagNode,
    Decisions,
    armable,
    cached_dag,
    dag_of,
    decide,
    never_runs,
    node_payload,
)
from cronwheel.ids import new_id
from cronwheel.jsontext import canonical
from cronwheel.store.driver import Driver
from cronwheel.store.notices import (
    CHANNEL_GATES,
    CHANNEL_RUNS_READY,
    ready_notices,
    worker_notice,
)
from cronwheel.store.rows import event_row, new_run_row
from cronwheel.store.schema import NO_RESERVATION, PARKED_FIRE_AT, jobs, runs
from cronwheel.store.sql.gates import Gates
from cronwheel.store.sql.statements import insert_ignoring, jobs_finish_one_off, update_each


class _Core(Protocol):
    """What advancing needs of the store it runs in (``store/sql/core.SqlCore``)."""

    driver: Driver
    node_input_limit: int

    async def _insert_events(
        self, conn: AsyncConnection, rows: Sequence[dict[str, Any]]
    ) -> None: ...

    async def _notify(
        self, conn: AsyncConnection, channel: str, payloads: Sequence[str]
    ) -> None: ...


__all__ = ["advance", "dags_of", "refuse_unrunnable", "reopen", "start"]

_STATES = {s.value: s for s in RunState}  # a lookup, not RunState(...): 1,000 a batch
_PENDING = RunState.PENDING.value

# Runs to write the same values to: ``({column: value}, run ids)``.
_Alike = tuple[dict[str, Any], list[uuid.UUID]]


async def dags_of(
    core: _Core, conn: AsyncConnection, job_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, Dag]:
    """The DAG of each workflow among ``job_ids`` (cached: they never change)."""
    wanted = set(job_ids)
    out = {j: dag for j in wanted if (dag := cached_dag(j)) is not None}
    missing = wanted - set(out)
    if missing:
        rows = await conn.execute(
            sa.select(jobs.c.id, jobs.c.workflow).where(
                core.driver.id_in(jobs.c.id, list(missing)), jobs.c.workflow.is_not(None)
            )
        )
        for r in rows:
            out[r.id] = dag_of(r.id, r.workflow)
    return out


async def start(
    core: _Core,
    conn: AsyncConnection,
    run_ids: Sequence[uuid.UUID],
    *,
    at: datetime,
    actor: str | None,
) -> None:
    """Start the workflow runs ``run_ids``, DISPATCHED in this transaction: each goes
    RUNNING, its nodes are created PENDING, and its roots are made ready."""
    if not run_ids:
        return
    started = (
        await conn.execute(
            runs.update()
            .where(core.driver.id_in(runs.c.id, list(run_ids)), runs.c.state == START.source)
            .values(state=RunState.RUNNING.value, started_at=at, reason=None)
            .returning(
                runs.c.id,
                runs.c.tenant_id,
                runs.c.job_id,
                runs.c.job_name,
                runs.c.shard,
                runs.c.due_at,
                runs.c.fire_at,
                runs.c.payload,
            )
        )
    ).all()
    if not started:
        return
    dags = await dags_of(core, conn, {r.job_id for r in started})
    rows: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for w in started:
        events.append(
            _event(w, w.id, START.source, RunState.RUNNING, at, actor, "workflow run started")
        )
        for node in dags[w.job_id].nodes:
            run_id = new_id()
            row = new_run_row(
                run_id=run_id,
                tenant_id=w.tenant_id,
                job_id=w.job_id,
                name=w.job_name,
                template=node.template,
                due_at=w.due_at,
                due_local=None,
                shard=w.shard,
                at=at,
                origin="node",
                fire_at=max(w.fire_at, at),
                state=RunState.PENDING,
            )
            row["payload"] = {**node.template.payload, **(w.payload or {})}
            row["workflow_run_id"] = w.id
            row["node"] = node.name
            row["reason"] = _waiting(node.after)
            rows.append(row)
            events.append(
                event_row(
                    at=at,
                    kind="run.transition",
                    tenant_id=w.tenant_id,
                    job_id=w.job_id,
                    run_id=run_id,
                    to_state=RunState.PENDING.value,
                    actor=actor,
                    reason="workflow run started",
                    data={"node": node.name, "workflow_run_id": str(w.id)},
                )
            )
    await insert_ignoring(conn, core.driver, runs, rows)
    await core._insert_events(conn, events)
    await advance(core, conn, [w.id for w in started], at=at, actor=actor)


_AWAIT_REASON = "retried: waits for its upstream nodes"
# A node waiting again: for its upstream nodes as they now are (not held ahead of them
# under what a reservation or a gate said of an earlier stint).
_WAITS_AGAIN: dict[str, Any] = {
    "state": RunState.PENDING.value,
    "gated_at": None,
    **NO_RESERVATION,
}


def _waiting(after: Sequence[str]) -> str | None:
    if not after:
        return None
    shown = ", ".join(after[:10]) + (f" and {len(after) - 10} more" if len(after) > 10 else "")
    return f"waiting for {shown}"


async def advance(
    core: _Core,
    conn: AsyncConnection,
    workflow_run_ids: Iterable[uuid.UUID],
    *,
    at: datetime,
    actor: str | None,
) -> None:
    """Decide every waiting node of the RUNNING workflow runs ``workflow_run_ids`` from
    their nodes' states, and end the workflow runs whose nodes have all ended."""
    ids = sorted(set(workflow_run_ids))
    if not ids:
        return
    owners = (
        await conn.execute(
            sa.select(
                runs.c.id,
                runs.c.tenant_id,
                runs.c.job_id,
                runs.c.cancel_requested,
                runs.c.payload,
                runs.c.fire_at,
                runs.c.reason,
                runs.c.origin,
                runs.c.gates,
            )
            .where(core.driver.id_in(runs.c.id, ids), runs.c.state == RunState.RUNNING.value)
            .order_by(runs.c.id)
            .with_for_update()  # one decision at a time per workflow run
        )
    ).all()
    if not owners:
        return
    # Only what deciding needs: a completion batch of a 1,000-node fan-in reads its
    # nodes' states at each batch, and most batches make nothing ready.
    nodes = await core.driver.dag_nodes(conn, workflow_run_ids=[w.id for w in owners], at=at)
    # By workflow run, each node's run id and state (as tuples: 1,000 rows a batch). A
    # node whose gate opened is as good as ready: its holder is beginning it.
    node_ids: dict[uuid.UUID, dict[str, uuid.UUID]] = {w.id: {} for w in owners}
    node_states: dict[uuid.UUID, dict[str, RunState]] = {w.id: {} for w in owners}
    gates = {w.id: Gates(w.gates) for w in owners}
    opened: dict[uuid.UUID, list[int]] = {w.id: [] for w in owners}  # gates open: tokens
    held: dict[uuid.UUID, tuple[int, uuid.UUID]] = {}  # reserved ahead: token, holder
    gated: set[uuid.UUID] = set()  # may be reserved so already
    for run_id, owner, name, state, token, held_now, holder, was_armed in nodes:
        node_ids[owner][name] = run_id
        node_states[owner][name] = _STATES[state]
        if was_armed:
            gated.add(run_id)
        if state != _PENDING or token is None:
            continue
        if gates[owner].opened(token) is not None:
            node_states[owner][name] = RunState.DISPATCHED
            opened[owner].append(token)
        elif held_now and holder is not None:  # past its time, it is any worker's again
            held[run_id] = (token, holder)
    dags = await dags_of(core, conn, {w.job_id for w in owners})
    decided_runs: list[_Decided] = []
    for w in owners:
        dag = dags[w.job_id]
        mine, states = node_ids[w.id], node_states[w.id]
        if len(mine) < len(dag.nodes):
            continue  # nodes not all created: not this workflow run's DAG (never so)
        decided = decide(dag, states, cancelled=w.cancel_requested)
        decided_runs.append(_Decided(w, dag, mine, states, decided))
    results, paused = await _ready_details(core, conn, [d for d in decided_runs if d.decided.ready])
    groups = {d.run.id: _alike(d, results) for d in decided_runs}
    # A node whose input would be over the limit fails instead of being made ready, and
    # its dependents are decided as after any failure: its workflow run is decided
    # again, in one walk, with every result a node of it could be given.
    limit = core.node_input_limit
    unfit = [
        d
        for d in decided_runs
        if any(json_size_over(g.payload, limit) is not None for g in groups[d.run.id])
    ]
    if unfit:
        results.update(await _succeeded_results(core, conn, [d.run.id for d in unfit]))
        redone = {
            d.run.id: d._replace(
                decided=decide(
                    d.dag,
                    d.states,
                    cancelled=d.run.cancel_requested,
                    unfit=_TooLarge(d, results, limit),
                )
            )
            for d in unfit
        }
        decided_runs = [redone.get(d.run.id, d) for d in decided_runs]
        groups.update({i: _alike(d, results) for i, d in redone.items()})
    ready_sets: list[_Alike] = []
    gates_rows: list[dict[str, Any]] = []  # workflow runs whose gates changed
    holders: set[uuid.UUID] = set()  # workers whose gated nodes opened or went
    # Nodes that may now be reserved ahead of their gate, by their workflow's job.
    arming: dict[uuid.UUID, list[uuid.UUID]] = {}
    ended_sets: list[_Alike] = []  # nodes that end without running: skipped, failed
    ended_rows: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    notices: list[tuple[str, datetime]] = []
    finished_jobs: list[uuid.UUID] = []
    for w, dag, mine, states, decided in decided_runs:
        by_name = dag.by_name
        # A triggered workflow run is not held by its workflow's pause, as a paused
        # job's triggered run is not: the trigger asked for it to run now.
        on_hold = w.job_id in paused and w.origin != "trigger"
        target = RunState.SCHEDULED if on_hold else RunState.DISPATCHED
        # A root of a workflow run fired ahead of its instant starts at the instant (a
        # later node is made ready after it: at is past that instant).
        fire_at = max(w.fire_at, at)
        # Nodes that end without running — failed over the input limit, or skipped — in
        # the order the walk decided them, each after what made it so; then those made
        # ready (nothing is decided by a node made ready: it has not ended).
        ended = [
            (name, reason, OVERSIZE, RunState.FAILED) for name, reason in decided.failed.items()
        ] + [
            (name, reason, UNSATISFIED, RunState.SKIPPED)
            for name, reason in decided.skipped.items()
        ]
        if decided.failed and decided.skipped:
            rank = {n.name: i for i, n in enumerate(dag.order)}
            ended.sort(key=lambda e: rank[e[0]])
        for name, reason, move, end in ended:
            # (A reservation of it, held ahead of its gate, is void: the holder drops it.)
            closed: dict[str, Any] = {
                "state": end.value,
                "finished_at": at,
                "reason": reason,
                **NO_RESERVATION,
            }
            ended_sets.append((closed, [mine[name]]))
            events.append(_event(w, mine[name], move.source, end, at, actor, reason))
            if mine[name] in held:
                holders.add(held[mine[name]][1])
        mine_gates = gates[w.id]
        newly: list[int] = []  # tokens of gates opened now
        for group in groups[w.id]:
            first = by_name[group.names[0]]
            ids = [mine[n] for n in group.names]
            # Nodes a worker holds ahead of their gate: the gate opens, one write on
            # this workflow run's row for them all; the holder begins them and records
            # their starts (their READY transition, dated now, is written then).
            reserved = {i: held[i][0] for i in ids if i in held}
            holders.update(held[i][1] for i in reserved)  # told: opened, or gone
            if on_hold:
                reserved = {}  # parked instead: the reservation is void
            if reserved:
                mine_gates.open(reserved.values(), at, group.payload)
                newly += reserved.values()
                ids = [i for i in ids if i not in reserved]
                if not ids:
                    continue
            values = {
                "state": target.value,
                "fire_at": PARKED_FIRE_AT if on_hold else fire_at,
                "dispatched_at": None if on_hold else at,
                "payload": group.payload,
                "reason": "job paused" if on_hold else None,
                **NO_RESERVATION,
            }
            ready_sets.append((values, ids))
            if not on_hold:
                notices.append((first.template.pool, fire_at))  # alike: one template
            why = _ready_reason(() if group.root else first.after)
            event = _event(w, ids[0], READY.source, target, at, actor, why)
            events.extend({**event, "run_id": run_id} for run_id in ids)
        if newly or (decided.outcome is not None and w.gates is not None):
            # The gates open now, and those still open: none once the run has ended.
            live = [] if decided.outcome is not None else opened[w.id] + newly
            gates_rows.append({"id": w.id, "gates": mine_gates.value(live)})
        if not w.cancel_requested:
            arming.setdefault(w.job_id, []).extend(
                mine[n] for n in armable(dag, states, decided) if mine[n] not in gated
            )
        if decided.outcome is not None:
            # Cancelled: with the reason its cancel was asked with, if one was given.
            ending: str | None = (w.cancel_requested and w.reason) or decided.reason
            ended_rows.append(
                {"id": w.id, "state": decided.outcome.value, "finished_at": at, "reason": ending}
            )
            events.append(_event(w, w.id, CONCLUDE.source, decided.outcome, at, actor, ending))
            finished_jobs.append(w.job_id)
    # A waiting node is cancelled without its workflow run's lock (a job's or a tenant's
    # cancel reaches runs by their own rows): each node moves only if still waiting.
    waiting = runs.c.state == READY.source.value
    await _update_alike(core, conn, ready_sets, where=waiting)
    await _update_alike(core, conn, ended_sets, where=waiting)
    await update_each(conn, runs, ended_rows)
    await update_each(conn, runs, gates_rows)
    await core._insert_events(conn, events)
    await jobs_finish_one_off(conn, core.driver, finished_jobs, at, workflows=True)
    # Not a paused workflow's: its nodes would be parked when ready, not begun.
    looked = {d.run.job_id for d in decided_runs if d.decided.ready}
    armed = [
        i
        for job in await _not_paused(core, conn, arming, paused=paused, looked=looked)
        for i in arming[job]
    ]
    if armed:
        await conn.execute(
            runs.update()
            .where(core.driver.id_in(runs.c.id, armed), waiting, runs.c.gated_at.is_(None))
            .values(gated_at=at)
        )
    if notices:
        await core._notify(conn, CHANNEL_RUNS_READY, ready_notices(notices, at))
    if holders:
        await core._notify(conn, CHANNEL_GATES, sorted(worker_notice(h) for h in holders))


class _Group(NamedTuple):
    """Nodes made ready alike — the same own payload, the same succeeded upstream
    nodes, roots or not — with the payload they get and one event, copied: a
    fan-out's 1,000 nodes are one group."""

    names: list[str]
    root: bool
    payload: dict[str, Any]


# What makes nodes alike: their own payload, their succeeded upstream nodes, root or not.
_GroupKey = tuple[bytes, tuple[str, ...], bool]


def _group_key(d: _Decided, node: DagNode, states: Mapping[str, RunState]) -> _GroupKey:
    return d.dag.payload_keys[node.name], _succeeded(node.after, states), not node.after


def _succeeded(after: Sequence[str], states: Mapping[str, RunState]) -> tuple[str, ...]:
    return tuple(u for u in after if states[u] is RunState.SUCCESS)


def _input(
    d: _Decided, node: DagNode, key: _GroupKey, results: dict[uuid.UUID, Any]
) -> dict[str, Any]:
    """The payload ``node`` of ``d`` is given, its group being ``key``."""
    upstream = {u: results[d.nodes[u]] for u in key[1]}
    return node_payload(node.template, _extra(d.run.payload), upstream)


def _alike(d: _Decided, results: dict[uuid.UUID, Any]) -> list[_Group]:
    """The nodes ``d`` makes ready, in groups alike, each with its payload."""
    dag, states = d.dag, d.states
    alike: dict[_GroupKey, list[str]] = {}
    ups_of: dict[int, tuple[str, ...]] = {}  # by after_class: once for a fan-out
    for name in d.decided.ready:
        after = dag.by_name[name].after
        ups = ups_of.get(dag.after_class[name])
        if ups is None:
            ups = ups_of[dag.after_class[name]] = _succeeded(after, states)
        alike.setdefault((dag.payload_keys[name], ups, not after), []).append(name)
    return [
        _Group(names, key[2], _input(d, dag.by_name[names[0]], key, results))
        for key, names in alike.items()
    ]


class _TooLarge:
    """:data:`~cronwheel.domain.workflow.Unfit` for the nodes of one workflow run: a
    node whose payload, with the results of its succeeded upstream nodes, is over
    ``limit`` bytes of JSON. Measured once per group of nodes alike (a fan-out's 1,000
    nodes are one: each measure of a large input costs milliseconds)."""

    def __init__(self, d: _Decided, results: dict[uuid.UUID, Any], limit: int) -> None:
        self.d, self.results, self.limit = d, results, limit
        self.found: dict[_GroupKey, str | None] = {}

    def __call__(self, node: DagNode, now: Mapping[str, RunState]) -> str | None:
        key = _group_key(self.d, node, now)
        if key not in self.found:
            size = json_size_over(_input(self.d, node, key, self.results), self.limit)
            self.found[key] = None if size is None else _oversize_reason(size, self.limit)
        return self.found[key]


async def _succeeded_results(
    core: _Core, conn: AsyncConnection, workflow_run_ids: list[uuid.UUID]
) -> dict[uuid.UUID, Any]:
    """The result of every succeeded node of the workflow runs, by run id."""
    rows = await conn.execute(
        sa.select(runs.c.id, runs.c.result).where(
            core.driver.id_in(runs.c.workflow_run_id, workflow_run_ids),
            runs.c.state == RunState.SUCCESS.value,
        )
    )
    return {run_id: result for run_id, result in rows}


class _Decided(NamedTuple):
    """A workflow run being advanced: its row, DAG, node run ids and states by name,
    and what :func:`decide` made of them."""

    run: Any
    dag: Dag
    nodes: dict[str, uuid.UUID]
    states: dict[str, RunState]
    decided: Decisions


async def _ready_details(
    core: _Core, conn: AsyncConnection, ready: Sequence[_Decided]
) -> tuple[dict[uuid.UUID, Any], set[uuid.UUID]]:
    """For workflow runs with nodes to make ready: the result of each of their
    succeeded upstream nodes, by run id (what their payloads pass on); and which of
    their workflows are paused — read here, by a statement of its own after the
    workflow runs are locked: read with the lock, a pause committed while the lock was
    waited for would not be seen (PostgreSQL reads again only the row it locked)."""
    if not ready:
        return {}, set()
    wanted: set[uuid.UUID] = set()
    names: set[str] = set()
    for d in ready:
        # Once per distinct set of upstream nodes: a fan-out's 1,000 nodes share one.
        seen = {d.dag.after_class[name]: name for name in d.decided.ready}
        for name in seen.values():
            up = _succeeded(d.dag.by_name[name].after, d.states)
            names.update(up)
            wanted.update(d.nodes[u] for u in up)
    # Read through the workflow runs' nodes index: a fan-in's sink needs them all.
    results = (
        {
            run_id: result
            for run_id, result in await conn.execute(
                sa.select(runs.c.id, runs.c.result).where(
                    core.driver.id_in(runs.c.workflow_run_id, [d.run.id for d in ready]),
                    core.driver.id_in(runs.c.node, sorted(names)),
                )
            )
            if run_id in wanted
        }
        if wanted
        else {}
    )
    paused = {
        r.id
        for r in await conn.execute(
            sa.select(jobs.c.id).where(
                core.driver.id_in(jobs.c.id, list({d.run.job_id for d in ready})),
                jobs.c.state == JobState.PAUSED.value,
            )
        )
    }
    return results, paused


async def _not_paused(
    core: _Core,
    conn: AsyncConnection,
    by_job: Mapping[uuid.UUID, list[uuid.UUID]],
    *,
    paused: set[uuid.UUID],
    looked: set[uuid.UUID],
) -> list[uuid.UUID]:
    """The jobs of ``by_job`` with something in it that are not paused: ``paused``, of
    those ``looked`` at already, and the others read now."""
    wanted = [j for j, ids in by_job.items() if ids]
    unread = [j for j in wanted if j not in looked]
    paused = set(paused)
    if unread:
        paused |= {
            r.id
            for r in await conn.execute(
                sa.select(jobs.c.id).where(
                    core.driver.id_in(jobs.c.id, unread), jobs.c.state == JobState.PAUSED.value
                )
            )
        }
    return [j for j in wanted if j not in paused]


async def _update_alike(
    core: _Core,
    conn: AsyncConnection,
    sets: list[_Alike],
    *,
    where: sa.ColumnElement[bool],
) -> None:
    """Write each set's values to its runs, one statement per distinct set of values:
    the 1,000 nodes a fan-out makes ready at once share theirs, and so do the roots of
    many workflow runs fired together, so they take one UPDATE instead of 1,000."""
    alike: dict[bytes, _Alike] = {}
    for values, ids in sets:
        alike.setdefault(canonical(values), (values, []))[1].extend(ids)
    singles = [{"id": ids[0], **values} for values, ids in alike.values() if len(ids) == 1]
    await update_each(conn, runs, singles, where=where)
    for values, ids in alike.values():
        if len(ids) > 1:
            await conn.execute(
                runs.update().where(core.driver.id_in(runs.c.id, ids), where).values(**values)
            )


def _extra(payload: Any) -> dict[str, Any]:
    return payload if isinstance(payload, dict) else {}


def _oversize_reason(size: int, limit: int) -> str:
    return (
        f"input too large: its payload with its upstream nodes' results is {size} bytes "
        f"of JSON; the limit is {limit} (have upstream nodes return references, not data)"
    )


def _ready_reason(after: Sequence[str]) -> str:
    return "workflow run started" if not after else UPSTREAM_DONE


def _event(
    w: Any,
    run_id: uuid.UUID,
    source: RunState,
    target: RunState,
    at: datetime,
    actor: str | None,
    reason: str | None,
) -> dict[str, Any]:
    return event_row(
        at=at,
        kind="run.transition",
        tenant_id=w.tenant_id,
        job_id=w.job_id,
        run_id=run_id,
        from_state=source.value,
        to_state=target.value,
        actor=actor,
        reason=reason,
    )


async def refuse_unrunnable(core: _Core, conn: AsyncConnection, run: Any) -> None:
    """Refuse (409) to send back ``run`` (its ``id``, ``workflow_run_id``, ``node``
    and ``job_id``) when it is a workflow's node whose trigger rule can no longer hold
    over its upstream nodes: retried, it would only be skipped again."""
    if run.workflow_run_id is None:
        return
    dag = (await dags_of(core, conn, [run.job_id]))[run.job_id]
    # An upstream node still running under a cancel request ends CANCELLED, whatever
    # its handler does (a completion under the request is a cancel): judged as such.
    states = {
        name: RunState.CANCELLED
        if cancelling and _STATES[state] not in TERMINAL_STATES
        else _STATES[state]
        for name, state, cancelling in await conn.execute(
            sa.select(runs.c.node, runs.c.state, runs.c.cancel_requested).where(
                runs.c.workflow_run_id == run.workflow_run_id,
                core.driver.id_in(runs.c.node, list(dag.by_name[run.node].after)),
            )
        )
    }
    why = (
        never_runs(dag, run.node, states)
        if len(states) == len(dag.by_name[run.node].after)
        else None
    )
    if why is not None:
        raise ConflictError(
            f"node {run.node!r} cannot run: {why}; retry its upstream nodes first",
            node=run.node,
        )


async def reopen(
    core: _Core,
    conn: AsyncConnection,
    node_run_ids: Sequence[uuid.UUID],
    *,
    at: datetime,
    actor: str | None,
) -> None:
    """Node runs sent back to SCHEDULED (a retry, a redrive) continue their workflow
    run: the nodes they had skipped or cancelled downstream wait again (PENDING), and a
    workflow run that had ended runs again — or that was being cancelled, goes on. A
    node with upstream nodes waits for them too (AWAIT): it is made ready, its payload
    holding their results, when its trigger rule holds, at once if it does now, and
    skipped if it never can (:func:`advance`, called here)."""
    if not node_run_ids:
        return
    sent = (
        await conn.execute(
            sa.select(runs.c.id, runs.c.workflow_run_id, runs.c.node).where(
                core.driver.id_in(runs.c.id, list(node_run_ids)),
                runs.c.workflow_run_id.is_not(None),
            )
        )
    ).all()
    if not sent:
        return
    owner_ids = sorted({s.workflow_run_id for s in sent})
    owners = (
        await conn.execute(
            sa.select(runs.c.id, runs.c.tenant_id, runs.c.job_id, runs.c.state)
            .where(core.driver.id_in(runs.c.id, owner_ids))
            .order_by(runs.c.id)
            .with_for_update()
        )
    ).all()
    dags = await dags_of(core, conn, {w.job_id for w in owners})
    events: list[dict[str, Any]] = []
    reopened: list[dict[str, Any]] = []
    waiting: list[dict[str, Any]] = []
    for w in owners:
        dag = dags[w.job_id]
        below: set[str] = set()
        for s in sent:
            if s.workflow_run_id == w.id:
                below.update(dag.descendants(s.node))
                if dag.by_name[s.node].after:
                    waiting.append({"id": s.id, **_WAITS_AGAIN, "reason": _AWAIT_REASON})
                    events.append(
                        _event(w, s.id, AWAIT.source, RunState.PENDING, at, actor, _AWAIT_REASON)
                    )
        if below:
            rewound = (
                await conn.execute(
                    sa.select(runs.c.id, runs.c.state).where(
                        runs.c.workflow_run_id == w.id,
                        runs.c.node.in_(sorted(below)),
                        runs.c.state.in_(REWIND.source_values),
                    )
                )
            ).all()
            await update_each(
                conn,
                runs,
                [
                    {
                        "id": r.id,
                        **_WAITS_AGAIN,
                        "finished_at": None,
                        "reason": "upstream retried",
                    }
                    for r in rewound
                ],
            )
            events += [
                _event(w, r.id, RunState(r.state), RunState.PENDING, at, actor, "upstream retried")
                for r in rewound
            ]
        if RunState(w.state) in REOPEN.sources:
            reopened.append(
                {"id": w.id, "state": RunState.RUNNING.value, "finished_at": None, "reason": None}
            )
            events.append(
                _event(w, w.id, RunState(w.state), RunState.RUNNING, at, actor, "a node retried")
            )
    # The workflow run is no longer cancelled, nor being cancelled: its nodes may run
    # again (a node still running under the cancel is stopped all the same: the cancel
    # was asked of its own run too).
    await update_each(conn, runs, reopened)
    await conn.execute(
        runs.update()
        .where(core.driver.id_in(runs.c.id, [w.id for w in owners]), runs.c.cancel_requested)
        .values(cancel_requested=False, reason=None)
    )
    await update_each(conn, runs, waiting, where=runs.c.state == AWAIT.source.value)
    await core._insert_events(conn, events)
    # Those that wait are decided now: made ready if their rule holds.
    await advance(core, conn, [w.id for w in owners], at=at, actor=actor)
