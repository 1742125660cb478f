"""Gated reservations in the store, on both backends: a workflow's node whose upstream
nodes are all under way is reserved while still PENDING; its upstream's completion
opens its gate without writing the node; its holder hears of it with the payload it
runs with, and starts it; a gate that never opens (a failure upstream, a cancel), a
lapse, a hand-back or a retry each leave the node as the DAG needs it."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest

from cronwheel.domain import workflow
from cronwheel.domain.model import LeasedAttempt, Run, Worker
from cronwheel.domain.states import RETRY, RunState
from cronwheel.domain.workflow import UPSTREAM_DONE, UPSTREAM_KEY
from cronwheel.store import CompleteItem, FailItem, HeartbeatItem, Store

from .helpers import T0, at, events_of, fire, make_tenant, register_worker, transitions_of
from .test_workflows import create, nodes_of, states_of

pytestmark = pytest.mark.asyncio


@pytest.fixture(autouse=True)
def _every_node_a_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small DAGs here: every node after others is held ahead (by default only layers
    of GATE_LAYER_MIN are; see the test of it)."""
    monkeypatch.setattr(workflow, "GATE_LAYER_MIN", 1)


FAN = [
    {"name": "a"},
    {"name": "b", "after": ["a"], "payload": {"k": 1}},
    {"name": "c", "after": ["a"]},
    {"name": "d", "after": ["b", "c"]},
]
HEARTBEAT = 25.0  # the nodes' heartbeat timeout (the job default)


async def lease(
    store: Store, worker: Worker, *, now: datetime, gated: int = 100, max: int = 100
) -> tuple[list[LeasedAttempt], list[LeasedAttempt]]:
    """What one lease gives ``worker``: (runs to run now, gated reservations)."""
    got = await store.attempts_lease_admitted(worker=worker, max=max, gated=gated, now=now)
    now_runs = [a for a in got.attempts if not a.gated]
    gated_runs = [a for a in got.attempts if a.gated]
    assert all(a.not_before is None for a in gated_runs)
    return now_runs, gated_runs


async def started_root(store: Store) -> tuple[uuid.UUID, Run, Worker, LeasedAttempt]:
    """FAN fired at T0, its root leased and running by a worker at 1 s."""
    tenant = await make_tenant(store)
    wf = await create(store, tenant.id, FAN)
    await fire(store, [wf], now=T0)
    worker = await register_worker(store, tenant.id, now=at(1))
    [root], _ = await lease(store, worker, now=at(1), gated=0)
    return tenant.id, wf, worker, root


async def names(store: Store, tenant_id: uuid.UUID, leased: list[LeasedAttempt]) -> list[str]:
    return sorted([(await store.runs_get(tenant_id, a.run_id)).node for a in leased])


async def complete(store: Store, a: LeasedAttempt, result: Any, *, now: datetime) -> None:
    [out] = await store.attempts_complete_many(
        items=[CompleteItem(a.attempt_id, a.fencing_token, result)], now=now
    )
    assert out.ok


async def test_nodes_after_a_running_root_are_reserved_gated_and_stay_pending(
    store: Store,
) -> None:
    tenant_id, wf, worker, _root = await started_root(store)
    _, gated = await lease(store, worker, now=at(2))
    # b and c come after the running root; d waits for them, not under way yet.
    assert await names(store, tenant_id, gated) == ["b", "c"]
    assert all(a.lease_expires_at == at(2 + HEARTBEAT) for a in gated)
    assert await states_of(store, tenant_id, wf) == {
        "a": "RUNNING",
        "b": "PENDING",
        "c": "PENDING",
        "d": "PENDING",
    }
    # Held: no other worker reserves them, and nothing ran.
    other = await register_worker(store, tenant_id, now=at(2))
    assert await lease(store, other, now=at(3)) == ([], [])
    found = await store.attempts_gates(worker_id=worker.id, tokens=[a.fencing_token for a in gated])
    assert found.opened == [] and found.gone == []
    # Started before the gate opens: not yet, and nothing changes.
    early = await store.attempts_start_many(
        worker_id=worker.id, tokens=[a.fencing_token for a in gated], now=at(3)
    )
    assert early.started == [] and early.refused == []
    assert sorted(early.not_yet) == sorted(a.fencing_token for a in gated)
    assert (await states_of(store, tenant_id, wf))["b"] == "PENDING"


async def test_a_worker_that_asks_for_none_gets_no_gated_node(store: Store) -> None:
    tenant_id, _wf, worker, _root = await started_root(store)
    # (An older worker, which would run a reservation without ``not_before`` at once.)
    assert await lease(store, worker, now=at(2), gated=0) == ([], [])
    _, gated = await lease(store, worker, now=at(2), gated=1)
    assert len(gated) == 1 and await names(store, tenant_id, gated) in (["b"], ["c"])


async def test_the_upstreams_completion_opens_the_gate_and_the_holder_starts_it(
    store: Store,
) -> None:
    tenant_id, wf, worker, root = await started_root(store)
    _, gated = await lease(store, worker, now=at(2))
    tokens = {await names(store, tenant_id, [a]) == ["b"]: a for a in gated}
    b, c = tokens[True], tokens[False]
    await complete(store, root, {"rows": 3}, now=at(5))
    # Opened, not written: the nodes are still PENDING, and no worker may lease them.
    assert (await states_of(store, tenant_id, wf))["b"] == "PENDING"
    other = await register_worker(store, tenant_id, now=at(5))
    assert (await lease(store, other, now=at(5), gated=0))[0] == []
    found = await store.attempts_gates(
        worker_id=worker.id, tokens=[b.fencing_token, c.fencing_token]
    )
    assert found.gone == []
    # One opening per payload: b's has its own key beside the root's result.
    opened = {tuple(g.fencing_tokens): g for g in found.opened}
    assert set(opened) == {(b.fencing_token,), (c.fencing_token,)}
    assert opened[(b.fencing_token,)].payload == {"k": 1, UPSTREAM_KEY: {"a": {"rows": 3}}}
    assert opened[(c.fencing_token,)].payload == {UPSTREAM_KEY: {"a": {"rows": 3}}}
    assert {g.opened_at for g in found.opened} == {at(5)}
    # The holder begins them, and starts them after: each begins at the opening.
    done = await store.attempts_start_many(
        worker_id=worker.id, tokens=[b.fencing_token, c.fencing_token], now=at(5.2)
    )
    assert sorted(done.started) == sorted([b.fencing_token, c.fencing_token])
    assert done.started_at == at(5)
    nodes = await nodes_of(store, tenant_id, wf)
    assert nodes["b"].state is RunState.RUNNING and nodes["c"].state is RunState.RUNNING
    assert nodes["b"].payload == {"k": 1, UPSTREAM_KEY: {"a": {"rows": 3}}}
    assert nodes["b"].started_at == at(5) and nodes["b"].fire_at == at(5)
    assert await transitions_of(store, tenant_id, nodes["b"].id) == [
        (None, "PENDING"),
        ("PENDING", "DISPATCHED"),
        ("DISPATCHED", "RUNNING"),
    ]
    events = await events_of(store, tenant_id, run_id=nodes["b"].id)
    ready = [e for e in events if e.to_state == "DISPATCHED"]
    assert [(e.at, e.reason) for e in ready] == [(at(5), UPSTREAM_DONE)]
    [live] = await store.attempts_heartbeat_many(
        items=[HeartbeatItem(b.attempt_id, b.fencing_token)], now=at(6)
    )
    assert live.ok and live.lease_expires_at == at(6 + HEARTBEAT)
    # The sink came under way with them: reserved, and opened by their completions.
    _, [d] = await lease(store, worker, now=at(6))
    assert await names(store, tenant_id, [d]) == ["d"]
    await complete(store, b, "B", now=at(7))
    assert (await store.attempts_gates(worker_id=worker.id, tokens=[d.fencing_token])).opened == []
    await complete(store, c, "C", now=at(8))
    [sink] = (await store.attempts_gates(worker_id=worker.id, tokens=[d.fencing_token])).opened
    assert sink.payload == {UPSTREAM_KEY: {"b": "B", "c": "C"}} and sink.opened_at == at(8)
    assert (
        await store.attempts_start_many(worker_id=worker.id, tokens=[d.fencing_token], now=at(8.1))
    ).started == [d.fencing_token]
    [d_attempt] = [d]
    await complete(store, d_attempt, None, now=at(9))
    assert (await store.runs_get(tenant_id, wf.id)).state is RunState.SUCCESS


async def test_a_gate_that_can_never_open_skips_the_node_and_voids_its_reservation(
    store: Store,
) -> None:
    tenant_id, wf, worker, root = await started_root(store)
    _, gated = await lease(store, worker, now=at(2))
    [out] = await store.attempts_fail_many(
        items=[FailItem(root.attempt_id, root.fencing_token, "boom", retryable=False)],
        now=at(3),
    )
    assert out.ok
    assert await states_of(store, tenant_id, wf) == {
        "a": "FAILED",
        "b": "SKIPPED",
        "c": "SKIPPED",
        "d": "SKIPPED",
    }
    tokens = [a.fencing_token for a in gated]
    found = await store.attempts_gates(worker_id=worker.id, tokens=tokens)
    assert found.opened == [] and sorted(found.gone) == sorted(tokens)
    refused = await store.attempts_start_many(worker_id=worker.id, tokens=tokens, now=at(4))
    assert sorted(refused.refused) == sorted(tokens) and refused.started == []


async def test_a_cancel_reaches_a_node_whose_gate_opened_before_its_start(store: Store) -> None:
    tenant_id, wf, worker, root = await started_root(store)
    _, gated = await lease(store, worker, now=at(2))
    await complete(store, root, None, now=at(3))
    await store.runs_cancel(tenant_id, wf.id, now=at(4))
    tokens = [a.fencing_token for a in gated]
    refused = await store.attempts_start_many(worker_id=worker.id, tokens=tokens, now=at(4.1))
    assert sorted(refused.refused) == sorted(tokens)
    assert set((await states_of(store, tenant_id, wf)).values()) == {"SUCCESS", "CANCELLED"}
    assert (await store.runs_get(tenant_id, wf.id)).state is RunState.CANCELLED


async def test_an_unopened_reservation_lapses_and_is_taken_again(store: Store) -> None:
    tenant_id, wf, worker, root = await started_root(store)
    _, gated = await lease(store, worker, now=at(2))
    # The root goes on running (heartbeaten), longer than the reservations last.
    [beat] = await store.attempts_heartbeat_many(
        items=[HeartbeatItem(root.attempt_id, root.fencing_token)], now=at(20)
    )
    assert beat.ok
    assert await store.attempts_expire(now=at(2 + HEARTBEAT - 1)) == 0
    assert await store.attempts_expire(now=at(2 + HEARTBEAT + 1)) == 2
    assert (await states_of(store, tenant_id, wf))["b"] == "PENDING"
    tokens = [a.fencing_token for a in gated]
    assert sorted((await store.attempts_gates(worker_id=worker.id, tokens=tokens)).gone) == sorted(
        tokens
    )
    other = await register_worker(store, tenant_id, now=at(30))
    _, again = await lease(store, other, now=at(30))
    assert await names(store, tenant_id, again) == ["b", "c"]
    assert min(a.fencing_token for a in again) > max(tokens)


@pytest.mark.parametrize(("ends_after", "opened"), [(HEARTBEAT - 0.001, True), (HEARTBEAT, False)])
async def test_an_upstream_ending_as_a_reservation_runs_out_opens_it_only_while_held(
    store: Store, ends_after: float, opened: bool
) -> None:
    """The reservation lapsed but not swept yet when the upstream ends: the node is made
    ready for any worker; a moment before its end, its gate opens for its holder."""
    tenant_id, wf, worker, root = await started_root(store)
    _, gated = await lease(store, worker, now=at(2))
    [beat] = await store.attempts_heartbeat_many(
        items=[HeartbeatItem(root.attempt_id, root.fencing_token)], now=at(20)
    )
    assert beat.ok
    await complete(store, root, {"x": 1}, now=at(2 + ends_after))
    tokens = [a.fencing_token for a in gated]
    found = await store.attempts_gates(worker_id=worker.id, tokens=tokens)
    nodes = await nodes_of(store, tenant_id, wf)
    if opened:
        assert sorted(t for g in found.opened for t in g.fencing_tokens) == sorted(tokens)
        assert nodes["b"].state is RunState.PENDING
    else:
        assert found.opened == []
        assert nodes["b"].state is RunState.DISPATCHED and nodes["c"].state is RunState.DISPATCHED
        assert nodes["b"].payload == {"k": 1, UPSTREAM_KEY: {"a": {"x": 1}}}
        other = await register_worker(store, tenant_id, now=at(40))
        now_runs, _ = await lease(store, other, now=at(40), gated=0)
        assert await names(store, tenant_id, now_runs) == ["b", "c"]


async def test_an_opened_reservation_never_started_lapses_to_ready(store: Store) -> None:
    tenant_id, wf, worker, root = await started_root(store)
    _, gated = await lease(store, worker, now=at(2))
    await complete(store, root, {"x": 1}, now=at(3))
    # The opening gave the holder the heartbeat timeout from then (3 + heartbeat), past
    # the reservation's own end (2 + heartbeat): then any worker runs them.
    assert await store.attempts_expire(now=at(2 + HEARTBEAT + 0.5)) == 0
    assert (await states_of(store, tenant_id, wf))["b"] == "PENDING"
    assert await store.attempts_expire(now=at(3 + HEARTBEAT + 0.5)) == 2
    nodes = await nodes_of(store, tenant_id, wf)
    assert nodes["b"].state is RunState.DISPATCHED
    assert nodes["b"].payload == {"k": 1, UPSTREAM_KEY: {"a": {"x": 1}}}
    assert nodes["b"].fire_at == at(3)  # due since its gate opened
    other = await register_worker(store, tenant_id, now=at(30))
    now_runs, _ = await lease(store, other, now=at(30), gated=0)
    assert await names(store, tenant_id, now_runs) == ["b", "c"]
    tokens = [a.fencing_token for a in gated]
    refused = await store.attempts_start_many(worker_id=worker.id, tokens=tokens, now=at(31))
    assert sorted(refused.refused) == sorted(tokens)


async def test_handed_back_gated_reservations_wait_or_go_ready(store: Store) -> None:
    tenant_id, wf, worker, root = await started_root(store)
    _, gated = await lease(store, worker, now=at(2))
    by_name = {(await names(store, tenant_id, [a]))[0]: a for a in gated}
    # Before its gate opens, a hand-back leaves the node waiting, for any worker.
    [back] = await store.attempts_release_many(
        items=[HeartbeatItem(by_name["b"].attempt_id, by_name["b"].fencing_token)], now=at(3)
    )
    assert back.ok
    assert (await states_of(store, tenant_id, wf))["b"] == "PENDING"
    other = await register_worker(store, tenant_id, now=at(3))
    _, [b] = await lease(store, other, now=at(3))
    assert await names(store, tenant_id, [b]) == ["b"]
    await complete(store, root, None, now=at(4))
    # After it opened, a hand-back makes the node ready for any worker.
    c = by_name["c"]
    [back] = await store.attempts_release_many(
        items=[HeartbeatItem(c.attempt_id, c.fencing_token)], now=at(5)
    )
    assert back.ok
    assert (await states_of(store, tenant_id, wf))["c"] == "DISPATCHED"
    # A worker deregistering hands back what it holds the same way.
    assert [
        o.ok for o in await store.attempts_release_by_worker(worker_id=other.id, now=at(6))
    ] == [True]
    assert (await states_of(store, tenant_id, wf))["b"] == "DISPATCHED"
    leased, _ = await lease(store, worker, now=at(7), gated=0)
    assert await names(store, tenant_id, leased) == ["b", "c"]


@pytest.mark.parametrize(
    "limits", [{"max_concurrent_runs": 5}, {"max_dispatch_rate": 10}], ids=["concurrency", "rate"]
)
async def test_a_limited_tenants_nodes_are_not_reserved_ahead_of_their_gate(
    store: Store, limits: dict[str, Any]
) -> None:
    """Their nodes begin when their gates open, with no lease to hold them back then:
    a tenant under a limit has its nodes leased once ready, under the limit."""
    limited = await make_tenant(store, **limits)
    free = await make_tenant(store)
    runs = [await create(store, t.id, FAN) for t in (limited, free)]
    await fire(store, runs, now=T0)
    worker = await register_worker(store, None, now=at(1))
    leased, gated = await lease(store, worker, now=at(1))
    assert len(leased) == 2  # both roots
    assert {a.tenant_id for a in gated} == {free.id}
    assert len(gated) == 2
    # The limited tenant's nodes are leased once ready, as before.
    [root] = [a for a in leased if a.tenant_id == limited.id]
    await complete(store, root, None, now=at(2))
    ready, more = await lease(store, worker, now=at(3))
    assert {a.tenant_id for a in ready} == {limited.id} and len(ready) == 2
    assert more == []


async def test_a_retry_upstream_voids_a_skipped_nodes_reservation_and_gates_it_anew(
    store: Store,
) -> None:
    tenant_id, wf, worker, root = await started_root(store)
    _, gated = await lease(store, worker, now=at(2))
    await complete(store, root, None, now=at(3))
    started = await store.attempts_start_many(
        worker_id=worker.id, tokens=[a.fencing_token for a in gated], now=at(3.1)
    )
    assert len(started.started) == 2
    _, [d] = await lease(store, worker, now=at(3.2))  # the sink, now its upstream run
    [b] = [a for a in gated if (await store.runs_get(tenant_id, a.run_id)).node == "b"]
    [c] = [a for a in gated if a is not b]
    await complete(store, c, None, now=at(4))
    await store.attempts_fail_many(
        items=[FailItem(b.attempt_id, b.fencing_token, "no", retryable=False)], now=at(4)
    )
    assert (await states_of(store, tenant_id, wf))["d"] == "SKIPPED"
    assert (await store.attempts_gates(worker_id=worker.id, tokens=[d.fencing_token])).gone == [
        d.fencing_token
    ]
    # Retrying b rewinds d: it waits for b again, under way once more, and is gated anew.
    await store.runs_redrive(tenant_id, b.run_id, move=RETRY, now=at(5))
    assert await states_of(store, tenant_id, wf) == {
        "a": "SUCCESS",
        "b": "DISPATCHED",
        "c": "SUCCESS",
        "d": "PENDING",
    }
    b_again, [d_again] = await lease(store, worker, now=at(6))
    assert await names(store, tenant_id, b_again) == ["b"]
    assert await names(store, tenant_id, [d_again]) == ["d"]
    assert d_again.fencing_token > d.fencing_token
    await complete(store, b_again[0], None, now=at(7))
    [opened] = (
        await store.attempts_gates(worker_id=worker.id, tokens=[d_again.fencing_token])
    ).opened
    assert opened.fencing_tokens == [d_again.fencing_token]


async def test_an_opened_node_of_a_workflow_paused_since_is_parked_when_it_lapses(
    store: Store,
) -> None:
    tenant_id, wf, worker, root = await started_root(store)
    _, gated = await lease(store, worker, now=at(2))
    await complete(store, root, None, now=at(3))
    await store.jobs_pause(tenant_id, wf.job_id, now=at(4))
    # Its holder never starts it: the node goes back as advancing would make it now.
    assert await store.attempts_expire(now=at(3 + HEARTBEAT + 0.5)) == 2
    nodes = await nodes_of(store, tenant_id, wf)
    assert nodes["b"].state is RunState.SCHEDULED and nodes["b"].reason == "job paused"
    other = await register_worker(store, tenant_id, now=at(30))
    assert await lease(store, other, now=at(30)) == ([], [])
    await store.jobs_resume(tenant_id, wf.job_id, now=at(40))
    parked = await nodes_of(store, tenant_id, wf)
    await fire(store, [parked["b"], parked["c"]], now=at(40))
    leased, _ = await lease(store, other, now=at(41), gated=0)
    assert await names(store, tenant_id, leased) == ["b", "c"]
    assert all(a.payload.get(UPSTREAM_KEY) == {"a": None} for a in leased)
    assert len(gated) == 2


async def test_a_paused_workflows_nodes_are_not_reserved_ahead(store: Store) -> None:
    tenant_id, wf, worker, root = await started_root(store)
    await store.jobs_pause(tenant_id, wf.job_id, now=at(1.5))
    assert await lease(store, worker, now=at(2)) == ([], [])
    # Resumed, its nodes go the way they would have: leased once ready.
    await store.jobs_resume(tenant_id, wf.job_id, now=at(3))
    await complete(store, root, None, now=at(4))
    leased, _ = await lease(store, worker, now=at(5), gated=0)
    assert await names(store, tenant_id, leased) == ["b", "c"]


async def test_only_layers_are_held_ahead_by_default(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain's node, or a few after the same nodes, is made ready and leased as it
    comes; a layer of GATE_LAYER_MIN is held ahead of its gate."""
    monkeypatch.undo()
    tenant = await make_tenant(store)
    wide = [{"name": f"n{i}", "after": ["a"]} for i in range(workflow.GATE_LAYER_MIN)]
    nodes = [{"name": "a"}, {"name": "few", "after": ["a", "n0"]}, *wide]
    wf = await create(store, tenant.id, nodes)
    await fire(store, [wf], now=T0)
    worker = await register_worker(store, tenant.id, now=at(1))
    [root], gated = await lease(store, worker, now=at(1))
    assert sorted(await names(store, tenant.id, gated)) == sorted(n["name"] for n in wide)
    await complete(store, root, None, now=at(2))
    # A node alone after them is leased once ready, not held ahead.
    assert (await lease(store, worker, now=at(3)))[1] == []


async def test_a_start_later_than_its_gate_allows_is_refused(store: Store) -> None:
    """Its attempt's lease would count from the opening and have run out already: the
    node would be run again by the sweep while this handler runs."""
    tenant_id, wf, worker, root = await started_root(store)
    _, gated = await lease(store, worker, now=at(2))
    await complete(store, root, None, now=at(3))
    tokens = [a.fencing_token for a in gated]
    late = await store.attempts_start_many(
        worker_id=worker.id, tokens=tokens, now=at(3 + HEARTBEAT + 0.5)
    )
    assert late.started == [] and sorted(late.refused) == sorted(tokens)
    assert (await states_of(store, tenant_id, wf))["b"] == "PENDING"
