"""The pure part of workflows: what a submission is refused for, and what each trigger
rule decides from the upstream nodes' states."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pydantic
import pytest

from cronwheel.domain import workflow
from cronwheel.domain.errors import ValidationError
from cronwheel.domain.states import RunState
from cronwheel.domain.workflow import (
    NODE_INPUT_MAX,
    NODES_MAX,
    TRIGGER_RULES,
    UPSTREAM_KEY,
    Dag,
    WorkflowSpec,
    cached_dag,
    dag_of,
    decide,
    node_payload,
)
from cronwheel.settings import Settings

P, D, R = RunState.PENDING, RunState.DISPATCHED, RunState.RUNNING
OK, BAD, SKIP = RunState.SUCCESS, RunState.FAILED, RunState.SKIPPED


def dag(*nodes: dict[str, Any]) -> Dag:
    return WorkflowSpec.model_validate(
        {
            "name": "w",
            "schedule": {"asap": True},
            "nodes": [{"task": "t", **n} for n in nodes],
        }
    ).dag()


def join(rule: str) -> Dag:
    """Two upstream nodes, a and b, and j after both under ``rule``."""
    return dag(
        {"name": "a"}, {"name": "b"}, {"name": "j", "after": ["a", "b"], "trigger_rule": rule}
    )


# For each rule: (a, b) -> what j becomes: "ready", "skipped" or None (still waiting).
EXPECTED: dict[str, dict[tuple[RunState, RunState], str | None]] = {
    "all_success": {
        (OK, OK): "ready",
        (OK, R): None,
        (OK, BAD): "skipped",
        (OK, SKIP): "skipped",
        (R, BAD): "skipped",
    },
    "all_done": {
        (OK, OK): "ready",
        (OK, R): None,
        (OK, BAD): "ready",
        (BAD, SKIP): "ready",
        (R, BAD): None,
    },
    "one_success": {
        (OK, R): "ready",
        (BAD, R): None,
        (BAD, BAD): "skipped",
        (SKIP, BAD): "skipped",
        (BAD, OK): "ready",
    },
    "one_failed": {
        (BAD, R): "ready",
        (OK, R): None,
        (OK, OK): "skipped",
        (OK, SKIP): "skipped",
        (RunState.CANCELLED, OK): "ready",
    },
    "none_failed": {
        (OK, OK): "ready",
        (OK, SKIP): "ready",
        (OK, R): None,
        (BAD, R): "skipped",
        (RunState.DEAD_LETTER, OK): "skipped",
    },
}


@pytest.mark.parametrize(
    ("rule", "a", "b", "want"),
    [(rule, a, b, want) for rule, cases in EXPECTED.items() for (a, b), want in cases.items()],
)
def test_each_rule(rule: str, a: RunState, b: RunState, want: str | None) -> None:
    decided = decide(join(rule), {"a": a, "b": b, "j": P})
    got = "ready" if decided.ready == ["j"] else "skipped" if "j" in decided.skipped else None
    assert got == want


def test_every_rule_is_covered() -> None:
    assert set(EXPECTED) == set(TRIGGER_RULES)


def test_roots_are_ready_and_skips_propagate() -> None:
    d = dag(
        {"name": "a"},
        {"name": "b", "after": ["a"]},
        {"name": "c", "after": ["b"]},
        {"name": "d", "after": ["c"], "trigger_rule": "all_done"},
    )
    assert decide(d, dict.fromkeys("abcd", P)).ready == ["a"]
    decided = decide(d, {"a": BAD, "b": P, "c": P, "d": P})
    assert decided.ready == ["d"]
    assert set(decided.skipped) == {"b", "c"}
    assert "upstream failed: a" in decided.skipped["b"]
    assert "upstream skipped: b" in decided.skipped["c"]
    assert decided.outcome is None  # d is still to run


def test_a_skip_passes_down_a_chain_listed_downstream_first_in_one_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Submitted last node first: each node's rule is still read once, after its
    # upstream node's (in a pass per node it was read ~n²/2 times, inside the lock).
    chain = [
        {"name": f"n{i}", **({"after": [f"n{i - 1}"]} if i else {})}
        for i in reversed(range(NODES_MAX))
    ]
    d = dag(*chain)
    reads = 0
    verdict = workflow._verdict

    def counted(rule: str, ups: Any) -> bool | None:
        nonlocal reads
        reads += 1
        return verdict(rule, ups)

    monkeypatch.setattr(workflow, "_verdict", counted)
    decided = decide(d, {"n0": BAD, **{f"n{i}": P for i in range(1, NODES_MAX)}})
    assert len(decided.skipped) == NODES_MAX - 1 and decided.ready == []
    assert decided.outcome is BAD
    assert reads == NODES_MAX - 1


def test_the_outcome_follows_the_nodes() -> None:
    d = dag({"name": "a"}, {"name": "b", "after": ["a"], "trigger_rule": "one_failed"})
    assert decide(d, {"a": OK, "b": P}).outcome is OK  # b skipped: not a failure
    failed = decide(d, {"a": BAD, "b": OK})
    assert failed.outcome is BAD and failed.reason == "nodes failed: a"
    assert decide(d, {"a": OK, "b": R}).outcome is None
    cancelled = decide(d, {"a": RunState.CANCELLED, "b": RunState.CANCELLED}, cancelled=True)
    assert cancelled.outcome is RunState.CANCELLED
    # A cancelled run makes nothing ready.
    assert decide(d, {"a": BAD, "b": P}, cancelled=True).ready == []


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_a_cycle_is_found_in_any_order(order: tuple[int, ...]) -> None:
    nodes = [
        {"name": "a", "after": ["c"]},
        {"name": "b", "after": ["a"]},
        {"name": "c", "after": ["b"]},
    ]
    with pytest.raises(ValidationError) as caught:
        dag({"name": "x"}, *(nodes[i] for i in order))
    message = caught.value.message
    assert message.startswith("nodes: a cycle: ")
    loop = message.removeprefix("nodes: a cycle: ").split(" -> ")
    assert loop[0] == loop[-1] and sorted(loop[:-1]) == ["a", "b", "c"]
    # In the direction work flows: each node is upstream of the next.
    after = {n["name"]: n["after"] for n in nodes}
    assert all(up in after[down] for up, down in itertools.pairwise(loop))


@pytest.mark.parametrize("rule", sorted(set(TRIGGER_RULES) - {"all_success"}))
def test_a_root_node_takes_no_trigger_rule_of_its_own(rule: str) -> None:
    # A root is ready at once: its rule would be stored and never weighed.
    with pytest.raises(ValidationError) as caught:
        dag({"name": "a"}, {"name": "page", "trigger_rule": rule})
    assert caught.value.field == "nodes.1.trigger_rule"
    assert caught.value.message == (
        f"nodes.1.trigger_rule: {rule} weighs the node's upstream nodes, and 'page' has"
        " none (a node with no 'after' runs at once)"
    )
    # The default, said or not, and any rule on a node with upstream nodes, are taken.
    assert dag({"name": "a", "trigger_rule": "all_success"}, {"name": "b"}).nodes
    assert dag({"name": "a"}, {"name": "b", "after": ["a"], "trigger_rule": rule}).nodes


def test_a_long_chain_and_a_cycle_through_it() -> None:
    chain = [
        {"name": "n0"},
        *({"name": f"n{i}", "after": [f"n{i - 1}"]} for i in range(1, NODES_MAX)),
    ]
    assert len(dag(*chain).nodes) == NODES_MAX  # no recursion limit
    chain[0] = {"name": "n0", "after": [f"n{NODES_MAX - 1}"]}
    with pytest.raises(ValidationError, match="a cycle"):
        dag(*chain)


def test_upstream_results_join_the_payload() -> None:
    d = dag({"name": "a", "payload": {"x": 1, "y": 2}})
    assert node_payload(d.nodes[0].template, {"y": 3}, {"up": {"r": 1}}) == {
        "x": 1,
        "y": 3,
        UPSTREAM_KEY: {"up": {"r": 1}},
    }
    assert node_payload(d.nodes[0].template, None, {}) == {"x": 1, "y": 2}


def test_descendants() -> None:
    d = dag(
        {"name": "a"}, {"name": "b", "after": ["a"]}, {"name": "c", "after": ["b"]}, {"name": "z"}
    )
    assert d.descendants("a") == ["b", "c"]
    assert d.descendants("z") == []
    assert Dag.from_json(d.to_json()) == d


def test_a_workflows_dag_is_read_once_per_process() -> None:
    d = dag({"name": "a"}, {"name": "b", "after": ["a"]})
    workflow_id = uuid.uuid4()
    assert cached_dag(workflow_id) is None
    first = dag_of(workflow_id, d.to_json())
    assert first == d and first.by_name["b"].after == ("a",)
    assert cached_dag(workflow_id) is first
    # Once read, the stored form is not read again: a workflow's DAG never changes.
    assert dag_of(workflow_id, {"nodes": []}) is first


def test_the_node_input_limit_is_read_and_may_not_be_below_the_payload_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().node_input_limit == NODE_INPUT_MAX == 1024 * 1024
    monkeypatch.setenv("CRONWHEEL_MAX_NODE_INPUT_BYTES", "4194304")
    assert Settings().node_input_limit == 4 * 1024 * 1024
    monkeypatch.setenv("CRONWHEEL_MAX_PAYLOAD_BYTES", "8388608")
    with pytest.raises(
        pydantic.ValidationError,
        match=r"CRONWHEEL_MAX_NODE_INPUT_BYTES \(4194304\) must be at least the payload limit, "
        r"CRONWHEEL_MAX_PAYLOAD_BYTES \(8388608\)",
    ):
        Settings()
    # Unset, it follows a payload limit set above it: raising that alone still starts.
    monkeypatch.delenv("CRONWHEEL_MAX_NODE_INPUT_BYTES")
    assert Settings().node_input_limit == 8 * 1024 * 1024


def test_a_node_refused_as_unfit_fails_and_its_dependents_are_decided_in_the_same_walk() -> None:
    # x1 is refused; x2 (all_done) then holds and is refused too; x3 (all_done) holds
    # and fits; y (all_success after x1) is skipped; the run ends FAILED once x3 has.
    d = dag(
        {"name": "a"},
        {"name": "x1", "after": ["a"]},
        {"name": "x2", "after": ["x1"], "trigger_rule": "all_done"},
        {"name": "x3", "after": ["x2"], "trigger_rule": "all_done"},
        {"name": "y", "after": ["x1"]},
    )
    asked: list[tuple[str, dict[str, RunState]]] = []

    def unfit(node: workflow.DagNode, now: Any) -> str | None:
        asked.append((node.name, {u: now[u] for u in node.after}))
        return "too big" if node.name in ("x1", "x2") else None

    states = {"a": OK, "x1": P, "x2": P, "x3": P, "y": P}
    decided = decide(d, states, unfit=unfit)
    assert decided.failed == {"x1": "too big", "x2": "too big"}
    assert decided.ready == ["x3"] and list(decided.skipped) == ["y"]
    assert "upstream failed: x1" in decided.skipped["y"]
    assert decided.outcome is None
    # Asked only of nodes whose rule holds, each seeing its upstream as decided so far.
    assert asked == [("x1", {"a": OK}), ("x2", {"x1": BAD}), ("x3", {"x2": BAD})]
    assert decide(d, {**states, "x1": BAD, "x2": BAD, "x3": OK, "y": SKIP}).outcome is BAD
    assert decide(d, states).failed == {}
