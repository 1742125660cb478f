"""Workflows: DAGs of nodes, each node a run template, scheduled like a job.

A workflow is stored as a job whose ``workflow`` column holds its DAG
(:class:`Dag`). Each firing makes a *workflow run* (a run of that job which no worker
leases) and one *node run* per node, created PENDING and made ready — DISPATCHED — the
moment its trigger rule holds, or SKIPPED when the rule can no longer hold. This module
is the pure part: the definition, its validation, and :func:`decide`, which tells from
the nodes' states what each waiting node becomes and what the workflow run's state is.
The store applies the decisions (``store/sql/workflows.py``).

Trigger rules, over a node's direct upstream nodes once they end (a node with none is a
root, ready at once):

=============  =============================================  ==========================
rule           ready when                                      skipped when
=============  =============================================  ==========================
all_success    every upstream succeeded                        one failed or was skipped
all_done       every upstream ended, however                   never
one_success    one upstream succeeded                          all ended, none succeeded
one_failed     one upstream failed                             all ended, none failed
none_failed    every upstream ended, none failed               one failed
=============  =============================================  ==========================

An upstream *failed* when its run ended FAILED, DEAD_LETTER or CANCELLED. A skipped node
counts as ended for its own dependents, so skips propagate under ``all_success``.
"""

from __future__ import annotations

import re
import typing
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from graphlib import TopologicalSorter
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidatorFunctionWrapHandler, field_validator

from cronwheel.domain.audit import Actor
from cronwheel.domain.bounds import Label, Name, Seconds
from cronwheel.domain.errors import PayloadTooLargeError, ValidationError
from cronwheel.domain.model import NewJob
from cronwheel.domain.new_job import JobLimits, check_json_size, new_job
from cronwheel.domain.spec import (
    LATENESS_BUDGET_DEFAULT,
    LATENESS_BUDGET_MAX,
    JobSpec,
    RunSpec,
    ScheduleSpec,
    _Strict,
    parse_schedule,
)
from cronwheel.domain.states import RunState
from cronwheel.domain.template import RunTemplate
from cronwheel.jsontext import canonical

__all__ = [
    "FAILED_STATES",
    "GATE_LAYER_MIN",
    "NODES_MAX",
    "NODE_INPUT_MAX",
    "TRIGGER_RULES",
    "UPSTREAM_DONE",
    "UPSTREAM_KEY",
    "WORKFLOW_POOL",
    "Dag",
    "DagNode",
    "Decisions",
    "NodeSpec",
    "TriggerRule",
    "Unfit",
    "WorkflowSpec",
    "armable",
    "cached_dag",
    "check_trigger_payload",
    "dag_of",
    "decide",
    "may_hold",
    "never_runs",
    "new_workflow",
    "node_name_problem",
    "node_payload",
]

GATE_LAYER_MIN = 16
"""The fewest nodes after the same upstream nodes that are reserved ahead of their gate
(a layer): making a node or a few ready and leasing them costs a few milliseconds, while
a node begun at its gate waits for its start to be recorded before its outcome can be
(a chain's hop, measured, was slower so); a layer of hundreds made ready at once costs
as many rewritten rows on the path from its upstream's end."""

UPSTREAM_DONE = "upstream nodes done"
"""The reason a node with upstream nodes was made ready (its READY transition's)."""

NODES_MAX = 2_000
"""The most nodes a workflow may have."""

NODE_INPUT_MAX = 1024 * 1024
"""The most bytes of JSON a ready node's payload may be by default, its upstream
nodes' results included (``CRONWHEEL_MAX_NODE_INPUT_BYTES``): a node made ready over it
fails instead of being dispatched."""

WORKFLOW_POOL = ""
"""The pool of a workflow run: no pool name can be empty, so no worker ever leases one,
and firing tells a workflow run from any other run by it."""

UPSTREAM_KEY = "upstream"
"""The key of a node run's payload under which its upstream nodes' results are given:
``{"upstream": {"extract": {...its result...}}}``, for those that succeeded."""

TriggerRule = Literal["all_success", "all_done", "one_success", "one_failed", "none_failed"]
TRIGGER_RULES: tuple[str, ...] = typing.get_args(TriggerRule)

FAILED_STATES = frozenset({RunState.FAILED, RunState.DEAD_LETTER, RunState.CANCELLED})
_ENDED = FAILED_STATES | {RunState.SUCCESS, RunState.SKIPPED}

_NODE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,100}")


def node_name_problem(value: str) -> str | None:
    """Why ``value`` cannot be a node's name (None: it can)."""
    shown = repr(value if len(value) <= 100 else value[:100] + "…")
    if not _NODE_NAME.fullmatch(value):
        return f"{shown}: a node name is 1 to 100 letters, digits, '_', '-' or '.'"
    if not value.strip("."):
        # '.' and '..' would be path segments in the node's URLs, which clients resolve.
        return f"{shown}: a node name cannot be dots alone"
    return None


def _node_name(value: str) -> str:
    problem = node_name_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


_NodeName = Annotated[str, AfterValidator(_node_name)]


class NodeSpec(RunSpec):
    """One node as submitted: a run template, its upstream nodes and its trigger rule."""

    name: _NodeName
    after: list[_NodeName] = Field(
        default_factory=list,
        max_length=NODES_MAX,
        description="the nodes this one depends on (its direct upstream)",
    )
    trigger_rule: TriggerRule = Field(
        default="all_success",
        description="when the node runs, from its upstream nodes' outcomes: all_success "
        "(default), all_done, one_success, one_failed, none_failed",
    )

    @field_validator("payload")
    @classmethod
    def _payload(cls, value: dict[str, Any]) -> dict[str, Any]:
        if UPSTREAM_KEY in value:
            raise ValueError(
                f"{UPSTREAM_KEY!r} is where a node receives its upstream nodes' results: "
                "choose another key"
            )
        return value


class WorkflowSpec(_Strict):
    """A workflow as submitted: its schedule and its DAG of nodes."""

    name: Name
    schedule: Annotated[
        ScheduleSpec, Field(description="one of at / delay / asap / cron / interval")
    ]
    nodes: list[NodeSpec] = Field(min_length=1, max_length=NODES_MAX)
    tags: list[Label] = Field(
        default_factory=list,
        max_length=50,
        description="labels to find and filter the workflow and its runs by",
    )
    lateness_budget: Seconds = Field(
        default=LATENESS_BUDGET_DEFAULT,
        ge=1,
        le=LATENESS_BUDGET_MAX,
        description="seconds a workflow run may go unfired past its instant before it "
        "counts as missed, as for a job",
    )

    @field_validator("schedule", mode="wrap")
    @classmethod
    def _schedule(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return handler(parse_schedule(value))

    def dag(self) -> Dag:
        """The DAG, checked: unique names, known upstream nodes, no cycle. Raises
        :class:`ValidationError` naming the problem."""
        return Dag.of_specs(self.nodes)


@dataclass(frozen=True, slots=True)
class DagNode:
    name: str
    after: tuple[str, ...]
    trigger_rule: str
    template: RunTemplate

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "after": list(self.after),
            "trigger_rule": self.trigger_rule,
            "template": self.template.to_json(),
        }


@dataclass(frozen=True, slots=True)
class Dag:
    """A checked DAG, nodes in their submitted order (which is a valid one to show)."""

    nodes: tuple[DagNode, ...]
    # Made once: advancing a 1,000-node workflow run looks nodes up by name 1,000 times.
    by_name: dict[str, DagNode] = field(init=False, repr=False, compare=False)
    # Each node's own payload as canonical JSON: nodes made ready together whose
    # payloads are alike share one write.
    payload_keys: dict[str, bytes] = field(init=False, repr=False, compare=False)
    # Every node after its upstream nodes, whatever the submitted order: deciding in
    # this order passes a skip down a whole chain in one pass.
    order: tuple[DagNode, ...] = field(init=False, repr=False, compare=False)
    # The layers (at least GATE_LAYER_MIN nodes after the same upstream nodes), each as
    # those upstream nodes and its nodes: the ones worth reserving ahead of their gate
    # (see :func:`armable`).
    layers: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = field(
        init=False, repr=False, compare=False
    )
    # Each node's upstream nodes as a number, shared by the nodes after the very same
    # ones (in the same order): what is worked out once for a fan-out's 1,000 nodes.
    after_class: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {n.name: n for n in self.nodes})
        layers: dict[tuple[str, ...], list[str]] = {}
        classes: dict[tuple[str, ...], int] = {}
        for n in self.nodes:
            classes.setdefault(n.after, len(classes))
            if n.after:
                layers.setdefault(tuple(sorted(n.after)), []).append(n.name)
        object.__setattr__(
            self,
            "layers",
            tuple(
                (after, tuple(names))
                for after, names in layers.items()
                if len(names) >= GATE_LAYER_MIN
            ),
        )
        object.__setattr__(self, "after_class", {n.name: classes[n.after] for n in self.nodes})
        object.__setattr__(self, "order", self._dependency_order())
        object.__setattr__(
            self,
            "payload_keys",
            {n.name: canonical(n.template.payload) for n in self.nodes},
        )

    def _dependency_order(self) -> tuple[DagNode, ...]:
        """The nodes, each after its upstream nodes: as submitted when they already are
        (the builder sends them so; a linear check), sorted otherwise."""
        seen: set[str] = set()
        for node in self.nodes:
            if not seen.issuperset(node.after):
                sorter = TopologicalSorter({n.name: n.after for n in self.nodes})
                return tuple(self.by_name[name] for name in sorter.static_order())
            seen.add(node.name)
        return self.nodes

    @classmethod
    def of_specs(cls, specs: Sequence[NodeSpec]) -> Dag:
        seen: set[str] = set()
        for i, spec in enumerate(specs):
            if spec.name in seen:
                raise ValidationError(
                    f"nodes.{i}.name: two nodes are named {spec.name!r}", field=f"nodes.{i}.name"
                )
            seen.add(spec.name)
        for i, spec in enumerate(specs):
            for j, up in enumerate(spec.after):
                if up not in seen:
                    raise ValidationError(
                        f"nodes.{i}.after.{j}: no node is named {up!r}",
                        field=f"nodes.{i}.after.{j}",
                    )
                if up == spec.name:
                    raise ValidationError(
                        f"nodes.{i}.after: a cycle: {up} -> {up}", field=f"nodes.{i}.after"
                    )
            if len(set(spec.after)) != len(spec.after):
                raise ValidationError(
                    f"nodes.{i}.after: names a node twice", field=f"nodes.{i}.after"
                )
            if not spec.after and spec.trigger_rule != "all_success":
                # A root is ready at once: a rule over its upstream nodes would be
                # stored and never weighed (one_failed would page on every run).
                raise ValidationError(
                    f"nodes.{i}.trigger_rule: {spec.trigger_rule} weighs the node's upstream"
                    f" nodes, and {spec.name!r} has none (a node with no 'after' runs at once)",
                    field=f"nodes.{i}.trigger_rule",
                )
        cycle = _cycle({s.name: s.after for s in specs})
        if cycle:
            raise ValidationError(f"nodes: a cycle: {' -> '.join(cycle)}", field="nodes")
        nodes = tuple(
            DagNode(
                name=s.name,
                after=tuple(s.after),
                trigger_rule=s.trigger_rule,
                template=RunTemplate.from_json(
                    s.model_dump(mode="json", exclude={"name", "after", "trigger_rule"})
                ),
            )
            for s in specs
        )
        return cls(nodes)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Dag:
        """The DAG as stored (``jobs.workflow``)."""
        return cls(
            tuple(
                DagNode(
                    name=n["name"],
                    after=tuple(n["after"]),
                    trigger_rule=n["trigger_rule"],
                    template=RunTemplate.from_json(n["template"]),
                )
                for n in data["nodes"]
            )
        )

    def to_json(self) -> dict[str, Any]:
        return {"nodes": [n.to_json() for n in self.nodes]}

    def downstream(self) -> dict[str, list[str]]:
        """Each node's direct dependents, in definition order."""
        out: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for up in n.after:
                out[up].append(n.name)
        return out

    def descendants(self, name: str) -> list[str]:
        """Every node downstream of ``name``, transitively, in definition order."""
        below = self.downstream()
        found: set[str] = set()
        stack = [name]
        while stack:
            for child in below[stack.pop()]:
                if child not in found:
                    found.add(child)
                    stack.append(child)
        return [n.name for n in self.nodes if n.name in found]


def _cycle(after: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle of the graph (node -> its upstream nodes) as ``[a, b, ..., a]`` in the
    direction work flows, or None. Iterative: a 2,000-node chain recurses no deeper."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(after, WHITE)
    for start in after:
        if colour[start] != WHITE:
            continue
        path: list[str] = [start]
        iters = [iter(after[start])]
        colour[start] = GREY
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                colour[path.pop()] = BLACK
                iters.pop()
                continue
            if colour[nxt] == GREY:
                loop = [*path[path.index(nxt) :], nxt]
                return list(reversed(loop))  # upstream first: the way work flows
            if colour[nxt] == WHITE:
                colour[nxt] = GREY
                path.append(nxt)
                iters.append(iter(after[nxt]))
    return None


# DAGs by workflow id, read once per process: a workflow's DAG never changes once
# created (workflows are not editable), and a 2,000-node one takes milliseconds to read.
_DAGS: OrderedDict[uuid.UUID, Dag] = OrderedDict()
_DAGS_MAX = 1_000


def cached_dag(workflow_id: uuid.UUID) -> Dag | None:
    """The DAG of workflow ``workflow_id`` if this process has read it."""
    return _DAGS.get(workflow_id)


def dag_of(workflow_id: uuid.UUID, data: Mapping[str, Any]) -> Dag:
    """The DAG of workflow ``workflow_id``, stored as ``data`` (``jobs.workflow``)."""
    dag = _DAGS.get(workflow_id)
    if dag is None:
        dag = _DAGS[workflow_id] = Dag.from_json(data)
        while len(_DAGS) > _DAGS_MAX:
            _DAGS.popitem(last=False)
    return dag


@dataclass(frozen=True, slots=True)
class Decisions:
    """What :func:`decide` found: nodes to make ready, nodes to skip (with why), nodes
    that fail instead of being made ready (with why: ``unfit``), and the workflow
    run's state when every node has ended (None while one is live)."""

    ready: list[str]
    skipped: dict[str, str]
    outcome: RunState | None
    reason: str | None = None
    failed: dict[str, str] = field(default_factory=dict)


Unfit = Callable[[DagNode, Mapping[str, RunState]], str | None]
"""Why a node whose rule holds cannot be made ready, given every node's state as
decided so far (None: it can)."""


def _verdict(rule: str, ups: Sequence[RunState]) -> bool | None:
    """True: the rule holds; False: it never can; None: not yet."""
    n = len(ups)
    ok = failed = done = 0
    for s in ups:  # one pass: a fan-in's sink counts 1,000 upstream states a batch
        if s is RunState.SUCCESS:
            ok += 1
        elif s in FAILED_STATES:
            failed += 1
        elif s in _ENDED:
            done += 1
    done += ok + failed
    if rule == "all_success":
        return True if ok == n else (False if done > ok else None)
    if rule == "all_done":
        return True if done == n else None
    if rule == "one_success":
        return True if ok or n == 0 else (False if done == n else None)
    if rule == "one_failed":
        return True if failed or n == 0 else (False if done == n else None)
    if rule == "none_failed":
        return False if failed else (True if done == n else None)
    raise ValueError(f"unknown trigger rule {rule!r}")


def never_runs(dag: Dag, name: str, states: Mapping[str, RunState]) -> str | None:
    """Why node ``name``'s trigger rule can never hold over its upstream nodes'
    ``states``, each node's by name (None: it holds, or may yet)."""
    node = dag.by_name[name]
    if not may_hold(node.trigger_rule, [states[u] for u in node.after]):
        return _skip_reason(node.trigger_rule, node, states)
    return None


def may_hold(rule: str, ups: Sequence[RunState]) -> bool:
    """Whether trigger rule ``rule`` holds, or may yet, over upstream states ``ups``."""
    return _verdict(rule, ups) is not False


def _skip_reason(rule: str, node: DagNode, states: Mapping[str, RunState]) -> str:
    failed = [u for u in node.after if states[u] in FAILED_STATES]
    skipped = [u for u in node.after if states[u] is RunState.SKIPPED]
    if rule == "one_failed":
        return "no upstream node failed (trigger rule one_failed)"
    if rule == "one_success":
        return "no upstream node succeeded (trigger rule one_success)"
    parts = []
    if failed:
        parts.append(f"upstream failed: {', '.join(failed)}")
    if skipped:
        parts.append(f"upstream skipped: {', '.join(skipped)}")
    return f"{'; '.join(parts)} (trigger rule {rule})"


def decide(
    dag: Dag,
    states: Mapping[str, RunState],
    *,
    cancelled: bool = False,
    unfit: Unfit | None = None,
) -> Decisions:
    """From each node's run state, the PENDING nodes that become ready or skipped —
    skips followed through to their dependents — and the workflow run's outcome once
    no node is live. A node whose rule holds but which ``unfit`` refuses fails
    instead, and its dependents are decided as after any failure, in the same walk. A
    cancelled workflow run makes nothing ready: its waiting nodes are left for the
    store to cancel."""
    now = dict(states)
    ready: list[str] = []
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    if not cancelled:
        # Upstream nodes first: a node's rule reads their states as decided here.
        for node in dag.order:
            if now[node.name] is not RunState.PENDING:
                continue
            verdict = _verdict(node.trigger_rule, [now[u] for u in node.after])
            why = None if verdict is not True or unfit is None else unfit(node, now)
            if why is not None:
                failed[node.name] = why
                now[node.name] = RunState.FAILED
            elif verdict is True:
                ready.append(node.name)
                now[node.name] = RunState.DISPATCHED
            elif verdict is False:
                skipped[node.name] = _skip_reason(node.trigger_rule, node, now)
                now[node.name] = RunState.SKIPPED
    outcome: RunState | None = None
    reason: str | None = None
    if all(s in _ENDED for s in now.values()):
        ended_badly = [n.name for n in dag.nodes if now[n.name] in FAILED_STATES]
        if cancelled:
            outcome, reason = RunState.CANCELLED, "workflow run cancelled"
        elif ended_badly:
            outcome = RunState.FAILED
            reason = f"nodes failed: {', '.join(ended_badly[:20])}" + (
                f" and {len(ended_badly) - 20} more" if len(ended_badly) > 20 else ""
            )
        else:
            outcome = RunState.SUCCESS
    return Decisions(ready, skipped, outcome, reason, failed)


# Upstream states under which a waiting node may be reserved ahead of its gate: each
# upstream node is ready, running or done well, so the node is likely to run next.
_UNDER_WAY = frozenset({RunState.DISPATCHED, RunState.RUNNING, RunState.SUCCESS})


def armable(dag: Dag, states: Mapping[str, RunState], decided: Decisions) -> list[str]:
    """The nodes of layers (:data:`GATE_LAYER_MIN`) still waiting once ``decided`` is
    applied to ``states`` whose upstream nodes are all under way (ready, running or
    succeeded): a worker may reserve them, gated, before they are ready
    (``docs/reservations.md``). None of a cancelled or ended workflow run, and never a
    root (it is ready at once)."""
    if not dag.layers or decided.outcome is not None:
        return []
    now = dict(states)
    now.update(dict.fromkeys(decided.ready, RunState.DISPATCHED))
    now.update(dict.fromkeys(decided.skipped, RunState.SKIPPED))
    now.update(dict.fromkeys(decided.failed, RunState.FAILED))
    return [
        name
        for after, names in dag.layers
        if all(now[u] in _UNDER_WAY for u in after)  # once for the whole layer
        for name in names
        if now[name] is RunState.PENDING
    ]


def check_trigger_payload(dag: Dag, payload: Mapping[str, Any], *, limit: int) -> None:
    """Refuse a trigger's ``payload``, merged over every node's own (see
    :func:`node_payload`), that takes the key of the upstream results (422) or that
    makes a node's payload larger than ``limit`` bytes of JSON (413, naming the node)."""
    if UPSTREAM_KEY in payload:
        raise ValidationError(
            f"payload: {UPSTREAM_KEY!r} is where a node receives its upstream nodes' "
            "results: choose another key",
            field="payload",
        )
    for node in dag.nodes:
        try:
            check_json_size({**node.template.payload, **payload}, limit=limit, field="payload")
        except PayloadTooLargeError as exc:
            raise PayloadTooLargeError(
                f"{exc.message}, merged over node {node.name!r}'s own", field="payload"
            ) from None


def node_payload(
    template: RunTemplate,
    extra: Mapping[str, Any] | None,
    upstream: Mapping[str, Any],
) -> dict[str, Any]:
    """A ready node run's payload: the node's own, the workflow run's (a trigger's)
    merged over it, and its succeeded upstream nodes' results under
    :data:`UPSTREAM_KEY`."""
    payload = {**template.payload, **(extra or {})}
    if upstream:
        payload[UPSTREAM_KEY] = dict(upstream)
    return payload


def new_workflow(
    spec: WorkflowSpec,
    *,
    now: datetime,
    limits: JobLimits,
    actor: Actor | None = None,
    idempotency_key: str | None = None,
) -> NewJob:
    """The workflow to create from ``spec`` at ``now``: its DAG checked, each node's
    payload within the limit, and its first due instant resolved as a job's is (the
    store writes it as a job whose ``workflow`` is the DAG)."""
    dag = spec.dag()
    for i, node in enumerate(spec.nodes):
        check_json_size(node.payload, limit=limits.max_payload_bytes, field=f"nodes.{i}.payload")
    # The job a workflow is stored as: its schedule and labels. Its template's target is
    # never used: a workflow run is run by its nodes (the store clears it).
    as_job = JobSpec(
        name=spec.name,
        schedule=spec.schedule,
        task=spec.name,
        tags=spec.tags,
        lateness_budget=spec.lateness_budget,
    )
    made = new_job(as_job, now=now, limits=limits, actor=actor, idempotency_key=idempotency_key)
    return replace(made, workflow=dag.to_json())
