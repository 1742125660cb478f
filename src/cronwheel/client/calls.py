"""Every request the API offers, as a :class:`Call` built without I/O, so that the
blocking and the asyncio clients send each one the same way."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

from pydantic_core import to_jsonable_python

from cronwheel.client.builder import Workflow
from cronwheel.domain.spec import TenantLimits
from cronwheel.domain.workflow import node_name_problem

__all__ = ["Call", "Calls", "Id", "Json", "query_params"]

Json = dict[str, Any]
Id = str | uuid.UUID


@dataclass(frozen=True, slots=True)
class Call:
    """One API request, built without I/O so both clients send it the same way."""

    method: str
    path: str
    params: dict[str, str | list[str]] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def _seg(value: Id) -> str:
    """An id as one path segment: nothing in it can climb to another route — nor be
    empty or dots alone, which the path would lose or climb by (ValueError)."""
    text = str(value)
    if not text.strip("."):
        raise ValueError(f"{text!r} names nothing here: an id or a name is needed")
    return quote(text, safe="")


def _definitions(
    path: str,
    state: str | None,
    tag: str | None,
    name_prefix: str | None,
    cursor: str | None,
    limit: int | None,
) -> Call:
    """A page of jobs or of workflows, by the filters both lists take."""
    params = query_params(state=state, tag=tag, name_prefix=name_prefix, cursor=cursor, limit=limit)
    return Call("GET", path, params=params)


def query_params(**values: Any) -> dict[str, str | list[str]]:
    out: dict[str, str | list[str]] = {}
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, datetime):
            out[key] = value.isoformat()
        elif isinstance(value, list | tuple | set | frozenset):
            out[key] = ",".join(str(v) for v in value)
        else:
            out[key] = str(value)
    return out


def _body(value: Any) -> Any:
    """Pydantic models, datetimes and UUIDs as JSON values."""
    return to_jsonable_python(value, by_alias=True, exclude_none=True)


def _overrides_of(job_id: Id | None, run_id: Id | None) -> str:
    """The overrides of a job or of a run: exactly one is named."""
    if (job_id is None) == (run_id is None):
        raise ValueError("name the job (job_id) or the run (run_id), not both")
    if run_id is not None:
        return f"/v1/runs/{_seg(run_id)}/overrides"
    return f"/v1/jobs/{_seg(job_id or '')}/overrides"


def _reason(reason: str | None) -> Json:
    return {} if reason is None else {"reason": reason}


def _limits(limits: Mapping[str, Any] | TenantLimits) -> Json:
    """Tenant limits as sent: the fields named (a model: the fields set), None
    included, for None clears a limit."""
    if isinstance(limits, TenantLimits):
        return limits.model_dump(mode="json", exclude_unset=True)
    return {key: to_jsonable_python(value) for key, value in limits.items()}


class Calls:
    """Every request the resources make, as :class:`Call` values."""

    @staticmethod
    def tenants_create(name: str, limits: Mapping[str, Any] | TenantLimits | None) -> Call:
        body: dict[str, Any] = {"name": name}
        if limits is not None:
            body["limits"] = _limits(limits)
        return Call("POST", "/v1/tenants", json=body)

    @staticmethod
    def tenants_get(tenant_id: Id) -> Call:
        return Call("GET", f"/v1/tenants/{_seg(tenant_id)}")

    @staticmethod
    def tenants_list(cursor: str | None, limit: int | None) -> Call:
        return Call("GET", "/v1/tenants", params=query_params(cursor=cursor, limit=limit))

    @staticmethod
    def tenants_update(tenant_id: Id, limits: Mapping[str, Any] | TenantLimits) -> Call:
        return Call("PATCH", f"/v1/tenants/{_seg(tenant_id)}", json={"limits": _limits(limits)})

    @staticmethod
    def tenants_create_key(tenant_id: Id, role: str) -> Call:
        return Call("POST", f"/v1/tenants/{_seg(tenant_id)}/keys", json={"role": role})

    @staticmethod
    def tenants_list_keys(tenant_id: Id, cursor: str | None, limit: int | None) -> Call:
        return Call(
            "GET",
            f"/v1/tenants/{_seg(tenant_id)}/keys",
            params=query_params(cursor=cursor, limit=limit),
        )

    @staticmethod
    def tenants_revoke_key(tenant_id: Id, key_id: Id, reason: str | None) -> Call:
        return Call(
            "DELETE",
            f"/v1/tenants/{_seg(tenant_id)}/keys/{_seg(key_id)}",
            params=query_params(reason=reason),
        )

    @staticmethod
    def tenants_delete(tenant_id: Id, force: bool, reason: str | None) -> Call:
        params = query_params(force="true" if force else None, reason=reason)
        return Call("DELETE", f"/v1/tenants/{_seg(tenant_id)}", params=params)

    @staticmethod
    def jobs_create(
        name: str,
        schedule: Any,
        task: str | None,
        idempotency_key: str | None,
        fields: Mapping[str, Any],
    ) -> Call:
        body: Json = {"name": name, "schedule": _body(schedule)}
        if task is not None:
            body["task"] = task
        body.update({k: _body(v) for k, v in fields.items() if v is not None})
        headers = {} if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        return Call("POST", "/v1/jobs", json=body, headers=headers)

    @staticmethod
    def jobs_get(job_id: Id) -> Call:
        return Call("GET", f"/v1/jobs/{_seg(job_id)}")

    @staticmethod
    def jobs_list(
        state: str | None,
        tag: str | None,
        name_prefix: str | None,
        cursor: str | None,
        limit: int | None,
    ) -> Call:
        return _definitions("/v1/jobs", state, tag, name_prefix, cursor, limit)

    @staticmethod
    def jobs_update(
        job_id: Id, fields: Mapping[str, Any], if_version: int | None, reason: str | None
    ) -> Call:
        # None is a value here (back to the default): sent as null.
        body: Json = {k: to_jsonable_python(v, by_alias=True) for k, v in fields.items()}
        if reason is not None:
            body["reason"] = reason
        headers = {} if if_version is None else {"If-Match": f'"{if_version}"'}
        return Call("PATCH", f"/v1/jobs/{_seg(job_id)}", json=body, headers=headers)

    @staticmethod
    def jobs_cancel(job_id: Id, reason: str | None) -> Call:
        body = {} if reason is None else {"reason": reason}
        return Call("POST", f"/v1/jobs/{_seg(job_id)}/cancel", json=body)

    @staticmethod
    def jobs_delete(job_id: Id, force: bool, reason: str | None) -> Call:
        params = query_params(force="true" if force else None, reason=reason)
        return Call("DELETE", f"/v1/jobs/{_seg(job_id)}", params=params)

    @staticmethod
    def jobs_control(job_id: Id, action: str, reason: str | None) -> Call:
        body = {} if reason is None else {"reason": reason}
        return Call("POST", f"/v1/jobs/{_seg(job_id)}/{action}", json=body)

    @staticmethod
    def jobs_trigger(job_id: Id, payload: Mapping[str, Any] | None) -> Call:
        body = {} if payload is None else {"payload": _body(payload)}
        return Call("POST", f"/v1/jobs/{_seg(job_id)}/trigger", json=body)

    @staticmethod
    def jobs_backfill(job_id: Id, start: datetime, end: datetime, rate: float | None) -> Call:
        body: Json = {"from": _body(start), "to": _body(end)}
        if rate is not None:
            body["rate"] = rate
        return Call("POST", f"/v1/jobs/{_seg(job_id)}/backfill", json=body)

    @staticmethod
    def jobs_preview(job_id: Id, count: int | None) -> Call:
        return Call("GET", f"/v1/jobs/{_seg(job_id)}/preview", params=query_params(count=count))

    @staticmethod
    def runs_get(run_id: Id) -> Call:
        return Call("GET", f"/v1/runs/{_seg(run_id)}")

    @staticmethod
    def runs_list(
        job_id: Id | None,
        state: str | Sequence[str] | None,
        since: datetime | None,
        until: datetime | None,
        tag: str | Sequence[str] | None,
        cursor: str | None,
        limit: int | None,
        pool: str | None = None,
    ) -> Call:
        params = query_params(
            job_id=job_id,
            state=state,
            since=since,
            until=until,
            pool=pool,
            cursor=cursor,
            limit=limit,
        )
        if tag is not None:
            # Repeated: each tag must be among the run's (a tag may hold a comma).
            params["tag"] = [tag] if isinstance(tag, str) else [str(t) for t in tag]
        return Call("GET", "/v1/runs", params=params)

    @staticmethod
    def runs_events(run_id: Id, cursor: str | None, limit: int | None) -> Call:
        params = query_params(cursor=cursor, limit=limit)
        return Call("GET", f"/v1/runs/{_seg(run_id)}/events", params=params)

    @staticmethod
    def runs_cancel(run_id: Id, reason: str | None) -> Call:
        return Calls.runs_control(run_id, "cancel", reason)

    @staticmethod
    def runs_control(run_id: Id, action: str, reason: str | None) -> Call:
        body = {} if reason is None else {"reason": reason}
        return Call("POST", f"/v1/runs/{_seg(run_id)}/{action}", json=body)

    @staticmethod
    def dead_letters(job_id: Id | None, cursor: str | None, limit: int | None) -> Call:
        params = query_params(job_id=job_id, cursor=cursor, limit=limit)
        return Call("GET", "/v1/dead-letters", params=params)

    @staticmethod
    def dead_letters_redrive(
        run_ids: Sequence[Id] | None,
        job_id: Id | None,
        all: bool,
        reason: str | None,
        limit: int | None,
    ) -> Call:
        body: Json = {}
        if run_ids is not None:
            body["run_ids"] = [str(r) for r in run_ids]
        if job_id is not None:
            body["job_id"] = str(job_id)
        if all:
            body["all"] = True
        if reason is not None:
            body["reason"] = reason
        if limit is not None:
            body["limit"] = limit
        return Call("POST", "/v1/dead-letters/redrive", json=body)

    @staticmethod
    def runs_logs(run_id: Id, attempt: int | None, cursor: str | None, limit: int | None) -> Call:
        params = query_params(attempt=attempt, cursor=cursor, limit=limit)
        return Call("GET", f"/v1/runs/{_seg(run_id)}/logs", params=params)

    @staticmethod
    def bulk(
        action: str, selector: Mapping[str, Any], everything: bool, reason: str | None
    ) -> Call:
        body: dict[str, Any] = {"selector": _body(dict(selector))}
        if everything:
            body["all"] = True
        if reason is not None:
            body["reason"] = reason
        return Call("POST", f"/v1/bulk/{_seg(action)}", json=body)

    @staticmethod
    def overrides_create(
        job_id: Id | None, run_id: Id | None, scope: str | None, values: Mapping[str, Any]
    ) -> Call:
        # A payload's nulls are the merge-patch's "remove this key": sent as they are.
        body: Json = {k: to_jsonable_python(v) for k, v in values.items() if v is not None}
        if scope is not None:
            body["scope"] = scope
        return Call("POST", f"{_overrides_of(job_id, run_id)}", json=body)

    @staticmethod
    def overrides_list(job_id: Id | None, run_id: Id | None, ended: bool) -> Call:
        params = query_params(ended="true") if ended else {}
        return Call("GET", _overrides_of(job_id, run_id), params=params)

    @staticmethod
    def overrides_remove(
        override_id: Id | None, job_id: Id | None, run_id: Id | None, reason: str | None
    ) -> Call:
        path = _overrides_of(job_id, run_id)
        if override_id is not None:
            path += f"/{_seg(override_id)}"
        return Call("DELETE", path, params=query_params(reason=reason))

    @staticmethod
    def operations_get(operation_id: Id) -> Call:
        return Call("GET", f"/v1/operations/{_seg(operation_id)}")

    @staticmethod
    def operations_list(cursor: str | None, limit: int | None) -> Call:
        return Call("GET", "/v1/operations", params=query_params(cursor=cursor, limit=limit))

    @staticmethod
    def audit_list(
        actor: str | None,
        action: str | None,
        target_kind: str | None,
        target: Id | None,
        since: datetime | None,
        until: datetime | None,
        cursor: str | None,
        limit: int | None,
    ) -> Call:
        params = query_params(
            actor=actor,
            action=action,
            target_kind=target_kind,
            target=target,
            since=since,
            until=until,
            cursor=cursor,
            limit=limit,
        )
        return Call("GET", "/v1/audit", params=params)

    @staticmethod
    def alerts_list() -> Call:
        return Call("GET", "/v1/alerts")

    @staticmethod
    def overview(minutes: int | None) -> Call:
        return Call("GET", "/v1/overview", params=query_params(minutes=minutes))

    @staticmethod
    def workers_list(pool: str | None, cursor: str | None, limit: int | None) -> Call:
        params = query_params(pool=pool, cursor=cursor, limit=limit)
        return Call("GET", "/v1/workers", params=params)

    @staticmethod
    def pools_list() -> Call:
        return Call("GET", "/v1/pools")

    @staticmethod
    def pools_get(name: str) -> Call:
        return Call("GET", f"/v1/pools/{_seg(name)}")

    @staticmethod
    def pools_update(name: str, p0_reserved_share: float | None) -> Call:
        # null is a value here (back to the default): sent as it is.
        return Call("PUT", f"/v1/pools/{_seg(name)}", json={"p0_reserved_share": p0_reserved_share})

    @staticmethod
    def workflows_create(
        spec: Workflow | Mapping[str, Any], idempotency_key: str | None = None
    ) -> Call:
        body = _body(spec.to_spec() if isinstance(spec, Workflow) else dict(spec))
        headers = {} if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        return Call("POST", "/v1/workflows", json=body, headers=headers)

    @staticmethod
    def workflows_get(workflow_id: Id) -> Call:
        return Call("GET", f"/v1/workflows/{_seg(workflow_id)}")

    @staticmethod
    def workflows_list(
        state: str | None,
        tag: str | None,
        name_prefix: str | None,
        cursor: str | None,
        limit: int | None,
    ) -> Call:
        return _definitions("/v1/workflows", state, tag, name_prefix, cursor, limit)

    @staticmethod
    def workflows_control(workflow_id: Id, action: str, reason: str | None) -> Call:
        return Call("POST", f"/v1/workflows/{_seg(workflow_id)}/{action}", json=_reason(reason))

    @staticmethod
    def workflows_trigger(workflow_id: Id, payload: Mapping[str, Any] | None) -> Call:
        body = {} if payload is None else {"payload": _body(payload)}
        return Call("POST", f"/v1/workflows/{_seg(workflow_id)}/trigger", json=body)

    @staticmethod
    def workflows_delete(workflow_id: Id, force: bool, reason: str | None) -> Call:
        params = query_params(force="true" if force else None, reason=reason)
        return Call("DELETE", f"/v1/workflows/{_seg(workflow_id)}", params=params)

    @staticmethod
    def workflows_runs(
        workflow_id: Id,
        state: str | Sequence[str] | None,
        cursor: str | None,
        limit: int | None,
    ) -> Call:
        params = query_params(state=state, cursor=cursor, limit=limit)
        return Call("GET", f"/v1/workflows/{_seg(workflow_id)}/runs", params=params)

    @staticmethod
    def workflow_runs_get(run_id: Id) -> Call:
        return Call("GET", f"/v1/workflow-runs/{_seg(run_id)}")

    @staticmethod
    def workflow_runs_cancel(run_id: Id, reason: str | None) -> Call:
        return Call("POST", f"/v1/workflow-runs/{_seg(run_id)}/cancel", json=_reason(reason))

    @staticmethod
    def workflow_runs_retry_node(run_id: Id, node: str, reason: str | None) -> Call:
        # A name no node can have would make another path ('..', '', 'a/b'): refused
        # here, naming it, rather than sent to an endpoint that does not exist.
        problem = node_name_problem(node)
        if problem is not None:
            raise ValueError(f"no node is named {problem}")
        path = f"/v1/workflow-runs/{_seg(run_id)}/nodes/{_seg(node)}/retry"
        return Call("POST", path, json=_reason(reason))
