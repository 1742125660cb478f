"""Rows written and records read: the one place a table's row turns into a domain
record, and a new run's or event's row is built."""

from __future__ import annotations

import base64
import binascii
import functools
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic_core import to_jsonable_python
from sqlalchemy.engine import Row

from cronwheel.domain.audit import Actor, AuditRecord
from cronwheel.domain.bulk import Operation, OperationState
from cronwheel.domain.errors import IllegalTransitionError, ValidationError
from cronwheel.domain.model import Attempt, Event, Job, Run, Tenant, Worker
from cronwheel.domain.states import AttemptState, JobState, RunState, illegal_transitions
from cronwheel.domain.template import RunTemplate

__all__ = [
    "AUDIT_COLUMNS",
    "EVENT_COLUMNS",
    "EVENT_SHARED",
    "NEW_JOB_COLUMNS",
    "NEW_RUN_COLUMNS",
    "RUN_TEMPLATE_COLUMNS",
    "attempt_from",
    "audit_from",
    "audit_record",
    "event_from",
    "event_record",
    "event_row",
    "history_cursor",
    "history_position",
    "int_cursor",
    "job_from",
    "lateness_reason",
    "new_run_record",
    "new_run_row",
    "operation_from",
    "run_from",
    "run_from_mapping",
    "run_template_values",
    "tenant_from",
    "uuid_cursor",
    "worker_from",
]


# A new event's columns, in the order of its record (:func:`event_record`): first what
# every event of one change shares (:data:`EVENT_SHARED` of them), then what names its
# job, run and attempt, and its data.
EVENT_COLUMNS = (
    "tenant_id",
    "at",
    "kind",
    "from_state",
    "to_state",
    "actor",
    "reason",
    "job_id",
    "run_id",
    "attempt_id",
    "data",
)
EVENT_SHARED = 7


@functools.cache
def _allowed(source: str | None, target: str) -> bool:
    """Whether the state machine allows a run to move from ``source`` to ``target``
    (a pure function of two names: asked once per pair, not once per event)."""
    return not illegal_transitions([(source, target)])


def event_record(
    *,
    at: datetime,
    kind: str,
    tenant_id: uuid.UUID | None,
    job_id: uuid.UUID | None = None,
    run_id: uuid.UUID | None = None,
    attempt_id: uuid.UUID | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    actor: str | None = None,
    reason: str | None = None,
    data: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """An event's values, in the order of :data:`EVENT_COLUMNS`. A ``run.transition``
    must be one the state machine allows (a run begins SCHEDULED): a statement about to
    record another fails before it is written."""
    if kind == "run.transition" and not _allowed(from_state, to_state or ""):
        raise IllegalTransitionError(
            f"a run cannot move from {from_state or 'nothing'} to {to_state}",
            source=from_state,
            target=to_state,
        )
    return (
        tenant_id,
        at,
        kind,
        from_state,
        to_state,
        actor,
        reason,
        job_id,
        run_id,
        attempt_id,
        data,
    )


# An audit record's columns, in the order of :func:`audit_record`.
AUDIT_COLUMNS = (
    "at",
    "tenant_id",
    "actor",
    "role",
    "key_id",
    "request_id",
    "action",
    "target_kind",
    "target_id",
    "reason",
    "before",
    "after",
)


def audit_record(
    actor: Actor,
    *,
    at: datetime,
    tenant_id: uuid.UUID | None,
    action: str,
    target_kind: str,
    target_id: uuid.UUID | str | None,
    reason: str | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """An audit record's values (``domain/audit.py``), in the order of
    :data:`AUDIT_COLUMNS`; ``before`` and ``after`` as JSON values."""
    return (
        at,
        tenant_id,
        actor.name,
        actor.role,
        actor.key_id,
        actor.request_id,
        action,
        target_kind,
        None if target_id is None else str(target_id),
        reason,
        None if before is None else to_jsonable_python(before),
        None if after is None else to_jsonable_python(after),
    )


def event_row(
    *,
    at: datetime,
    kind: str,
    tenant_id: uuid.UUID | None,
    job_id: uuid.UUID | None = None,
    run_id: uuid.UUID | None = None,
    attempt_id: uuid.UUID | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    actor: str | None = None,
    reason: str | None = None,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """:func:`event_record` by column name."""
    record = event_record(
        at=at,
        kind=kind,
        tenant_id=tenant_id,
        job_id=job_id,
        run_id=run_id,
        attempt_id=attempt_id,
        from_state=from_state,
        to_state=to_state,
        actor=actor,
        reason=reason,
        data=data,
    )
    return dict(zip(EVENT_COLUMNS, record, strict=True))


def lateness_reason(fire_at: datetime, at: datetime) -> str | None:
    """Say why a run went out late, when it did by more than a second."""
    late = (at - fire_at).total_seconds()
    if late <= 1.0:
        return None
    return f"dispatched {late:.1f} s after its due time (scheduler catching up)"


# A new job's columns, in the order of its record (``store/sql/jobs.py`` makes it).
NEW_JOB_COLUMNS = (
    "id",
    "tenant_id",
    "name",
    "state",
    "kind",
    "schedule",
    "template",
    "tags",
    "version",
    "next_due_at",
    "idempotency_key",
    "request_hash",
    "created_at",
    "updated_at",
)


# A new run's columns, in the order of its record (:func:`new_run_record`); those it
# leaves out take their defaults.
NEW_RUN_COLUMNS = (
    "id",
    "tenant_id",
    "job_id",
    "job_name",
    "shard",
    "state",
    "origin",
    "due_at",
    "due_local",
    "fire_at",
    "priority",
    "pool",
    "requires",
    "tags",
    "route_tags",
    "task",
    "webhook",
    "payload",
    "attempt",
    "max_attempts",
    "retry",
    "timeout",
    "heartbeat_timeout",
    "progress_timeout",
    "created_at",
    "reason",
    "finished_at",
)


def new_run_record(
    *,
    run_id: uuid.UUID,
    tenant_id: uuid.UUID,
    job_id: uuid.UUID,
    name: str,
    template: RunTemplate,
    due_at: datetime,
    due_local: str | None,
    shard: int,
    at: datetime,
    origin: str = "once",
    fire_at: datetime | None = None,
    state: RunState = RunState.SCHEDULED,
    reason: str | None = None,
    finished_at: datetime | None = None,
) -> tuple[Any, ...]:
    """A new run's values, in the order of :data:`NEW_RUN_COLUMNS`, its template copied
    from the job's (so leasing needs no join)."""
    return (
        run_id,
        tenant_id,
        job_id,
        name,
        shard,
        state.value,
        origin,
        due_at,
        due_local,
        fire_at or due_at,
        template.priority,
        template.pool,
        template.requires,
        template.tags,
        template.route_tags,
        template.task,
        template.webhook,
        template.payload,
        0,
        template.max_attempts,
        template.retry,
        template.timeout,
        template.heartbeat_timeout,
        template.progress_timeout,
        at,
        reason,
        finished_at,
    )


# The columns a run copies from its job — its name and template — so leasing needs no
# join: what an edit of the job rewrites on its pending occurrence.
RUN_TEMPLATE_COLUMNS = (
    "job_name",
    "priority",
    "pool",
    "requires",
    "tags",
    "route_tags",
    "task",
    "webhook",
    "payload",
    "max_attempts",
    "retry",
    "timeout",
    "heartbeat_timeout",
    "progress_timeout",
)


def run_template_values(name: str, template: RunTemplate) -> dict[str, Any]:
    """:data:`RUN_TEMPLATE_COLUMNS` of a run of the job ``name`` with ``template``, as
    :func:`new_run_record` writes them (a test holds the two together)."""
    return {
        "job_name": name,
        "priority": template.priority,
        "pool": template.pool,
        "requires": template.requires,
        "tags": template.tags,
        "route_tags": template.route_tags,
        "task": template.task,
        "webhook": template.webhook,
        "payload": template.payload,
        "max_attempts": template.max_attempts,
        "retry": template.retry,
        "timeout": template.timeout,
        "heartbeat_timeout": template.heartbeat_timeout,
        "progress_timeout": template.progress_timeout,
    }


def new_run_row(
    *,
    run_id: uuid.UUID,
    tenant_id: uuid.UUID,
    job_id: uuid.UUID,
    name: str,
    template: RunTemplate,
    due_at: datetime,
    due_local: str | None,
    shard: int,
    at: datetime,
    origin: str = "once",
    fire_at: datetime | None = None,
    state: RunState = RunState.SCHEDULED,
) -> dict[str, Any]:
    """:func:`new_run_record` by column name."""
    record = new_run_record(
        run_id=run_id,
        tenant_id=tenant_id,
        job_id=job_id,
        name=name,
        template=template,
        due_at=due_at,
        due_local=due_local,
        shard=shard,
        at=at,
        origin=origin,
        fire_at=fire_at,
        state=state,
    )
    return dict(zip(NEW_RUN_COLUMNS, record, strict=True))


# -- cursors -------------------------------------------------------------------


def uuid_cursor(cursor: str | None) -> uuid.UUID | None:
    if cursor is None:
        return None
    try:
        return uuid.UUID(cursor)
    except ValueError:
        raise ValidationError("malformed cursor", field="cursor") from None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_HISTORY = "h1"  # the cursor format's version: a changed format refuses old cursors


def history_cursor(due_at: datetime, run_id: uuid.UUID) -> str:
    """The opaque cursor after the run at (``due_at``, ``run_id``) in the run history's
    order (``due_at`` descending, then ``id`` descending): its position, in microseconds
    since the epoch and the id's hex, base64url without padding."""
    micros = (due_at - _EPOCH) // timedelta(microseconds=1)
    raw = f"{_HISTORY}.{micros}.{run_id.hex}".encode("ascii")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def history_position(cursor: str | None) -> tuple[datetime, uuid.UUID] | None:
    """The (``due_at``, ``id``) a :func:`history_cursor` names; a cursor this did not
    make is a :class:`ValidationError` (400)."""
    if cursor is None:
        return None
    try:
        if not cursor.isascii() or len(cursor) > 100:
            raise ValueError(cursor)
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        version, micros, hex_id = raw.split(".")
        if version != _HISTORY or not micros.lstrip("-").isdigit() or len(hex_id) != 32:
            raise ValueError(cursor)
        due_at = _EPOCH + timedelta(microseconds=int(micros))
        return due_at, uuid.UUID(hex=hex_id)
    except (ValueError, UnicodeDecodeError, binascii.Error, OverflowError):
        raise ValidationError("malformed cursor", field="cursor") from None


def int_cursor(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    if not (cursor.isascii() and cursor.isdigit()) or len(cursor) > 18:
        raise ValidationError("malformed cursor", field="cursor")
    return int(cursor)


# -- rows to records ---------------------------------------------------------------


def tenant_from(row: Row[Any]) -> Tenant:
    return Tenant(id=row.id, name=row.name, limits=dict(row.limits), created_at=row.created_at)


def job_from(row: Row[Any]) -> Job:
    return Job(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        state=JobState(row.state),
        kind=row.kind,
        schedule=row.schedule,
        template=RunTemplate.from_json(row.template),
        version=row.version,
        next_due_at=row.next_due_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        idempotency_key=row.idempotency_key,
        overlay=row.overrides,
        workflow=row._mapping.get("workflow"),
    )


def run_from(row: Row[Any]) -> Run:
    return run_from_mapping(row._mapping)


def run_from_mapping(m: Mapping[Any, Any]) -> Run:
    """A run from its columns by name: a row read, or a new run's row as written (the
    columns it leaves to their defaults are the new run's: see ``new_run_row``)."""
    return Run(
        id=m["id"],
        tenant_id=m["tenant_id"],
        job_id=m["job_id"],
        job_name=m["job_name"],
        shard=m["shard"],
        state=RunState(m["state"]),
        due_at=m["due_at"],
        due_local=m["due_local"],
        fire_at=m["fire_at"],
        priority=m["priority"],
        pool=m["pool"],
        requires=list(m["requires"]),
        tags=list(m["tags"]),
        task=m["task"],
        webhook=m["webhook"],
        payload=m["payload"],
        attempt=m["attempt"],
        max_attempts=m["max_attempts"],
        retry=m["retry"],
        timeout=m["timeout"],
        heartbeat_timeout=m["heartbeat_timeout"],
        reason=m.get("reason"),
        created_at=m["created_at"],
        dispatched_at=m.get("dispatched_at"),
        started_at=m.get("started_at"),
        finished_at=m.get("finished_at"),
        result=m.get("result"),
        last_error=m.get("last_error"),
        origin=m["origin"],
        wait_reason=m.get("wait_reason"),
        progress_timeout=m["progress_timeout"],
        quarantined_at=m.get("quarantined_at"),
        route_tags=list(m.get("route_tags") or []),
        workflow_run_id=m.get("workflow_run_id"),
        node=m.get("node") or "",
        **_overlay(m.get("overrides")),
    )


def _overlay(value: Mapping[str, Any] | None) -> dict[str, Any]:
    if not value:
        return {}
    return {"override_ids": [uuid.UUID(i) for i in value["ids"]], "base": value["base"]}


def attempt_from(row: Row[Any]) -> Attempt:
    return Attempt(
        id=row.id,
        tenant_id=row.tenant_id,
        run_id=row.run_id,
        number=row.number,
        worker_id=row.worker_id,
        fencing_token=row.fencing_token,
        state=AttemptState(row.state),
        lease_expires_at=row.lease_expires_at,
        deadline=row.deadline,
        started_at=row.started_at,
        heartbeat_at=row.heartbeat_at,
        finished_at=row.finished_at,
        error=row.error,
        result=row.result,
        progress_deadline=row.progress_deadline,
        progress_at=row.progress_at,
        progress_details=row.progress_details,
    )


def audit_from(row: Row[Any]) -> AuditRecord:
    return AuditRecord(
        id=row.id,
        at=row.at,
        tenant_id=row.tenant_id,
        actor=row.actor,
        role=row.role,
        key_id=row.key_id,
        request_id=row.request_id,
        action=row.action,
        target_kind=row.target_kind,
        target_id=row.target_id,
        reason=row.reason,
        before=row.before,
        after=row.after,
    )


def event_from(row: Row[Any]) -> Event:
    return Event(
        id=row.id,
        tenant_id=row.tenant_id,
        at=row.at,
        kind=row.kind,
        job_id=row.job_id,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
        from_state=row.from_state,
        to_state=row.to_state,
        actor=row.actor,
        reason=row.reason,
        data=dict(row.data or {}),
    )


def worker_from(row: Row[Any]) -> Worker:
    return Worker(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        pool=row.pool,
        capabilities=list(row.capabilities),
        tags=list(row.tags),
        capacity=row.capacity,
        registered_at=row.registered_at,
        last_seen_at=row.last_seen_at,
        deregistered_at=row.deregistered_at,
        webhooks_only=bool(row.webhooks_only),
        tasks=None if row.tasks is None else list(row.tasks),
    )


def operation_from(row: Row[Any]) -> Operation:
    return Operation(
        id=row.id,
        tenant_id=row.tenant_id,
        action=row.action,
        selector=dict(row.selector),
        reason=row.reason,
        actor=row.actor,
        state=OperationState(row.state),
        matched=row.matched,
        changed=row.changed,
        skipped=dict(row.skipped or {}),
        created_at=row.accepted_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        error=row.error,
        details=dict(row.details or {}),
    )
