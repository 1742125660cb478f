"""Workflows in the store, on both backends: a fired workflow run creates its node runs
and makes its roots ready; each node's end makes its dependents ready or skipped by
their trigger rules in the same transaction; the workflow run's state follows its
nodes; cancelling and retrying continue from where the run is."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cronwheel.domain.errors import ConflictError, IllegalTransitionError, ValidationError
from cronwheel.domain.model import LeasedAttempt, Run
from cronwheel.domain.new_job import JobLimits
from cronwheel.domain.states import RETRY, RunState, illegal_transitions
from cronwheel.domain.workflow import NODE_INPUT_MAX, UPSTREAM_KEY, WorkflowSpec, new_workflow
from cronwheel.store import CompleteItem, FailItem, Store, create_store
from cronwheel.store.schema import PARKED_FIRE_AT
from cronwheel.store.sql import dag as dag_module

from .helpers import T0, at, events_of, fire, make_tenant, register_worker, transitions_of

ONE_TRY = {"max_attempts": 1, "initial_delay": 1.0}


def spec(nodes: list[dict[str, Any]], **fields: Any) -> WorkflowSpec:
    body: dict[str, Any] = {
        "name": "pipeline",
        "schedule": {"at": "2031-03-04T12:00:00Z"},
        "nodes": [{"task": "t", "retry": ONE_TRY, **n} for n in nodes],
        **fields,
    }
    return WorkflowSpec.model_validate(body)


async def create(store: Store, tenant_id: uuid.UUID, nodes: list[dict[str, Any]]) -> Run:
    new = new_workflow(spec(nodes), now=at(-60), limits=JobLimits())
    _job, run, _created = await store.workflows_create(tenant_id, new=new, now=at(-60))
    assert run is not None
    return run


async def nodes_of(store: Store, tenant_id: uuid.UUID, run: Run) -> dict[str, Run]:
    found = await store.workflow_run_nodes(tenant_id, [run.id])
    return {n.node: n for n in found[run.id]}


async def states_of(store: Store, tenant_id: uuid.UUID, run: Run) -> dict[str, str]:
    return {k: v.state.value for k, v in (await nodes_of(store, tenant_id, run)).items()}


class Runner:
    """One worker that leases whatever is ready and ends each as told."""

    def __init__(self, store: Store, tenant_id: uuid.UUID) -> None:
        self.store, self.tenant_id = store, tenant_id
        self.clock = 1.0

    async def step(self, outcomes: dict[str, str]) -> list[str]:
        """Lease every ready node run, end those ``outcomes`` name (``ok`` or ``fail``)
        and return the nodes leased."""
        worker = await register_worker(self.store, self.tenant_id, now=at(self.clock))
        leased = await self.store.attempts_lease(worker=worker, max=1000, now=at(self.clock))
        runs = {a.run_id: a for a in leased}
        names = {}
        for run_id in runs:
            run = await self.store.runs_get(self.tenant_id, run_id)
            names[run_id] = run.node
        self.clock += 1
        ok = [a for a in leased if outcomes.get(names[a.run_id], "ok") == "ok"]
        bad = [a for a in leased if outcomes.get(names[a.run_id], "ok") == "fail"]
        await self.store.attempts_complete_many(
            items=[
                CompleteItem(a.attempt_id, a.fencing_token, {"from": names[a.run_id]}) for a in ok
            ],
            now=at(self.clock),
        )
        await self.store.attempts_fail_many(
            items=[FailItem(a.attempt_id, a.fencing_token, "boom", retryable=False) for a in bad],
            now=at(self.clock),
        )
        self.clock += 1
        return sorted(names.values())


DIAMOND = [
    {"name": "a"},
    {"name": "b", "after": ["a"]},
    {"name": "c", "after": ["a"]},
    {"name": "d", "after": ["b", "c"], "payload": {"k": 1}},
]


async def test_a_diamond_runs_in_order_and_passes_results(store: Store) -> None:
    tenant = await make_tenant(store)
    wf = await create(store, tenant.id, DIAMOND)
    assert wf.state is RunState.SCHEDULED
    await fire(store, [wf], now=T0)
    started = await store.runs_get(tenant.id, wf.id)
    assert started.state is RunState.RUNNING
    assert await states_of(store, tenant.id, wf) == {
        "a": "DISPATCHED",
        "b": "PENDING",
        "c": "PENDING",
        "d": "PENDING",
    }
    runner = Runner(store, tenant.id)
    assert await runner.step({}) == ["a"]
    assert await runner.step({}) == ["b", "c"]
    assert await runner.step({}) == ["d"]
    nodes = await nodes_of(store, tenant.id, wf)
    assert nodes["d"].payload == {"k": 1, UPSTREAM_KEY: {"b": {"from": "b"}, "c": {"from": "c"}}}
    assert {n.state for n in nodes.values()} == {RunState.SUCCESS}
    done = await store.runs_get(tenant.id, wf.id)
    assert done.state is RunState.SUCCESS and done.finished_at is not None
    job = await store.jobs_get(tenant.id, wf.job_id)
    assert job.state.value == "finished"
    for run in [done, *nodes.values()]:
        assert illegal_transitions(await transitions_of(store, tenant.id, run.id)) == []


@pytest.mark.parametrize(
    ("rule", "expect_d", "expect_wf"),
    [
        ("all_success", "SKIPPED", "FAILED"),
        ("all_done", "SUCCESS", "FAILED"),
        ("one_success", "SUCCESS", "FAILED"),
        ("one_failed", "SUCCESS", "FAILED"),
        ("none_failed", "SKIPPED", "FAILED"),
    ],
)
async def test_a_failure_in_the_middle_under_each_rule(
    store: Store, rule: str, expect_d: str, expect_wf: str
) -> None:
    tenant = await make_tenant(store)
    nodes = [
        *DIAMOND[:3],
        {"name": "d", "after": ["b", "c"], "trigger_rule": rule},
        {"name": "e", "after": ["d"]},
    ]
    wf = await create(store, tenant.id, nodes)
    await fire(store, [wf], now=T0)
    runner = Runner(store, tenant.id)
    await runner.step({})
    await runner.step({"b": "fail"})
    while await runner.step({}):
        pass
    states = await states_of(store, tenant.id, wf)
    assert states["b"] == "FAILED" and states["c"] == "SUCCESS"
    assert states["d"] == expect_d
    assert states["e"] == ("SUCCESS" if expect_d == "SUCCESS" else "SKIPPED")
    done = await store.runs_get(tenant.id, wf.id)
    assert done.state.value == expect_wf
    if expect_d == "SKIPPED":
        d = (await nodes_of(store, tenant.id, wf))["d"]
        assert d.reason is not None and "upstream failed: b" in d.reason


async def test_one_failed_is_skipped_when_nothing_fails(store: Store) -> None:
    tenant = await make_tenant(store)
    nodes = [{"name": "a"}, {"name": "alarm", "after": ["a"], "trigger_rule": "one_failed"}]
    wf = await create(store, tenant.id, nodes)
    await fire(store, [wf], now=T0)
    runner = Runner(store, tenant.id)
    await runner.step({})
    assert await states_of(store, tenant.id, wf) == {"a": "SUCCESS", "alarm": "SKIPPED"}
    assert (await store.runs_get(tenant.id, wf.id)).state is RunState.SUCCESS


async def test_retrying_a_failed_node_continues_the_run(store: Store) -> None:
    tenant = await make_tenant(store)
    nodes = [{"name": "a"}, {"name": "b", "after": ["a"]}, {"name": "c", "after": ["b"]}]
    wf = await create(store, tenant.id, nodes)
    await fire(store, [wf], now=T0)
    runner = Runner(store, tenant.id)
    await runner.step({"a": "fail"})
    assert await states_of(store, tenant.id, wf) == {"a": "FAILED", "b": "SKIPPED", "c": "SKIPPED"}
    assert (await store.runs_get(tenant.id, wf.id)).state is RunState.FAILED
    a = (await nodes_of(store, tenant.id, wf))["a"]
    await store.runs_redrive(tenant.id, a.id, move=RETRY, now=at(100))
    assert await states_of(store, tenant.id, wf) == {
        "a": "SCHEDULED",
        "b": "PENDING",
        "c": "PENDING",
    }
    assert (await store.runs_get(tenant.id, wf.id)).state is RunState.RUNNING
    await fire(store, [a], now=at(101))
    runner.clock = 102
    assert await runner.step({}) == ["a"]
    assert await runner.step({}) == ["b"]
    assert await runner.step({}) == ["c"]
    assert (await store.runs_get(tenant.id, wf.id)).state is RunState.SUCCESS
    for run in (await nodes_of(store, tenant.id, wf)).values():
        assert illegal_transitions(await transitions_of(store, tenant.id, run.id)) == []


async def test_a_workflow_run_cannot_itself_be_retried(store: Store) -> None:
    tenant = await make_tenant(store)
    wf = await create(store, tenant.id, [{"name": "a"}])
    await fire(store, [wf], now=T0)
    await Runner(store, tenant.id).step({"a": "fail"})
    with pytest.raises(IllegalTransitionError, match="retry its failed nodes"):
        await store.runs_redrive(tenant.id, wf.id, move=RETRY, now=at(100))


async def cancelled_while_one_runs(
    store: Store, nodes: list[dict[str, Any]], *, reason: str = "stop"
) -> tuple[uuid.UUID, Run, LeasedAttempt]:
    """A workflow run of ``nodes`` fired, the one node a worker of the default pool can
    lease leased (at(1)) and the run cancelled with ``reason`` (at(2)): the tenant, the
    workflow run and that node's attempt."""
    tenant = await make_tenant(store)
    wf = await create(store, tenant.id, nodes)
    await fire(store, [wf], now=T0)
    worker = await register_worker(store, tenant.id, now=at(1))
    [attempt] = await store.attempts_lease(worker=worker, max=10, now=at(1))
    await store.runs_cancel(tenant.id, wf.id, reason=reason, now=at(2))
    return tenant.id, wf, attempt


async def test_cancelling_mid_run(store: Store) -> None:
    tenant_id, wf, a = await cancelled_while_one_runs(store, DIAMOND)
    # a runs: asked to stop; the rest never will.
    assert await states_of(store, tenant_id, wf) == {
        "a": "RUNNING",
        "b": "CANCELLED",
        "c": "CANCELLED",
        "d": "CANCELLED",
    }
    assert (await store.runs_get(tenant_id, wf.id)).state is RunState.RUNNING
    await store.attempts_complete_many(
        items=[CompleteItem(a.attempt_id, a.fencing_token, None)], now=at(3)
    )
    assert (await states_of(store, tenant_id, wf))["a"] == "CANCELLED"
    done = await store.runs_get(tenant_id, wf.id)
    assert done.state is RunState.CANCELLED


async def test_a_paused_workflow_holds_its_ready_nodes(store: Store) -> None:
    tenant = await make_tenant(store)
    wf = await create(store, tenant.id, [{"name": "a"}, {"name": "b", "after": ["a"]}])
    await fire(store, [wf], now=T0)
    worker = await register_worker(store, tenant.id, now=at(1))
    [a] = await store.attempts_lease(worker=worker, max=10, now=at(1))
    await store.jobs_pause(tenant.id, wf.job_id, now=at(2))
    await store.attempts_complete_many(
        items=[CompleteItem(a.attempt_id, a.fencing_token, None)], now=at(3)
    )
    b = (await nodes_of(store, tenant.id, wf))["b"]
    assert b.state is RunState.SCHEDULED and b.fire_at >= PARKED_FIRE_AT
    await store.jobs_resume(tenant.id, wf.job_id, now=at(4))
    b = (await nodes_of(store, tenant.id, wf))["b"]
    assert b.state is RunState.SCHEDULED and b.fire_at <= at(4)


async def test_a_paused_workflow_triggered_runs_its_nodes(store: Store) -> None:
    # As a paused job's triggered run is not held, a paused workflow's triggered run
    # runs: its root is ready at once, and so is the node after it, though the workflow
    # is still paused (where the run was fired and its every node parked).
    tenant = await make_tenant(store)
    wf = await create(store, tenant.id, [{"name": "a"}, {"name": "b", "after": ["a"]}])
    await store.jobs_pause(tenant.id, wf.job_id, now=at(1))
    triggered = await store.jobs_trigger(tenant.id, wf.job_id, now=at(2))
    await fire(store, [triggered], now=at(2))
    a = (await nodes_of(store, tenant.id, triggered))["a"]
    assert a.state is RunState.DISPATCHED and a.fire_at <= at(2)
    runner = Runner(store, tenant.id)
    runner.clock = 3
    assert await runner.step({}) == ["a"]
    b = (await nodes_of(store, tenant.id, triggered))["b"]
    assert b.state is RunState.DISPATCHED and b.fire_at <= at(4)
    assert await runner.step({}) == ["b"]
    assert (await store.runs_get(tenant.id, triggered.id)).state is RunState.SUCCESS
    # The workflow stayed paused, its scheduled run held.
    assert (await store.jobs_get(tenant.id, wf.job_id)).state.value == "paused"


async def test_a_node_parked_cancelled_and_rewound_runs_when_ready(store: Store) -> None:
    # c is made ready while its workflow is paused (parked), cancelled with its workflow
    # run, and rewound by a retry of b: its rule (one_success) holds by a, so it is made
    # ready again at once, due then, not at the parked instant it was left with.
    tenant = await make_tenant(store)
    nodes = [
        {"name": "a"},
        {"name": "b"},
        {"name": "c", "after": ["a", "b"], "trigger_rule": "one_success"},
    ]
    wf = await create(store, tenant.id, nodes)
    await fire(store, [wf], now=T0)
    worker = await register_worker(store, tenant.id, now=at(1))
    leased = await store.attempts_lease(worker=worker, max=10, now=at(1))
    names = {a.run_id: (await store.runs_get(tenant.id, a.run_id)).node for a in leased}
    by_node = {names[a.run_id]: a for a in leased}
    await store.jobs_pause(tenant.id, wf.job_id, now=at(2))
    a, b = by_node["a"], by_node["b"]
    await store.attempts_complete_many(
        items=[CompleteItem(a.attempt_id, a.fencing_token, {"from": "a"})], now=at(3)
    )
    c = (await nodes_of(store, tenant.id, wf))["c"]
    assert c.state is RunState.SCHEDULED and c.fire_at >= PARKED_FIRE_AT
    await store.attempts_fail_many(
        items=[FailItem(b.attempt_id, b.fencing_token, "boom", retryable=False)], now=at(4)
    )
    await store.runs_cancel(tenant.id, wf.id, reason="stop", now=at(5))
    assert await states_of(store, tenant.id, wf) == {
        "a": "SUCCESS",
        "b": "FAILED",
        "c": "CANCELLED",
    }
    await store.jobs_resume(tenant.id, wf.job_id, now=at(6))
    b_run = (await nodes_of(store, tenant.id, wf))["b"]
    await store.runs_redrive(tenant.id, b_run.id, move=RETRY, now=at(100))
    c = (await nodes_of(store, tenant.id, wf))["c"]
    assert c.state is RunState.DISPATCHED and c.fire_at <= at(100)
    await fire(store, [b_run], now=at(101))
    runner = Runner(store, tenant.id)
    runner.clock = 102
    assert await runner.step({}) == ["b", "c"]
    assert (await store.runs_get(tenant.id, wf.id)).state is RunState.SUCCESS


def fan_out_and_in(width: int) -> list[dict[str, Any]]:
    """root, then n0 … n(width - 1) after it, then sink after them all."""
    return [
        {"name": "root"},
        *({"name": f"n{i}", "after": ["root"]} for i in range(width)),
        {"name": "sink", "after": [f"n{i}" for i in range(width)]},
    ]


async def test_a_wide_fan_out_and_in(store: Store) -> None:
    tenant = await make_tenant(store)
    width = 1000
    wf = await create(store, tenant.id, fan_out_and_in(width))
    await fire(store, [wf], now=T0)
    runner = Runner(store, tenant.id)
    assert await runner.step({}) == ["root"]
    assert len(await runner.step({})) == width
    assert await runner.step({}) == ["sink"]
    sink = (await nodes_of(store, tenant.id, wf))["sink"]
    assert len(sink.payload[UPSTREAM_KEY]) == width
    assert (await store.runs_get(tenant.id, wf.id)).state is RunState.SUCCESS


async def test_a_long_chain(store: Store) -> None:
    tenant = await make_tenant(store)
    length = 200
    nodes = [{"name": "n0"}, *({"name": f"n{i}", "after": [f"n{i - 1}"]} for i in range(1, length))]
    wf = await create(store, tenant.id, nodes)
    await fire(store, [wf], now=T0)
    runner = Runner(store, tenant.id)
    for i in range(length):
        assert await runner.step({}) == [f"n{i}"]
    assert (await store.runs_get(tenant.id, wf.id)).state is RunState.SUCCESS


def test_a_cycle_is_named() -> None:
    with pytest.raises(
        ValidationError, match=r"a cycle: (a -> c -> b -> a|b -> a -> c -> b|c -> b -> a -> c)"
    ):
        spec(
            [
                {"name": "a", "after": ["b"]},
                {"name": "b", "after": ["c"]},
                {"name": "c", "after": ["a"]},
            ]
        ).dag()


async def test_a_node_is_due_when_it_became_ready(store: Store) -> None:
    """Its worker and the start-lateness metric measure from the instant the node became
    ready, not from its workflow run's due instant (its due_at, for the key)."""
    tenant = await make_tenant(store)
    wf = await create(store, tenant.id, [{"name": "a"}, {"name": "b", "after": ["a"]}])
    await fire(store, [wf], now=T0)
    worker = await register_worker(store, tenant.id, now=at(1))
    [a] = await store.attempts_lease(worker=worker, max=10, now=at(1))
    assert a.due_at == T0
    await store.attempts_complete_many(
        items=[CompleteItem(a.attempt_id, a.fencing_token, None)], now=at(30)
    )
    [b] = await store.attempts_lease(worker=worker, max=10, now=at(31))
    assert b.due_at == at(30)
    b_run = await store.runs_get(tenant.id, b.run_id)
    assert (b_run.due_at, b_run.fire_at) == (T0, at(30))


async def test_payloads_and_results_with_integers_past_64_bits_flow_on(store: Store) -> None:
    """Nodes made ready together are grouped by their payloads' JSON: an integer
    orjson cannot write must not stop the workflow run."""
    tenant = await make_tenant(store)
    big = 2**70
    wf = await create(
        store,
        tenant.id,
        [
            {"name": "a", "payload": {"n": big}},
            {"name": "b", "after": ["a"], "payload": {"n": big}},
            {"name": "c", "after": ["a"], "payload": {"n": big}},
        ],
    )
    await fire(store, [wf], now=T0)
    runner = Runner(store, tenant.id)
    assert await runner.step({}) == ["a"]
    assert await runner.step({}) == ["b", "c"]
    nodes = await nodes_of(store, tenant.id, wf)
    assert nodes["b"].payload == {"n": big, UPSTREAM_KEY: {"a": {"from": "a"}}}
    assert (await store.runs_get(tenant.id, wf.id)).state is RunState.SUCCESS


async def test_a_retried_node_waits_for_its_upstream_nodes(store: Store) -> None:
    # b is cancelled while it waits for a, which runs; retried, b waits for a again
    # rather than running at once, and when a ends it is made ready with a's result.
    tenant = await make_tenant(store)
    chain = [{"name": "a"}, {"name": "b", "after": ["a"]}, {"name": "c", "after": ["b"]}]
    wf = await create(store, tenant.id, chain)
    await fire(store, [wf], now=T0)
    worker = await register_worker(store, tenant.id, now=at(1))
    [a] = await store.attempts_lease(worker=worker, max=10, now=at(1))
    nodes = await nodes_of(store, tenant.id, wf)
    await store.runs_cancel(tenant.id, nodes["b"].id, reason="not now", now=at(2))
    assert await states_of(store, tenant.id, wf) == {
        "a": "RUNNING",
        "b": "CANCELLED",
        "c": "SKIPPED",
    }
    await store.runs_redrive(tenant.id, nodes["b"].id, move=RETRY, now=at(3))
    b = (await nodes_of(store, tenant.id, wf))["b"]
    assert (b.state, b.reason) == (RunState.PENDING, "retried: waits for its upstream nodes")
    assert await states_of(store, tenant.id, wf) == {
        "a": "RUNNING",
        "b": "PENDING",
        "c": "PENDING",
    }
    assert await store.attempts_lease(worker=worker, max=10, now=at(4)) == []
    await store.attempts_complete_many(
        items=[CompleteItem(a.attempt_id, a.fencing_token, {"from": "a"})], now=at(5)
    )
    b = (await nodes_of(store, tenant.id, wf))["b"]
    assert b.state is RunState.DISPATCHED
    assert b.payload[UPSTREAM_KEY] == {"a": {"from": "a"}}
    runner = Runner(store, tenant.id)
    runner.clock = 6
    assert await runner.step({}) == ["b"]
    assert await runner.step({}) == ["c"]
    assert (await store.runs_get(tenant.id, wf.id)).state is RunState.SUCCESS
    assert [
        (e.from_state, e.to_state, e.reason)
        for e in await events_of(store, tenant.id, run_id=b.id)
        if e.kind == "run.transition" and e.at == at(3)
    ] == [
        ("CANCELLED", "SCHEDULED", "sent back by request"),
        ("SCHEDULED", "PENDING", "retried: waits for its upstream nodes"),
    ]
    assert illegal_transitions(await transitions_of(store, tenant.id, b.id)) == []


async def test_a_retry_while_the_workflow_run_is_being_cancelled_lets_it_end(
    store: Store,
) -> None:
    # r runs when its workflow run is cancelled; a (in a pool no worker serves yet) and
    # c after it are cancelled. Retrying a ends the cancel: the run goes on, and ends
    # once its nodes have, rather than waiting forever with c PENDING.
    tenant_id, wf, r = await cancelled_while_one_runs(
        store, [{"name": "r"}, {"name": "a", "pool": "other"}, {"name": "c", "after": ["a"]}]
    )
    assert await states_of(store, tenant_id, wf) == {
        "r": "RUNNING",
        "a": "CANCELLED",
        "c": "CANCELLED",
    }
    a_run = (await nodes_of(store, tenant_id, wf))["a"]
    await store.runs_redrive(tenant_id, a_run.id, move=RETRY, now=at(3))
    await store.attempts_complete_many(
        items=[CompleteItem(r.attempt_id, r.fencing_token, None)], now=at(4)
    )
    await fire(store, [a_run], now=at(5))
    other = await register_worker(store, tenant_id, pool="other", now=at(6))
    [a] = await store.attempts_lease(worker=other, max=10, now=at(6))
    await store.attempts_complete_many(
        items=[CompleteItem(a.attempt_id, a.fencing_token, None)], now=at(7)
    )
    runner = Runner(store, tenant_id)
    runner.clock = 8
    assert await runner.step({}) == ["c"]
    assert await states_of(store, tenant_id, wf) == {
        "r": "CANCELLED",
        "a": "SUCCESS",
        "c": "SUCCESS",
    }
    ended = await store.runs_get(tenant_id, wf.id)
    assert (ended.state, ended.reason) == (RunState.FAILED, "nodes failed: r")


async def test_a_node_after_one_being_cancelled_is_not_retried(store: Store) -> None:
    # r runs when its workflow run is cancelled: it will end CANCELLED whatever its
    # handler does, so b (all_success after it) could only be skipped again: 409, and
    # nothing changes. c (all_done after b) may run once b has ended either way.
    tenant_id, wf, r = await cancelled_while_one_runs(
        store,
        [
            {"name": "r"},
            {"name": "b", "after": ["r"]},
            {"name": "c", "after": ["b"], "trigger_rule": "all_done"},
        ],
    )
    before = await states_of(store, tenant_id, wf)
    assert before == {"r": "RUNNING", "b": "CANCELLED", "c": "CANCELLED"}
    b_run = (await nodes_of(store, tenant_id, wf))["b"]
    with pytest.raises(ConflictError, match=r"node 'b' cannot run: upstream failed: r"):
        await store.runs_redrive(tenant_id, b_run.id, move=RETRY, now=at(3))
    assert await states_of(store, tenant_id, wf) == before
    # The cancel stood: r's end ends the workflow run CANCELLED. Then the refusal is
    # the same, by r's state.
    await store.attempts_complete_many(
        items=[CompleteItem(r.attempt_id, r.fencing_token, None)], now=at(4)
    )
    assert (await store.runs_get(tenant_id, wf.id)).state is RunState.CANCELLED
    with pytest.raises(ConflictError, match=r"node 'b' cannot run: upstream failed: r"):
        await store.runs_redrive(tenant_id, b_run.id, move=RETRY, now=at(5))


async def test_a_cancel_with_a_reason_ends_the_run_with_it(store: Store) -> None:
    # a runs when its workflow run is cancelled with a reason: a ends CANCELLED
    # "cancelled while running" when its worker reports, and the run with the reason.
    tenant_id, wf, a = await cancelled_while_one_runs(
        store, [{"name": "a"}, {"name": "b", "after": ["a"]}], reason="operator stop"
    )
    assert (await store.runs_get(tenant_id, wf.id)).state is RunState.RUNNING
    await store.attempts_complete_many(
        items=[CompleteItem(a.attempt_id, a.fencing_token, None)], now=at(3)
    )
    nodes = await nodes_of(store, tenant_id, wf)
    assert (nodes["a"].state, nodes["a"].reason) == (
        RunState.CANCELLED,
        "cancelled while running",
    )
    ended = await store.runs_get(tenant_id, wf.id)
    assert (ended.state, ended.reason) == (RunState.CANCELLED, "operator stop")


async def complete_all(store: Store, tenant_id: uuid.UUID, result: Any, *, clock: float) -> int:
    """Lease every ready node run and complete each with ``result``; how many."""
    worker = await register_worker(store, tenant_id, now=at(clock))
    leased = await store.attempts_lease(worker=worker, max=1000, now=at(clock))
    await store.attempts_complete_many(
        items=[CompleteItem(a.attempt_id, a.fencing_token, result) for a in leased],
        now=at(clock + 1),
    )
    return len(leased)


async def test_a_node_whose_input_is_over_the_limit_fails_and_the_run_goes_on(
    store: Store,
) -> None:
    # Three upstream results of 400 kB: over the 1 MiB default together, not alone.
    tenant = await make_tenant(store)
    nodes = [
        {"name": "a"},
        {"name": "b"},
        {"name": "c"},
        {"name": "join", "after": ["a", "b", "c"]},
        {"name": "report", "after": ["join"]},
        {"name": "cleanup", "after": ["join"], "trigger_rule": "all_done"},
    ]
    wf = await create(store, tenant.id, nodes)
    await fire(store, [wf], now=T0)
    assert await complete_all(store, tenant.id, {"rows": "x" * 400_000}, clock=1) == 3

    found = await nodes_of(store, tenant.id, wf)
    join = found["join"]
    assert join.state is RunState.FAILED and join.attempt == 0 and join.finished_at is not None
    assert join.reason is not None and join.reason.startswith("input too large: ")
    assert f"the limit is {NODE_INPUT_MAX}" in join.reason
    assert await transitions_of(store, tenant.id, join.id) == [
        (None, "PENDING"),
        ("PENDING", "FAILED"),
    ]
    # Its dependents are decided as after any failure, in the same transaction.
    assert found["report"].state is RunState.SKIPPED
    assert found["report"].reason is not None and "upstream failed: join" in found["report"].reason
    assert found["cleanup"].state is RunState.DISPATCHED
    assert UPSTREAM_KEY not in found["cleanup"].payload  # join gave it nothing
    assert await complete_all(store, tenant.id, None, clock=3) == 1
    done = await store.runs_get(tenant.id, wf.id)
    assert done.state is RunState.FAILED
    assert done.reason is not None and "join" in done.reason
    # Retried, it waits for its upstream nodes, whose results are over the limit still:
    # it fails again at once, and so does the workflow run.
    await store.runs_redrive(tenant.id, join.id, move=RETRY, now=at(10))
    again = await nodes_of(store, tenant.id, wf)
    assert (again["join"].state, again["report"].state) == (RunState.FAILED, RunState.SKIPPED)
    assert again["join"].reason == join.reason
    assert (await store.runs_get(tenant.id, wf.id)).state is RunState.FAILED


@pytest.fixture
async def small_store(store_url: str) -> AsyncIterator[Store]:
    """A store whose node input limit is 2,048 bytes."""
    small = create_store(store_url, max_node_input_bytes=2048)
    await small.open()
    try:
        yield small
        assert illegal_transitions(await small.events_transitions()) == []
    finally:
        await small.close()


async def test_the_node_input_limit_is_the_stores_and_fails_a_whole_fan_out(
    small_store: Store,
) -> None:
    # A 3 kB result is over the limit for each of the nodes it is given to, which all
    # fail; the sink is skipped and the run ends at once.
    tenant = await make_tenant(small_store)
    width = 5
    wf = await create(small_store, tenant.id, fan_out_and_in(width))
    await fire(small_store, [wf], now=T0)
    assert await complete_all(small_store, tenant.id, {"blob": "y" * 3000}, clock=1) == 1
    assert await states_of(small_store, tenant.id, wf) == {
        "root": "SUCCESS",
        **{f"n{i}": "FAILED" for i in range(width)},
        "sink": "SKIPPED",
    }
    reason = (await nodes_of(small_store, tenant.id, wf))["n0"].reason
    assert reason is not None and "the limit is 2048" in reason
    assert (await small_store.runs_get(tenant.id, wf.id)).state is RunState.FAILED


async def test_failures_over_the_limit_cascade_in_one_transaction(small_store: Store) -> None:
    # Each x fails over the limit (two 1.5 kB results), which makes the next one ready
    # (all_done) with two results again: all decided in one walk of the DAG, down to
    # the sink, which is given nothing and is ready.
    tenant = await make_tenant(small_store)
    done = {"trigger_rule": "all_done"}
    nodes = [
        *({"name": f"b{i}"} for i in range(4)),
        {"name": "x1", "after": ["b0", "b1"]},
        {"name": "x2", "after": ["x1", "b2", "b3"], **done},
        {"name": "x3", "after": ["x2", "b0", "b1"], **done},
        {"name": "sink", "after": ["x3"], **done},
    ]
    wf = await create(small_store, tenant.id, nodes)
    await fire(small_store, [wf], now=T0)
    assert await complete_all(small_store, tenant.id, {"blob": "z" * 1500}, clock=1) == 4
    found = await states_of(small_store, tenant.id, wf)
    assert [found[n] for n in ("x1", "x2", "x3", "sink")] == [
        "FAILED",
        "FAILED",
        "FAILED",
        "DISPATCHED",
    ]


async def test_the_history_shows_a_node_over_the_limit_failing_before_what_it_readied(
    small_store: Store,
) -> None:
    # x fails over the limit; y (all_done after x) is made ready by that failure, and
    # z (all_success after x) skipped: the history has x's end first.
    tenant = await make_tenant(small_store)
    nodes = [
        {"name": "a"},
        {"name": "b"},
        {"name": "x", "after": ["a", "b"]},
        {"name": "y", "after": ["x"], "trigger_rule": "all_done"},
        {"name": "z", "after": ["x"]},
    ]
    wf = await create(small_store, tenant.id, nodes)
    await fire(small_store, [wf], now=T0)
    assert await complete_all(small_store, tenant.id, {"blob": "w" * 1500}, clock=1) == 2
    ids = {n.id: name for name, n in (await nodes_of(small_store, tenant.id, wf)).items()}
    page = await small_store.events_list(tenant.id, job_id=wf.job_id, limit=1000)
    decided = [
        (ids[e.run_id], e.to_state)
        for e in page.items
        if e.run_id in ids and e.from_state == "PENDING"
    ]
    assert decided[-3:] == [("x", "FAILED"), ("z", "SKIPPED"), ("y", "DISPATCHED")]


async def test_nodes_alike_over_the_limit_are_measured_once(
    small_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 50 nodes given the same 3 kB result: one measure when they are grouped, one when
    # the workflow run is decided again with the check in the walk — not one per node.
    measured: list[int] = []
    real = dag_module.json_size_over

    def counting(value: Any, limit: int) -> int | None:
        measured.append(limit)
        return real(value, limit)

    monkeypatch.setattr(dag_module, "json_size_over", counting)
    tenant = await make_tenant(small_store)
    wf = await create(small_store, tenant.id, fan_out_and_in(50))
    await fire(small_store, [wf], now=T0)
    measured.clear()
    assert await complete_all(small_store, tenant.id, {"blob": "v" * 3000}, clock=1) == 1
    assert set((await states_of(small_store, tenant.id, wf)).values()) == {
        "SUCCESS",
        "FAILED",
        "SKIPPED",
    }
    assert measured == [2048, 2048]


async def test_a_workflow_run_is_not_counted_against_its_tenants_concurrency_limit(
    store: Store,
) -> None:
    # The workflow run is RUNNING while its nodes run, but no worker holds it: under a
    # limit of 1 its root is leased, and under 3 a fan-out runs 3 nodes at a time.
    tenant = await make_tenant(store, max_concurrent_runs=1)
    wf = await create(store, tenant.id, [{"name": "root"}, {"name": "n0", "after": ["root"]}])
    await fire(store, [wf], now=T0)
    assert await store.tenants_held([tenant.id], now=at(1)) == {}
    worker = await register_worker(store, tenant.id, now=at(1))
    [root] = await store.attempts_lease(worker=worker, max=10, now=at(1))
    assert (await store.runs_get(tenant.id, root.run_id)).node == "root"
    held = await store.tenants_held([tenant.id], now=at(1))
    assert held[tenant.id].startswith("held by the tenant's limit max_concurrent_runs (1 ")

    wide = await make_tenant(store, max_concurrent_runs=3)
    fan = await create(store, wide.id, fan_out_and_in(10))
    await fire(store, [fan], now=T0)
    assert await complete_all(store, wide.id, None, clock=1) == 1  # the root
    sizes = []
    for clock in range(3, 30, 2):
        done = await complete_all(store, wide.id, None, clock=clock)
        if not done:
            break
        sizes.append(done)
    assert sizes == [3, 3, 3, 1, 1]  # the 10 nodes three at a time, then the sink
    assert (await store.runs_get(wide.id, fan.id)).state is RunState.SUCCESS
