"""The asyncio client: :class:`AsyncClient` and its resources, the twins of
:mod:`cronwheel.client.sync`'s."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self, cast

import httpx

from cronwheel.client.base import (
    DEFAULT_TIMEOUT,
    BaseClient,
    read_items,
    read_lines,
    read_page,
)
from cronwheel.client.batches import CHUNK_MAX, CreatedMany, CreateMany
from cronwheel.client.builder import Workflow
from cronwheel.client.calls import Call, Calls, Id, Json, query_params
from cronwheel.client.errors import ApiError
from cronwheel.domain.model import Page
from cronwheel.domain.spec import TenantLimits

__all__ = [
    "AsyncAlerts",
    "AsyncAudit",
    "AsyncBulk",
    "AsyncClient",
    "AsyncJobs",
    "AsyncOperations",
    "AsyncOverrides",
    "AsyncPools",
    "AsyncRuns",
    "AsyncTenants",
    "AsyncWorkers",
    "AsyncWorkflows",
]

_Items = list[Json]  # inside the resources, ``list`` is their method


class AsyncClient(BaseClient):
    """The asyncio twin of :class:`Client`: the same resources, awaited."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        tenant: Id | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(url, api_key=api_key, timeout=timeout, tenant=tenant)
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=self._default_headers(),
            timeout=timeout,
            transport=transport,
        )
        self._owns_http = True
        self._add_resources()

    def with_tenant(self, tenant: Id | None) -> AsyncClient:
        other = object.__new__(AsyncClient)
        other.__dict__.update(self.__dict__)
        other.tenant = None if tenant is None else str(tenant)
        other._owns_http = False
        other._add_resources()
        return other

    def _add_resources(self) -> None:
        """The resources, each bound to this client (or view)."""
        self.tenants = AsyncTenants(self)
        self.jobs = AsyncJobs(self)
        self.runs = AsyncRuns(self)
        self.alerts = AsyncAlerts(self)
        self.workers = AsyncWorkers(self)
        self.pools = AsyncPools(self)
        self.audit = AsyncAudit(self)
        self.bulk = AsyncBulk(self)
        self.operations = AsyncOperations(self)
        self.overrides = AsyncOverrides(self)
        self.workflows = AsyncWorkflows(self)

    async def send(self, call: Call, *, read_timeout: float | None = None) -> Any:
        """Send ``call``; ``read_timeout`` overrides the client's (long polls need more)."""
        try:
            response = await self._http.request(
                call.method,
                call.path,
                params=call.params or None,
                json=call.json,
                headers=self._headers_for(call),
                timeout=self.timeout if read_timeout is None else read_timeout,
            )
        except httpx.TransportError as exc:
            raise self._transport_error(exc, call) from exc
        return self._parse(response)

    async def overview(self, *, minutes: int | None = None) -> Json:
        return cast(Json, await self.send(Calls.overview(minutes)))

    async def get(self, path: str, **params: Any) -> Any:
        return await self.send(Call("GET", path, params=query_params(**params)))

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class _AsyncResource:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def _one(self, call: Call) -> Json:
        return cast(Json, await self._client.send(call))

    async def _page(self, call: Call) -> Page[Json]:
        return read_page(await self._client.send(call))


class AsyncTenants(_AsyncResource):
    async def create(
        self, name: str, *, limits: Mapping[str, Any] | TenantLimits | None = None
    ) -> Json:
        return await self._one(Calls.tenants_create(name, limits))

    async def get(self, tenant_id: Id) -> Json:
        return await self._one(Calls.tenants_get(tenant_id))

    async def list(self, *, cursor: str | None = None, limit: int | None = None) -> Page[Json]:
        return await self._page(Calls.tenants_list(cursor, limit))

    async def update(self, tenant_id: Id, *, limits: Mapping[str, Any] | TenantLimits) -> Json:
        """Change the tenant's limits (admin key): only those named change (a
        :class:`TenantLimits`: the fields set), None clears one. A bad value is 422
        and changes nothing. Every field is in docs/limits.md."""
        return await self._one(Calls.tenants_update(tenant_id, limits))

    async def create_key(self, tenant_id: Id, *, role: str = "operator") -> Json:
        return await self._one(Calls.tenants_create_key(tenant_id, role))

    async def list_keys(
        self, tenant_id: Id, *, cursor: str | None = None, limit: int | None = None
    ) -> Page[Json]:
        return await self._page(Calls.tenants_list_keys(tenant_id, cursor, limit))

    async def revoke_key(self, tenant_id: Id, key_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(Calls.tenants_revoke_key(tenant_id, key_id, reason))

    async def delete(
        self, tenant_id: Id, *, force: bool = False, reason: str | None = None
    ) -> Json:
        """Delete the tenant with its keys, workers, jobs and their history (admin
        key). Refused (409 ``in_use``) while it has jobs not over or runs in progress,
        unless ``force``. Answers what was deleted."""
        return await self._one(Calls.tenants_delete(tenant_id, force, reason))


class AsyncJobs(_AsyncResource):
    async def create(
        self,
        *,
        name: str,
        schedule: Any,
        task: str | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> Json:
        return await self._one(Calls.jobs_create(name, schedule, task, idempotency_key, fields))

    async def create_many(
        self, jobs: Iterable[Mapping[str, Any]], *, chunk_size: int = CHUNK_MAX
    ) -> CreatedMany:
        """Create many jobs (each a mapping of the fields ``create`` takes, ``name`` and
        ``schedule`` among them), ``chunk_size`` (at most 1,000) per request, each chunk
        in one transaction. Never raises for a job's error: the answer says, job by job
        in the order given, what was created and what failed and why (see
        :class:`~cronwheel.client.batches.CreatedMany`; ``raise_for_errors()`` raises
        the first). A chunk the API refuses naming some of its jobs is sent again
        without them."""
        plan = CreateMany(jobs, chunk_size=chunk_size)
        while (call := plan.next_call()) is not None:
            try:
                plan.answered(await self._client.send(call))
            except ApiError as exc:
                plan.failed(exc)
        return plan.result

    async def get(self, job_id: Id) -> Json:
        return await self._one(Calls.jobs_get(job_id))

    async def list(
        self,
        *,
        state: str | None = None,
        tag: str | None = None,
        name_prefix: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Json]:
        return await self._page(Calls.jobs_list(state, tag, name_prefix, cursor, limit))

    async def iter(
        self,
        *,
        state: str | None = None,
        tag: str | None = None,
        name_prefix: str | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[Json]:
        cursor: str | None = None
        while True:
            page = await self.list(
                state=state, tag=tag, name_prefix=name_prefix, cursor=cursor, limit=page_size
            )
            for item in page.items:
                yield item
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def update(
        self,
        job_id: Id,
        *,
        if_version: int | None = None,
        reason: str | None = None,
        **fields: Any,
    ) -> Json:
        """Edit the job: each of ``fields`` (any field ``create`` takes: ``schedule``,
        ``payload``, ``pool``, ``priority``, …) replaces the job's whole; None sets one
        back to its default. With ``if_version`` (the job's ``version``), only while the
        job is still that version, else :class:`PreconditionFailedError` (412; its
        ``current_version``) and nothing changes. The job's pending run follows at once
        (docs/editing-jobs.md); answers the job."""
        return await self._one(Calls.jobs_update(job_id, fields, if_version, reason))

    async def cancel(self, job_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(Calls.jobs_cancel(job_id, reason))

    async def delete(self, job_id: Id, *, force: bool = False, reason: str | None = None) -> Json:
        """Delete the job with its runs and their history. Refused (409 ``in_use``)
        while a run of it is in progress, unless ``force`` (which ends them). Answers
        what was deleted."""
        return await self._one(Calls.jobs_delete(job_id, force, reason))

    async def pause(self, job_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(Calls.jobs_control(job_id, "pause", reason))

    async def resume(self, job_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(Calls.jobs_control(job_id, "resume", reason))

    async def trigger(self, job_id: Id, *, payload: Mapping[str, Any] | None = None) -> Json:
        return await self._one(Calls.jobs_trigger(job_id, payload))

    async def backfill(
        self, job_id: Id, *, start: datetime, end: datetime, rate: float | None = None
    ) -> Json:
        return await self._one(Calls.jobs_backfill(job_id, start, end, rate))

    async def preview(self, job_id: Id, *, count: int | None = None) -> _Items:
        return read_items(await self._one(Calls.jobs_preview(job_id, count)))


class AsyncWorkflows(_AsyncResource):
    async def create(
        self, spec: Workflow | Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> Json:
        return await self._one(Calls.workflows_create(spec, idempotency_key))

    async def get(self, workflow_id: Id) -> Json:
        return await self._one(Calls.workflows_get(workflow_id))

    async def list(
        self,
        *,
        state: str | None = None,
        tag: str | None = None,
        name_prefix: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Json]:
        return await self._page(Calls.workflows_list(state, tag, name_prefix, cursor, limit))

    async def pause(self, workflow_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(Calls.workflows_control(workflow_id, "pause", reason))

    async def resume(self, workflow_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(Calls.workflows_control(workflow_id, "resume", reason))

    async def cancel(self, workflow_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(Calls.workflows_control(workflow_id, "cancel", reason))

    async def trigger(self, workflow_id: Id, *, payload: Mapping[str, Any] | None = None) -> Json:
        return await self._one(Calls.workflows_trigger(workflow_id, payload))

    async def delete(
        self, workflow_id: Id, *, force: bool = False, reason: str | None = None
    ) -> Json:
        return await self._one(Calls.workflows_delete(workflow_id, force, reason))

    async def runs(
        self,
        workflow_id: Id,
        *,
        state: str | Sequence[str] | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Json]:
        return await self._page(Calls.workflows_runs(workflow_id, state, cursor, limit))

    async def run(self, run_id: Id) -> Json:
        return await self._one(Calls.workflow_runs_get(run_id))

    async def cancel_run(self, run_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(Calls.workflow_runs_cancel(run_id, reason))

    async def retry_node(self, run_id: Id, node: str, *, reason: str | None = None) -> Json:
        return await self._one(Calls.workflow_runs_retry_node(run_id, node, reason))


class AsyncRuns(_AsyncResource):
    async def get(self, run_id: Id) -> Json:
        return await self._one(Calls.runs_get(run_id))

    async def list(
        self,
        *,
        job_id: Id | None = None,
        state: str | Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tag: str | Sequence[str] | None = None,
        pool: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Json]:
        """One page of runs, newest first by due instant (then id): of the job, in
        any of the states, due in [since, until), carrying every tag, of the pool.
        Pass the page's ``next_cursor`` as ``cursor`` for the next (docs/history.md)."""
        return await self._page(
            Calls.runs_list(job_id, state, since, until, tag, cursor, limit, pool=pool)
        )

    async def iter(
        self,
        *,
        job_id: Id | None = None,
        state: str | Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tag: str | Sequence[str] | None = None,
        pool: str | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[Json]:
        """Every run :meth:`list` selects, page after page."""
        cursor: str | None = None
        while True:
            page = await self.list(
                job_id=job_id,
                state=state,
                since=since,
                until=until,
                tag=tag,
                pool=pool,
                cursor=cursor,
                limit=page_size,
            )
            for item in page.items:
                yield item
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def events(
        self, run_id: Id, *, cursor: str | None = None, limit: int | None = None
    ) -> Page[Json]:
        """One page of the run's event timeline, oldest first."""
        return await self._page(Calls.runs_events(run_id, cursor, limit))

    async def iter_events(self, run_id: Id, *, page_size: int | None = None) -> AsyncIterator[Json]:
        """Every event of the run so far, oldest first."""
        cursor: str | None = None
        while True:
            page = await self.events(run_id, cursor=cursor, limit=page_size)
            for item in page.items:
                yield item
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def cancel(self, run_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(Calls.runs_cancel(run_id, reason))

    async def redrive(self, run_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(Calls.runs_control(run_id, "redrive", reason))

    async def retry(self, run_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(Calls.runs_control(run_id, "retry", reason))

    async def dead_letters(
        self, *, job_id: Id | None = None, cursor: str | None = None, limit: int | None = None
    ) -> Page[Json]:
        return await self._page(Calls.dead_letters(job_id, cursor, limit))

    async def redrive_many(
        self,
        run_ids: Sequence[Id] | None = None,
        *,
        job_id: Id | None = None,
        all: bool = False,
        reason: str | None = None,
        limit: int | None = None,
    ) -> Json:
        return await self._one(Calls.dead_letters_redrive(run_ids, job_id, all, reason, limit))

    async def logs_page(
        self,
        run_id: Id,
        *,
        attempt: int | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Json:
        return await self._one(Calls.runs_logs(run_id, attempt, cursor, limit))

    async def logs(
        self, run_id: Id, *, attempt: int | None = None, page_size: int | None = None
    ) -> AsyncIterator[Json]:
        cursor: str | None = None
        while True:
            page = await self.logs_page(run_id, attempt=attempt, cursor=cursor, limit=page_size)
            for line in read_lines(page):
                yield line
            cursor = page.get("next_cursor")
            if not cursor:
                return


class AsyncBulk(_AsyncResource):
    async def __call__(
        self,
        action: str,
        *,
        everything: bool = False,
        reason: str | None = None,
        **selector: Any,
    ) -> Json:
        return await self._one(Calls.bulk(action, selector, everything, reason))


class AsyncOverrides(_AsyncResource):
    async def create(
        self,
        *,
        job_id: Id | None = None,
        run_id: Id | None = None,
        scope: str | None = None,
        payload: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        priority: int | None = None,
        pool: str | None = None,
        reason: str | None = None,
    ) -> Json:
        values = {"payload": payload, "timeout": timeout, "priority": priority,
                  "pool": pool, "reason": reason}  # fmt: skip
        return await self._one(Calls.overrides_create(job_id, run_id, scope, values))

    async def list(
        self, *, job_id: Id | None = None, run_id: Id | None = None, ended: bool = False
    ) -> _Items:
        return read_items(await self._one(Calls.overrides_list(job_id, run_id, ended)))

    async def remove(
        self,
        override_id: Id,
        *,
        job_id: Id | None = None,
        run_id: Id | None = None,
        reason: str | None = None,
    ) -> Json:
        return await self._one(Calls.overrides_remove(override_id, job_id, run_id, reason))

    async def remove_all(self, job_id: Id, *, reason: str | None = None) -> _Items:
        return read_items(await self._one(Calls.overrides_remove(None, job_id, None, reason)))


class AsyncOperations(_AsyncResource):
    async def get(self, operation_id: Id) -> Json:
        return await self._one(Calls.operations_get(operation_id))

    async def list(self, *, cursor: str | None = None, limit: int | None = None) -> Page[Json]:
        return await self._page(Calls.operations_list(cursor, limit))

    async def wait(
        self,
        operation_id: Id,
        *,
        timeout: float = 300.0,
        interval: float = 0.25,
        progress: Callable[[Json], None] | None = None,
    ) -> Json:
        """The operation once it is done or failed (``progress`` sees it after each
        look); ``TimeoutError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            op = await self.get(operation_id)
            if progress is not None:
                progress(op)
            if op.get("state") in ("done", "failed"):
                return op
            if time.monotonic() >= deadline:
                raise TimeoutError(f"operation {operation_id} still {op.get('state')}")
            await asyncio.sleep(interval)


class AsyncAudit(_AsyncResource):
    async def list(
        self,
        *,
        actor: str | None = None,
        action: str | None = None,
        target_kind: str | None = None,
        target: Id | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Json]:
        return await self._page(
            Calls.audit_list(actor, action, target_kind, target, since, until, cursor, limit)
        )

    async def iter(
        self,
        *,
        actor: str | None = None,
        action: str | None = None,
        target_kind: str | None = None,
        target: Id | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[Json]:
        cursor: str | None = None
        while True:
            page = await self._page(
                Calls.audit_list(
                    actor, action, target_kind, target, since, until, cursor, page_size
                )
            )
            for item in page.items:
                yield item
            if not page.next_cursor:
                return
            cursor = page.next_cursor


class AsyncAlerts(_AsyncResource):
    async def list(self) -> _Items:
        return read_items(await self._client.send(Calls.alerts_list()))


class AsyncWorkers(_AsyncResource):
    async def list(
        self, *, pool: str | None = None, cursor: str | None = None, limit: int | None = None
    ) -> Page[Json]:
        return await self._page(Calls.workers_list(pool, cursor, limit))


class AsyncPools(_AsyncResource):
    async def list(self) -> _Items:
        return read_items(await self._client.send(Calls.pools_list()))

    async def get(self, name: str) -> Json:
        return await self._one(Calls.pools_get(name))

    async def update(self, name: str, *, p0_reserved_share: float | None) -> Json:
        return await self._one(Calls.pools_update(name, p0_reserved_share))
