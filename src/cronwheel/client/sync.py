"""The blocking client: :class:`Client` and its resources."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
    "Alerts",
    "Audit",
    "Bulk",
    "Client",
    "Jobs",
    "Operations",
    "Overrides",
    "Pools",
    "Runs",
    "Tenants",
    "Workers",
    "Workflows",
]

_Items = list[Json]  # inside the resources, ``list`` is their method


class Client(BaseClient):
    """A blocking client. ``tenant`` names the tenant an admin key acts for (the
    ``Cronwheel-Tenant`` header); tenant keys need no such thing."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        tenant: Id | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(url, api_key=api_key, timeout=timeout, tenant=tenant)
        self._http = httpx.Client(
            base_url=self.url,
            headers=self._default_headers(),
            timeout=timeout,
            transport=transport,
        )
        self._owns_http = True
        self._add_resources()

    def with_tenant(self, tenant: Id | None) -> Client:
        """A view of this client acting for ``tenant``, sharing its connections."""
        other = object.__new__(Client)
        other.__dict__.update(self.__dict__)
        other.tenant = None if tenant is None else str(tenant)
        other._owns_http = False
        other._add_resources()
        return other

    def _add_resources(self) -> None:
        """The resources, each bound to this client (or view)."""
        self.tenants = Tenants(self)
        self.jobs = Jobs(self)
        self.runs = Runs(self)
        self.alerts = Alerts(self)
        self.workers = Workers(self)
        self.pools = Pools(self)
        self.audit = Audit(self)
        self.bulk = Bulk(self)
        self.operations = Operations(self)
        self.overrides = Overrides(self)
        self.workflows = Workflows(self)

    def send(self, call: Call) -> Any:
        try:
            response = self._http.request(
                call.method,
                call.path,
                params=call.params or None,
                json=call.json,
                headers=self._headers_for(call),
            )
        except httpx.TransportError as exc:
            raise self._transport_error(exc, call) from exc
        return self._parse(response)

    def overview(self, *, minutes: int | None = None) -> Json:
        """What a dashboard's first page shows: the runs due in each of the last
        ``minutes`` minutes (server default 60, at most 1440) by state now, with their
        dispatch and start lateness p50/p99; the same over the window with its success
        rate; the active alerts; the pools with their workers, free slots and waiting
        runs. The tenant's, or with the admin key every tenant's (one tenant's when the
        client names it)."""
        return cast(Json, self.send(Calls.overview(minutes)))

    def get(self, path: str, **params: Any) -> Any:
        """A GET of any API path (for what the resources do not cover yet)."""
        return self.send(Call("GET", path, params=query_params(**params)))

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Resource:
    def __init__(self, client: Client) -> None:
        self._client = client

    def _one(self, call: Call) -> Json:
        return cast(Json, self._client.send(call))

    def _page(self, call: Call) -> Page[Json]:
        return read_page(self._client.send(call))


class Tenants(_Resource):
    def create(self, name: str, *, limits: Mapping[str, Any] | TenantLimits | None = None) -> Json:
        """A new tenant; the answer holds its first operator ``api_key`` (shown once)."""
        return self._one(Calls.tenants_create(name, limits))

    def get(self, tenant_id: Id) -> Json:
        return self._one(Calls.tenants_get(tenant_id))

    def list(self, *, cursor: str | None = None, limit: int | None = None) -> Page[Json]:
        return self._page(Calls.tenants_list(cursor, limit))

    def update(self, tenant_id: Id, *, limits: Mapping[str, Any] | TenantLimits) -> Json:
        """Change the tenant's limits (admin key): only those named change (a
        :class:`TenantLimits`: the fields set), None clears one. A bad value is 422
        and changes nothing. Every field is in docs/limits.md."""
        return self._one(Calls.tenants_update(tenant_id, limits))

    def create_key(self, tenant_id: Id, *, role: str = "operator") -> Json:
        return self._one(Calls.tenants_create_key(tenant_id, role))

    def list_keys(
        self, tenant_id: Id, *, cursor: str | None = None, limit: int | None = None
    ) -> Page[Json]:
        """The tenant's keys (id, role, prefix, created_at, revoked_at; never a key)."""
        return self._page(Calls.tenants_list_keys(tenant_id, cursor, limit))

    def revoke_key(self, tenant_id: Id, key_id: Id, *, reason: str | None = None) -> Json:
        """Revoke a key at once, on every API node; the answer is its record."""
        return self._one(Calls.tenants_revoke_key(tenant_id, key_id, reason))

    def delete(self, tenant_id: Id, *, force: bool = False, reason: str | None = None) -> Json:
        """Delete the tenant with its keys, workers, jobs and their history (admin
        key). Refused (409 ``in_use``) while it has jobs not over or runs in progress,
        unless ``force``. Answers what was deleted."""
        return self._one(Calls.tenants_delete(tenant_id, force, reason))


class Jobs(_Resource):
    def create(
        self,
        *,
        name: str,
        schedule: Any,
        task: str | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> Json:
        """Create a job. ``fields`` are the other fields of a job (payload, pool,
        requires, tags, priority, retry, timeout, heartbeat_timeout, progress_timeout,
        spread, lateness_budget, webhook)."""
        return self._one(Calls.jobs_create(name, schedule, task, idempotency_key, fields))

    def create_many(
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
                plan.answered(self._client.send(call))
            except ApiError as exc:
                plan.failed(exc)
        return plan.result

    def get(self, job_id: Id) -> Json:
        return self._one(Calls.jobs_get(job_id))

    def list(
        self,
        *,
        state: str | None = None,
        tag: str | None = None,
        name_prefix: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Json]:
        return self._page(Calls.jobs_list(state, tag, name_prefix, cursor, limit))

    def iter(
        self,
        *,
        state: str | None = None,
        tag: str | None = None,
        name_prefix: str | None = None,
        page_size: int | None = None,
    ) -> Iterator[Json]:
        """Every matching job, newest first, fetching pages as it goes."""
        cursor: str | None = None
        while True:
            page = self.list(
                state=state, tag=tag, name_prefix=name_prefix, cursor=cursor, limit=page_size
            )
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def update(
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
        return self._one(Calls.jobs_update(job_id, fields, if_version, reason))

    def cancel(self, job_id: Id, *, reason: str | None = None) -> Json:
        return self._one(Calls.jobs_cancel(job_id, reason))

    def delete(self, job_id: Id, *, force: bool = False, reason: str | None = None) -> Json:
        """Delete the job with its runs and their history. Refused (409 ``in_use``)
        while a run of it is in progress, unless ``force`` (which ends them). Answers
        what was deleted."""
        return self._one(Calls.jobs_delete(job_id, force, reason))

    def pause(self, job_id: Id, *, reason: str | None = None) -> Json:
        """Hold an active job's runs until :meth:`resume`; answers the job."""
        return self._one(Calls.jobs_control(job_id, "pause", reason))

    def resume(self, job_id: Id, *, reason: str | None = None) -> Json:
        """Release a paused job's runs (missed ones are due at once); answers the job."""
        return self._one(Calls.jobs_control(job_id, "resume", reason))

    def trigger(self, job_id: Id, *, payload: Mapping[str, Any] | None = None) -> Json:
        """A run now, outside the schedule, ``payload`` merged over the job's; answers
        the run."""
        return self._one(Calls.jobs_trigger(job_id, payload))

    def backfill(
        self, job_id: Id, *, start: datetime, end: datetime, rate: float | None = None
    ) -> Json:
        """Runs for the occurrences in the past range ``[start, end)`` (idempotent),
        released ``rate`` per second; answers ``{"created": N, "runs": [ids]}``."""
        return self._one(Calls.jobs_backfill(job_id, start, end, rate))

    def preview(self, job_id: Id, *, count: int | None = None) -> _Items:
        """The job's next ``count`` (default 10) due instants: ``due_at`` (UTC),
        ``fire_at`` (its spread instant: when its run fires), ``due_local`` (with its
        offset), ``kind`` and ``reason``."""
        return read_items(self._one(Calls.jobs_preview(job_id, count)))


class Workflows(_Resource):
    """Workflows: DAGs of nodes, each node a task (or a webhook) run when its trigger
    rule holds over its upstream nodes, scheduled like a job. Each firing is a
    *workflow run* with one *node run* per node."""

    def create(
        self, spec: Workflow | Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> Json:
        """A new workflow from a :class:`Workflow` or the body of ``POST
        /v1/workflows`` (``name``, ``schedule``, ``nodes``, …); a cycle, an unknown
        upstream node or a bad field is 422 and creates nothing. With
        ``idempotency_key``, a retry answers the workflow the first call created."""
        return self._one(Calls.workflows_create(spec, idempotency_key))

    def get(self, workflow_id: Id) -> Json:
        return self._one(Calls.workflows_get(workflow_id))

    def list(
        self,
        *,
        state: str | None = None,
        tag: str | None = None,
        name_prefix: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Json]:
        """One page of workflows, newest first."""
        return self._page(Calls.workflows_list(state, tag, name_prefix, cursor, limit))

    def pause(self, workflow_id: Id, *, reason: str | None = None) -> Json:
        return self._one(Calls.workflows_control(workflow_id, "pause", reason))

    def resume(self, workflow_id: Id, *, reason: str | None = None) -> Json:
        return self._one(Calls.workflows_control(workflow_id, "resume", reason))

    def cancel(self, workflow_id: Id, *, reason: str | None = None) -> Json:
        return self._one(Calls.workflows_control(workflow_id, "cancel", reason))

    def trigger(self, workflow_id: Id, *, payload: Mapping[str, Any] | None = None) -> Json:
        """A workflow run now, ``payload`` merged over each node's; answers the run."""
        return self._one(Calls.workflows_trigger(workflow_id, payload))

    def delete(self, workflow_id: Id, *, force: bool = False, reason: str | None = None) -> Json:
        """Delete the workflow with its runs and their history, as :meth:`Jobs.delete`
        deletes a job (409 ``in_use`` while one of its runs goes, unless ``force``).
        Answers what was deleted."""
        return self._one(Calls.workflows_delete(workflow_id, force, reason))

    def runs(
        self,
        workflow_id: Id,
        *,
        state: str | Sequence[str] | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Json]:
        """One page of the workflow's runs in any of the states, newest first, their
        nodes counted by state (``counts``) but not given."""
        return self._page(Calls.workflows_runs(workflow_id, state, cursor, limit))

    def run(self, run_id: Id) -> Json:
        """A workflow run with its ``nodes``: each node run's state, attempt, reason,
        result and last error, in the workflow's order."""
        return self._one(Calls.workflow_runs_get(run_id))

    def cancel_run(self, run_id: Id, *, reason: str | None = None) -> Json:
        """Cancel a workflow run: its waiting nodes are cancelled, running ones asked
        to stop."""
        return self._one(Calls.workflow_runs_cancel(run_id, reason))

    def retry_node(self, run_id: Id, node: str, *, reason: str | None = None) -> Json:
        """Run a failed, dead-lettered or cancelled node again, and the nodes it had
        skipped or cancelled downstream after it; the workflow run goes on from there.
        409 when the node is in no such state."""
        return self._one(Calls.workflow_runs_retry_node(run_id, node, reason))


class Runs(_Resource):
    def get(self, run_id: Id) -> Json:
        """One run with its ``attempts`` and ``events``."""
        return self._one(Calls.runs_get(run_id))

    def list(
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
        return self._page(
            Calls.runs_list(job_id, state, since, until, tag, cursor, limit, pool=pool)
        )

    def iter(
        self,
        *,
        job_id: Id | None = None,
        state: str | Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tag: str | Sequence[str] | None = None,
        pool: str | None = None,
        page_size: int | None = None,
    ) -> Iterator[Json]:
        """Every run :meth:`list` selects, page after page."""
        cursor: str | None = None
        while True:
            page = self.list(
                job_id=job_id,
                state=state,
                since=since,
                until=until,
                tag=tag,
                pool=pool,
                cursor=cursor,
                limit=page_size,
            )
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def events(
        self, run_id: Id, *, cursor: str | None = None, limit: int | None = None
    ) -> Page[Json]:
        """One page of the run's event timeline, oldest first."""
        return self._page(Calls.runs_events(run_id, cursor, limit))

    def iter_events(self, run_id: Id, *, page_size: int | None = None) -> Iterator[Json]:
        """Every event of the run so far, oldest first."""
        cursor: str | None = None
        while True:
            page = self.events(run_id, cursor=cursor, limit=page_size)
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def cancel(self, run_id: Id, *, reason: str | None = None) -> Json:
        return self._one(Calls.runs_cancel(run_id, reason))

    def redrive(self, run_id: Id, *, reason: str | None = None) -> Json:
        """Send a dead-lettered run back for a new series of attempts."""
        return self._one(Calls.runs_control(run_id, "redrive", reason))

    def retry(self, run_id: Id, *, reason: str | None = None) -> Json:
        """Run a failed, cancelled or dead-lettered run again."""
        return self._one(Calls.runs_control(run_id, "retry", reason))

    def dead_letters(
        self, *, job_id: Id | None = None, cursor: str | None = None, limit: int | None = None
    ) -> Page[Json]:
        return self._page(Calls.dead_letters(job_id, cursor, limit))

    def redrive_many(
        self,
        run_ids: Sequence[Id] | None = None,
        *,
        job_id: Id | None = None,
        all: bool = False,
        reason: str | None = None,
        limit: int | None = None,
    ) -> Json:
        """Send dead letters back in one batch, chosen by exactly one of ``run_ids``,
        ``job_id`` or ``all=True``, at most ``limit`` (default and most 1,000), oldest
        first. Answers ``redriven``, ``run_ids``, ``skipped`` (named runs that are not
        dead letters, each with a ``reason``) and ``more`` (others remain past the limit)."""
        return self._one(Calls.dead_letters_redrive(run_ids, job_id, all, reason, limit))

    def logs_page(
        self,
        run_id: Id,
        *,
        attempt: int | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Json:
        """One page of the run's log lines (``lines``, ``next_cursor``, ``end_cursor``,
        ``run_state``): to follow a live run, ask again from ``end_cursor`` until
        ``run_state`` is final."""
        return self._one(Calls.runs_logs(run_id, attempt, cursor, limit))

    def logs(
        self, run_id: Id, *, attempt: int | None = None, page_size: int | None = None
    ) -> Iterator[Json]:
        """Every log line of the run (or of one ``attempt``), oldest first, fetching
        pages as it goes. Each line has ``ts``, ``attempt``, ``level`` and ``message``."""
        cursor: str | None = None
        while True:
            page = self.logs_page(run_id, attempt=attempt, cursor=cursor, limit=page_size)
            yield from read_lines(page)
            cursor = page.get("next_cursor")
            if not cursor:
                return


class Bulk(_Resource):
    def __call__(
        self,
        action: str,
        *,
        everything: bool = False,
        reason: str | None = None,
        **selector: Any,
    ) -> Json:
        """Act on every job or run ``selector`` matches (``job_ids``, ``run_ids``,
        ``tags_all``, ``tags_any``, ``pool``, ``name_prefix``, ``states``, ``due_after``,
        ``due_before``; ``everything=True`` for all the tenant's): ``action`` is cancel,
        pause, resume, redrive or trigger. Accepted at once: the answer is the operation,
        to follow with ``operations.get`` or ``operations.wait``."""
        return self._one(Calls.bulk(action, selector, everything, reason))


class Overrides(_Resource):
    def create(
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
        """Override the payload (a JSON merge-patch: a None value removes its key),
        timeout, priority or pool of one run not started yet (``run_id``), or of a job's
        ``scope="next"`` occurrence or ``"future"`` runs (``job_id``), at once; the job
        itself is not changed. Answers the override, ``runs`` the ones it changed."""
        values = {"payload": payload, "timeout": timeout, "priority": priority,
                  "pool": pool, "reason": reason}  # fmt: skip
        return self._one(Calls.overrides_create(job_id, run_id, scope, values))

    def list(
        self, *, job_id: Id | None = None, run_id: Id | None = None, ended: bool = False
    ) -> _Items:
        """A job's overrides, or those that made a run, in the merge order: the active
        ones, or every one with ``ended``."""
        return read_items(self._one(Calls.overrides_list(job_id, run_id, ended)))

    def remove(
        self,
        override_id: Id,
        *,
        job_id: Id | None = None,
        run_id: Id | None = None,
        reason: str | None = None,
    ) -> Json:
        """Remove an active override of the job, or one bound to the run: the runs
        not started yet that it changed are made again without it."""
        return self._one(Calls.overrides_remove(override_id, job_id, run_id, reason))

    def remove_all(self, job_id: Id, *, reason: str | None = None) -> _Items:
        """Remove every active override of the job; answers them."""
        return read_items(self._one(Calls.overrides_remove(None, job_id, None, reason)))


class Operations(_Resource):
    def get(self, operation_id: Id) -> Json:
        return self._one(Calls.operations_get(operation_id))

    def list(self, *, cursor: str | None = None, limit: int | None = None) -> Page[Json]:
        """The tenant's bulk operations, newest first."""
        return self._page(Calls.operations_list(cursor, limit))

    def wait(
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
            op = self.get(operation_id)
            if progress is not None:
                progress(op)
            if op.get("state") in ("done", "failed"):
                return op
            if time.monotonic() >= deadline:
                raise TimeoutError(f"operation {operation_id} still {op.get('state')}")
            time.sleep(interval)


class Audit(_Resource):
    def list(
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
        """The audit trail, newest first: who (``actor``, ``role``, ``key_id``,
        ``request_id``) did what (``action`` to ``target_kind``/``target_id``, the
        ``before`` and ``after`` of what changed), when and why."""
        return self._page(
            Calls.audit_list(actor, action, target_kind, target, since, until, cursor, limit)
        )

    def iter(
        self,
        *,
        actor: str | None = None,
        action: str | None = None,
        target_kind: str | None = None,
        target: Id | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        page_size: int | None = None,
    ) -> Iterator[Json]:
        cursor: str | None = None
        while True:
            page = self._page(
                Calls.audit_list(
                    actor, action, target_kind, target, since, until, cursor, page_size
                )
            )
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor


class Alerts(_Resource):
    def list(self) -> _Items:
        """Active alerts (``unroutable_runs``: dispatched runs no live worker can take;
        ``quarantined_runs``: runs a scheduler step failed on, taken out as dead letters),
        longest-standing first: the tenant's, or with the admin key every tenant's
        (one tenant's when the client names it)."""
        return read_items(self._client.send(Calls.alerts_list()))


class Workers(_Resource):
    def list(
        self, *, pool: str | None = None, cursor: str | None = None, limit: int | None = None
    ) -> Page[Json]:
        """Workers by id, deregistered ones included: pool, capabilities, tasks (None:
        any), tags, capacity and ``slots_in_use``, ``last_seen_at``, ``live``. The
        admin key sees every worker (one tenant's when the client names it); a tenant
        key its tenant's and the shared ones."""
        return self._page(Calls.workers_list(pool, cursor, limit))


class Pools(_Resource):
    def list(self) -> _Items:
        """Pools with a live worker or a backlog: live workers, capacity, busy and free
        slots, the P0 share and reserved slots, and the backlog (ready and due runs)
        by priority and tenant. The admin key sees every tenant's (one tenant's when
        the client names it); a tenant key the workers serving it and its own runs,
        with ``free`` None."""
        return read_items(self._client.send(Calls.pools_list()))

    def get(self, name: str) -> Json:
        """One pool, as in :meth:`list` (any name: one nothing uses shows zeros)."""
        return self._one(Calls.pools_get(name))

    def update(self, name: str, *, p0_reserved_share: float | None) -> Json:
        """Set the share (0..1) of each live worker's slots kept for P0 runs; None: the
        server's default (admin key only)."""
        return self._one(Calls.pools_update(name, p0_reserved_share))
