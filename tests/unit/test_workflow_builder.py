"""The Workflow builder: ``>>`` links nodes, ``to_spec`` gives the body of ``POST
/v1/workflows``, and what could never be sent (a name twice, a cycle, another
workflow's node) is refused where it is written."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime
from typing import Any

import pytest

from cronwheel.client import Node, Workflow
from cronwheel.client.calls import Calls

HOURLY = {"cron": "0 * * * *", "timezone": "Europe/Paris"}


def _after(spec: dict[str, Any]) -> dict[str, list[str]]:
    return {n["name"]: n["after"] for n in spec["nodes"]}


def test_a_chain_with_fan_out_and_fan_in() -> None:
    wf = Workflow("etl", schedule=HOURLY, tags=["etl"], lateness_budget=60)
    extract = wf.node(
        "extract", task="etl.extract", payload={"source": "s3"}, retry={"max_attempts": 3}
    )
    a = wf.node("transform_a", task="etl.transform", payload={"part": "a"})
    b = wf.node("transform_b", task="etl.transform", pool="big", timeout=600)
    load = wf.node("load", task="etl.load", trigger_rule="all_done")

    assert (extract >> [a, b]) == [a, b]
    assert ([a, b] >> load) is load
    assert wf.to_spec() == {
        "name": "etl",
        "schedule": HOURLY,
        "tags": ["etl"],
        "lateness_budget": 60,
        "nodes": [
            {
                "name": "extract",
                "task": "etl.extract",
                "payload": {"source": "s3"},
                "retry": {"max_attempts": 3},
                "after": [],
            },
            {
                "name": "transform_a",
                "task": "etl.transform",
                "payload": {"part": "a"},
                "after": ["extract"],
            },
            {
                "name": "transform_b",
                "task": "etl.transform",
                "pool": "big",
                "timeout": 600,
                "after": ["extract"],
            },
            {
                "name": "load",
                "task": "etl.load",
                "trigger_rule": "all_done",
                "after": ["transform_a", "transform_b"],
            },
        ],
    }


def test_one_expression_and_chains_answer_their_last_node() -> None:
    wf = Workflow("w", schedule={"asap": True})
    a, b, c, d, e = (wf.node(n, task="t") for n in "abcde")
    assert (a >> (b, c) >> d >> e) is e
    assert _after(wf.to_spec()) == {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": ["d"]}
    assert e.after == (d,) and d.after == (b, c)


def test_unset_fields_are_left_to_the_server() -> None:
    wf = Workflow("w", schedule={"delay": 5})
    wf.node("only", task="t")
    assert wf.to_spec() == {
        "name": "w",
        "schedule": {"delay": 5},
        "nodes": [{"name": "only", "task": "t", "after": []}],
    }


@pytest.mark.parametrize("field", ["requires", "tags", "route_tags"])
def test_a_text_where_a_list_of_texts_goes_is_refused(field: str) -> None:
    # list("gpu") would be g, p, u: routing the node where nothing asked.
    wf = Workflow("w", schedule={"delay": 5})
    with pytest.raises(TypeError, match=f"{field}: expected a list of texts, got 'gpu'"):
        wf.node("a", task="t", **{field: "gpu"})
    assert wf.nodes == ()
    wf.node("a", task="t", **{field: ("gpu", "eu")})
    assert wf.to_spec()["nodes"][0][field] == ["gpu", "eu"]
    with pytest.raises(TypeError, match="tags: expected a list of texts, got 'etl'"):
        Workflow("w", schedule={"delay": 5}, tags="etl")


def test_a_node_made_before_its_upstream_is_sent_after_it() -> None:
    wf = Workflow("w", schedule={"asap": True})
    load = wf.node("load", task="t")
    side = wf.node("side", task="t")
    extract = wf.node("extract", task="t")
    extract >> load
    # Upstream first; otherwise the order the nodes were made in.
    assert [n["name"] for n in wf.to_spec()["nodes"]] == ["side", "extract", "load"]
    assert wf.nodes == (load, side, extract)


def test_after_links_as_the_node_is_made() -> None:
    wf = Workflow("w", schedule={"asap": True})
    a = wf.node("a", task="t")
    b = wf.node("b", task="t")
    c = wf.node("c", webhook={"url": "https://example.com/hook"}, after=[a, b])
    assert c.after == (a, b)
    assert _after(wf.to_spec())["c"] == ["a", "b"]
    assert wf.to_spec()["nodes"][2]["webhook"] == {"url": "https://example.com/hook"}


def test_a_link_made_twice_counts_once() -> None:
    wf = Workflow("w", schedule={"asap": True})
    a, b = wf.node("a", task="t"), wf.node("b", task="t")
    a >> b
    a >> b
    b.set_after(a)
    assert _after(wf.to_spec()) == {"a": [], "b": ["a"]}


def test_a_name_used_twice_is_refused() -> None:
    wf = Workflow("w", schedule={"asap": True})
    first = wf.node("extract", task="t")
    with pytest.raises(ValueError, match="workflow 'w' already has a node named 'extract'"):
        wf.node("extract", task="other")
    assert wf.nodes == (first,) and wf["extract"].fields == {"task": "t"}


def test_a_cycle_is_refused_naming_its_nodes() -> None:
    wf = Workflow("w", schedule={"asap": True})
    a, b, c = (wf.node(n, task="t") for n in "abc")
    a >> b >> c
    with pytest.raises(ValueError, match=r"c >> a would close a cycle: c -> a -> b -> c"):
        c >> a
    with pytest.raises(ValueError, match=r"a >> a would close a cycle: a -> a"):
        a >> a
    assert _after(wf.to_spec()) == {"a": [], "b": ["a"], "c": ["b"]}


def test_a_node_of_another_workflow_is_refused() -> None:
    one, two = Workflow("one", schedule={"asap": True}), Workflow("two", schedule={"asap": True})
    a, b = one.node("a", task="t"), two.node("b", task="t")
    with pytest.raises(ValueError, match="node 'a' is of workflow 'one': it cannot be linked"):
        a >> b
    with pytest.raises(ValueError, match="node 'b' is of workflow 'two'"):
        [b] >> a
    with pytest.raises(ValueError, match="node 'b' is of workflow 'two'"):
        one.node("c", task="t", after=[b])
    assert "c" not in one and one.nodes == (a,) and a.after == () and b.after == ()


def test_only_nodes_can_be_linked() -> None:
    wf = Workflow("w", schedule={"asap": True})
    a = wf.node("a", task="t")
    with pytest.raises(TypeError, match="expected a node or a list of nodes"):
        a >> ["b"]  # type: ignore[list-item]
    with pytest.raises(TypeError, match="expected a node or a list of nodes"):
        "a" >> a  # type: ignore[operator]


def test_nodes_are_found_by_name() -> None:
    wf = Workflow("w", schedule={"asap": True})
    a = wf.node("a", task="t")
    assert wf["a"] is a and "a" in wf and "b" not in wf and len(wf) == 1 and list(wf) == [a]
    with pytest.raises(KeyError, match="no node named 'b'"):
        wf["b"]
    assert isinstance(a, Node) and repr(a) == "<Node 'a' of workflow 'w'>"


def test_the_builder_and_its_body_make_the_same_request() -> None:
    wf = Workflow("w", schedule={"asap": True})
    wf.node("a", task="t") >> wf.node("b", task="t", trigger_rule="one_failed")
    from_builder = Calls.workflows_create(wf)
    from_body = Calls.workflows_create(wf.to_spec())
    assert from_builder == from_body
    assert (from_builder.method, from_builder.path) == ("POST", "/v1/workflows")
    assert from_builder.json == wf.to_spec()


def test_the_spec_is_a_copy() -> None:
    wf = Workflow("w", schedule={"asap": True})
    wf.node("a", task="t", payload={"k": 1})
    spec = wf.to_spec()
    spec["nodes"][0]["payload"]["k"] = 2
    spec["schedule"]["asap"] = False
    assert wf.to_spec()["nodes"][0]["payload"] == {"k": 1}
    assert wf.to_spec()["schedule"] == {"asap": True}


def test_a_chain_of_the_most_nodes_a_workflow_may_have() -> None:
    # Each link looks for a cycle downstream of the new node only: nothing there yet.
    wf = Workflow("long", schedule={"asap": True})
    previous = wf.node("n0", task="t")
    for i in range(1, 2000):
        previous = previous >> wf.node(f"n{i}", task="t")
    names = [n["name"] for n in wf.to_spec()["nodes"]]
    assert names == [f"n{i}" for i in range(2000)]


def test_a_refused_link_links_nothing() -> None:
    wf = Workflow("w", schedule={"asap": True})
    x, y, z = (wf.node(n, task="t") for n in "xyz")
    z >> x
    with pytest.raises(ValueError, match="x >> z would close a cycle: x -> z -> x"):
        x >> [y, z]
    assert y.after == () and x.after == (z,)
    with pytest.raises(ValueError, match="x >> z would close a cycle"):
        z.set_after(y, x)
    assert z.after == () and _after(wf.to_spec()) == {"y": [], "z": [], "x": ["z"]}


def test_what_is_not_a_mapping_is_refused_where_it_is_written() -> None:
    with pytest.raises(TypeError, match=r"schedule: expected a mapping \(a JSON object\)"):
        Workflow("w", schedule=None)  # type: ignore[arg-type]
    wf = Workflow("w", schedule={"asap": True})
    for field in ("payload", "webhook", "retry"):
        with pytest.raises(
            TypeError, match=rf"{field}: expected a mapping \(a JSON object\), got \[1, 2\]"
        ):
            wf.node("a", task="t", **{field: [1, 2]})
    assert len(wf) == 0


def test_instants_dates_and_ids_are_sent_as_json() -> None:
    at = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    wf = Workflow("w", schedule={"at": at})
    wf.node("a", task="t", payload={"day": date(2031, 1, 2), "id": uuid.UUID(int=7)})
    body = Calls.workflows_create(wf).json
    assert body["schedule"] == {"at": "2031-01-02T03:04:05Z"}
    assert body["nodes"][0]["payload"] == {
        "day": "2031-01-02",
        "id": "00000000-0000-0000-0000-000000000007",
    }
    assert json.loads(json.dumps(body)) == body


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "x" * 101])
def test_a_node_name_no_node_can_have_is_refused_before_it_is_sent(name: str) -> None:
    with pytest.raises(ValueError, match="no node is named"):
        Calls.workflow_runs_retry_node(uuid.UUID(int=1), name, None)
    call = Calls.workflow_runs_retry_node(uuid.UUID(int=1), "load.v2", None)
    assert call.path.endswith("/nodes/load.v2/retry")
