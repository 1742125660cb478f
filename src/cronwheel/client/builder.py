"""A workflow written in Python: :class:`Workflow` builds the body of
``POST /v1/workflows``, and ``client.workflows.create`` takes it as it is.

::

    from cronwheel.client import Workflow

    wf = Workflow("etl", schedule={"cron": "0 * * * *", "timezone": "Europe/Paris"})
    extract = wf.node("extract", task="etl.extract", retry={"max_attempts": 3})
    a = wf.node("transform_a", task="etl.transform", payload={"part": "a"})
    b = wf.node("transform_b", task="etl.transform", payload={"part": "b"})
    load = wf.node("load", task="etl.load", trigger_rule="all_done")
    extract >> [a, b] >> load
    client.workflows.create(wf)

``a >> b`` puts ``b`` after ``a`` (``a`` becomes one of ``b``'s upstream nodes) and
answers ``b``, so that chains read left to right; a list on one side fans out or in
(``a >> [b, c]`` answers the list, ``[b, c] >> d`` answers ``d``; Python has no ``>>``
between two lists: link them node by node). The builder refuses at once what can
never be sent: a node name used twice, an edge between two workflows' nodes, an edge
that closes a cycle (a ``>>`` refused links nothing), and a schedule, payload, webhook
or retry policy that is not a mapping. Everything else (node names, field values, the
number of nodes) is the server's to check, so that its rules live in one place.
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

__all__ = ["Node", "Workflow"]

# Node fields sent only when given, so that the server's defaults apply otherwise.
_OPTIONAL_FIELDS = (
    "task",
    "webhook",
    "payload",
    "pool",
    "requires",
    "tags",
    "route_tags",
    "priority",
    "retry",
    "timeout",
    "heartbeat_timeout",
    "progress_timeout",
    "trigger_rule",
)


class Node:
    """A node of a :class:`Workflow` (made by :meth:`Workflow.node`): its name, its
    fields and its upstream nodes. ``>>`` links nodes."""

    __slots__ = ("_after", "fields", "name", "workflow")

    def __init__(self, workflow: Workflow, name: str, fields: dict[str, Any]) -> None:
        self.workflow = workflow
        self.name = name
        self.fields = fields
        self._after: list[Node] = []

    @property
    def after(self) -> tuple[Node, ...]:
        """The node's direct upstream nodes, in the order they were linked."""
        return tuple(self._after)

    def set_after(self, *upstream: Node) -> Node:
        """Put this node after each of ``upstream`` (those it already follows are
        left as they are); answers this node. Refused (one of them is of another
        workflow, or would close a cycle), it links none of them."""
        self.workflow._link_all([(node, self) for node in upstream])
        return self

    @overload
    def __rshift__(self, other: Node) -> Node: ...
    @overload
    def __rshift__(self, other: Sequence[Node]) -> list[Node]: ...
    def __rshift__(self, other: Node | Sequence[Node]) -> Node | list[Node]:
        if isinstance(other, Node):
            return other.set_after(self)
        downstream = _nodes(other, "the right of >>")
        self.workflow._link_all([(self, node) for node in downstream])
        return downstream

    def __rrshift__(self, other: Sequence[Node]) -> Node:
        # ``[b, c] >> d``: a list has no ``>>``, so Python asks ``d``.
        return self.set_after(*_nodes(other, "the left of >>"))

    def __repr__(self) -> str:
        return f"<Node {self.name!r} of workflow {self.workflow.name!r}>"


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{what}: expected a mapping (a JSON object), got {value!r}")
    return value


def _texts(value: Sequence[str] | None, what: str) -> list[str] | None:
    """A list of texts (tags, capabilities) as given; a text alone is refused, where
    ``list()`` would split it into its letters (``tags="etl"`` as e, t, l)."""
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"{what}: expected a list of texts, got {value!r}")
    return list(value)


def _nodes(value: object, where: str) -> list[Node]:
    if not isinstance(value, list | tuple) or not all(isinstance(n, Node) for n in value):
        raise TypeError(f"{where}: expected a node or a list of nodes, got {value!r}")
    return list(value)


class Workflow:
    """A workflow being written: its name, schedule and nodes. :meth:`to_spec` gives
    the body of ``POST /v1/workflows``."""

    def __init__(
        self,
        name: str,
        *,
        schedule: Mapping[str, Any],
        tags: Sequence[str] | None = None,
        lateness_budget: float | None = None,
    ) -> None:
        self.name = name
        self.schedule = dict(_mapping(schedule, "schedule"))
        self.tags = _texts(tags, "tags")
        self.lateness_budget = lateness_budget
        self._nodes: dict[str, Node] = {}
        self._downstream: dict[str, list[Node]] = {}

    def node(
        self,
        name: str,
        *,
        task: str | None = None,
        webhook: Mapping[str, Any] | None = None,
        payload: Mapping[str, Any] | None = None,
        pool: str | None = None,
        requires: Sequence[str] | None = None,
        tags: Sequence[str] | None = None,
        route_tags: Sequence[str] | None = None,
        priority: int | None = None,
        retry: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        heartbeat_timeout: float | None = None,
        progress_timeout: float | None = None,
        trigger_rule: str | None = None,
        after: Iterable[Node] = (),
    ) -> Node:
        """A new node: a task (or a webhook) with the fields of a job's runs, run once
        its ``trigger_rule`` (default ``all_success``) holds over its upstream nodes
        (``after``, or linked later with ``>>``). ValueError when the workflow
        already has a node of that name."""
        if name in self._nodes:
            raise ValueError(f"workflow {self.name!r} already has a node named {name!r}")
        given = {
            "task": task,
            "webhook": None if webhook is None else dict(_mapping(webhook, "webhook")),
            "payload": None if payload is None else dict(_mapping(payload, "payload")),
            "pool": pool,
            "requires": _texts(requires, "requires"),
            "tags": _texts(tags, "tags"),
            "route_tags": _texts(route_tags, "route_tags"),
            "priority": priority,
            "retry": None if retry is None else dict(_mapping(retry, "retry")),
            "timeout": timeout,
            "heartbeat_timeout": heartbeat_timeout,
            "progress_timeout": progress_timeout,
            "trigger_rule": trigger_rule,
        }
        upstream = list(after)
        for node in upstream:
            self._check_own(node)
        made = Node(self, name, {k: v for k, v in given.items() if v is not None})
        self._nodes[name] = made
        return made.set_after(*upstream)

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The nodes in the order they were made."""
        return tuple(self._nodes.values())

    def __getitem__(self, name: str) -> Node:
        try:
            return self._nodes[name]
        except KeyError:
            raise KeyError(f"workflow {self.name!r} has no node named {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self._nodes.values())

    def _check_own(self, node: Node) -> None:
        if not isinstance(node, Node):
            raise TypeError(f"expected a node, got {node!r}")
        if node.workflow is not self:
            raise ValueError(
                f"node {node.name!r} is of workflow {node.workflow.name!r}: it cannot be "
                f"linked to the nodes of workflow {self.name!r}"
            )

    def _link_all(self, edges: Sequence[tuple[Node, Node]]) -> None:
        """Put each ``(upstream, node)``'s node after its upstream node, all or none:
        every edge is checked first. (Edges that share one end — all a ``>>`` makes —
        cannot close a cycle together that none closes alone.)"""
        for upstream, node in edges:
            self._check_own(node)
            self._check_own(upstream)
            path = self._path(node, upstream)
            if path is not None and upstream not in node._after:
                cycle = " -> ".join(n.name for n in [upstream, *path])
                raise ValueError(f"{upstream.name} >> {node.name} would close a cycle: {cycle}")
        for upstream, node in edges:
            if upstream not in node._after:
                node._after.append(upstream)
                self._downstream.setdefault(upstream.name, []).append(node)

    def _path(self, start: Node, goal: Node) -> list[Node] | None:
        """The nodes from ``start`` down to ``goal`` (both included) along the links,
        if ``goal`` is downstream of ``start``."""
        came_from: dict[str, Node | None] = {start.name: None}
        todo = [start]
        while todo:
            current = todo.pop()
            if current is goal:
                path = [current]
                while (previous := came_from[path[-1].name]) is not None:
                    path.append(previous)
                return path[::-1]
            for nxt in self._downstream.get(current.name, []):
                if nxt.name not in came_from:
                    came_from[nxt.name] = current
                    todo.append(nxt)
        return None

    def to_spec(self) -> dict[str, Any]:
        """The body of ``POST /v1/workflows`` (a copy: changing it changes nothing
        here). Nodes come upstream first, otherwise in the order they were made (the
        order the server shows them in)."""
        spec: dict[str, Any] = {
            "name": self.name,
            "schedule": self.schedule,
            "nodes": [
                {"name": n.name, **n.fields, "after": [u.name for u in n._after]}
                for n in self._upstream_first()
            ],
        }
        if self.tags is not None:
            spec["tags"] = list(self.tags)
        if self.lateness_budget is not None:
            spec["lateness_budget"] = self.lateness_budget
        return copy.deepcopy(spec)

    def _upstream_first(self) -> list[Node]:
        """The nodes in an order where each comes after its upstream nodes, otherwise
        in the order they were made (there is no cycle, so every node is placed)."""
        nodes = self.nodes
        index = {n.name: i for i, n in enumerate(nodes)}
        waiting_on = {n.name: len(n._after) for n in nodes}
        ready = [index[n.name] for n in nodes if not n._after]
        out: list[Node] = []
        while ready:
            node = nodes[heapq.heappop(ready)]
            out.append(node)
            for after in self._downstream.get(node.name, []):
                waiting_on[after.name] -= 1
                if not waiting_on[after.name]:
                    heapq.heappush(ready, index[after.name])
        return out

    def __repr__(self) -> str:
        return f"<Workflow {self.name!r}: {len(self._nodes)} nodes>"
