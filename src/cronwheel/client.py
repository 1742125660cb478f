"""The Python client of the cronwheel HTTP API.

``Client`` (blocking) and ``AsyncClient`` share ``_BaseClient``: everything that needs
no I/O — building requests, the tenant header, turning error responses into
:class:`ApiError` — lives there once, and each resource method is a one-line call of
its transport. Responses are the API's JSON objects (dicts) as documented in the
OpenAPI schema; lists come back as :class:`~cronwheel.domain.model.Page`.

::

    from cronwheel import Client

    with Client("http://localhost:8000", api_key=KEY) as client:
        job = client.jobs.create(name="hello", schedule={"delay": 5}, task="hello")
        nightly = client.jobs.create(
            name="nightly",
            task="report",
            schedule={"cron": "30 1 * * *", "timezone": "Europe/Paris"},
        )
        client.jobs.preview(nightly["id"], count=3)  # the next three due instants
        for run in client.runs.iter(job_id=job["id"]):
            print(run["state"])
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Self, cast
from urllib.parse import quote

import httpx
from pydantic_core import to_jsonable_python

from cronwheel.domain.errors import CronwheelError
from cronwheel.domain.model import Page

__all__ = [
    "DEFAULT_TIMEOUT",
    "TENANT_HEADER",
    "Alerts",
    "ApiConnectionError",
    "ApiError",
    "AsyncAlerts",
    "AsyncClient",
    "AsyncJobs",
    "AsyncRuns",
    "AsyncTenants",
    "Call",
    "Client",
    "Id",
    "Jobs",
    "Json",
    "Runs",
    "Tenants",
    "error_from_response",
]

DEFAULT_TIMEOUT = 30.0
TENANT_HEADER = "Cronwheel-Tenant"
_ERROR_TEXT_LIMIT = 300

Json = dict[str, Any]
Id = str | uuid.UUID
_Items = list[Json]  # inside the resources, ``list`` is their method


class ApiError(CronwheelError):
    """An error answer of the API: its HTTP ``status`` and its stable ``code``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, field=field, **dict(details or {}))
        self.status = status
        self.code = code

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        return f"{self.message}{where} [{self.status} {self.code}]"

    def __repr__(self) -> str:
        return (
            f"ApiError(status={self.status}, code={self.code!r}, "
            f"message={self.message!r}, field={self.field!r})"
        )


class ApiConnectionError(ApiError, ConnectionError):
    """The server could not be reached or did not answer in time (``status`` 0)."""

    def __init__(self, message: str, *, code: str = "connection_error") -> None:
        super().__init__(0, code, message)


def error_from_response(response: httpx.Response) -> ApiError:
    """The :class:`ApiError` an error response stands for, whatever produced it: the
    API's JSON error, a framework's validation answer, or a proxy's HTML page."""
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            details = error.get("details")
            return ApiError(
                status,
                str(error.get("code") or f"http_{status}"),
                str(error["message"]),
                None if error.get("field") is None else str(error["field"]),
                details if isinstance(details, dict) else None,
            )
        detail = body.get("detail")
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            first = detail[0]
            loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
            return ApiError(
                status,
                "invalid_request",
                str(first.get("msg", "invalid request")),
                ".".join(loc) or None,
            )
        if isinstance(detail, str):
            return ApiError(status, f"http_{status}", detail)
    text = " ".join(response.text.split())[:_ERROR_TEXT_LIMIT]
    reason = response.reason_phrase or "error"
    return ApiError(status, f"http_{status}", f"{reason}: {text}" if text else reason)


@dataclass(frozen=True, slots=True)
class Call:
    """One API request, built without I/O so both clients send it the same way."""

    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def _seg(value: Id) -> str:
    """An id as one path segment: nothing in it can climb to another route."""
    return quote(str(value), safe="")


def _params(**values: Any) -> dict[str, str]:
    out: dict[str, str] = {}
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


def _page(data: Any) -> Page[Json]:
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise ApiError(200, "bad_response", "the server answered a list without 'items'")
    return Page(items=list(data["items"]), next_cursor=data.get("next_cursor"))


def _lines(page: Any) -> list[Json]:
    if not isinstance(page, dict) or not isinstance(page.get("lines"), list):
        raise ApiError(200, "bad_response", "the server answered logs without 'lines'")
    return list(page["lines"])


def _items(data: Any) -> list[Json]:
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise ApiError(200, "bad_response", "the server answered a list without 'items'")
    return list(data["items"])


# -- the calls, shared by both clients ----------------------------------------------


class _Calls:
    """Every request the resources make, as :class:`Call` values."""

    @staticmethod
    def tenants_create(name: str, limits: Mapping[str, Any] | None) -> Call:
        body: Json = {"name": name}
        if limits is not None:
            body["limits"] = _body(limits)
        return Call("POST", "/v1/tenants", json=body)

    @staticmethod
    def tenants_get(tenant_id: Id) -> Call:
        return Call("GET", f"/v1/tenants/{_seg(tenant_id)}")

    @staticmethod
    def tenants_list(cursor: str | None, limit: int | None) -> Call:
        return Call("GET", "/v1/tenants", params=_params(cursor=cursor, limit=limit))

    @staticmethod
    def tenants_update(tenant_id: Id, limits: Mapping[str, Any]) -> Call:
        return Call("PATCH", f"/v1/tenants/{_seg(tenant_id)}", json={"limits": _body(limits)})

    @staticmethod
    def tenants_create_key(tenant_id: Id, role: str) -> Call:
        return Call("POST", f"/v1/tenants/{_seg(tenant_id)}/keys", json={"role": role})

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
        params = _params(state=state, tag=tag, name_prefix=name_prefix, cursor=cursor, limit=limit)
        return Call("GET", "/v1/jobs", params=params)

    @staticmethod
    def jobs_cancel(job_id: Id, reason: str | None) -> Call:
        body = {} if reason is None else {"reason": reason}
        return Call("POST", f"/v1/jobs/{_seg(job_id)}/cancel", json=body)

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
        return Call("GET", f"/v1/jobs/{_seg(job_id)}/preview", params=_params(count=count))

    @staticmethod
    def runs_get(run_id: Id) -> Call:
        return Call("GET", f"/v1/runs/{_seg(run_id)}")

    @staticmethod
    def runs_list(
        job_id: Id | None,
        state: str | Sequence[str] | None,
        since: datetime | None,
        until: datetime | None,
        tag: str | None,
        cursor: str | None,
        limit: int | None,
    ) -> Call:
        params = _params(
            job_id=job_id,
            state=state,
            since=since,
            until=until,
            tag=tag,
            cursor=cursor,
            limit=limit,
        )
        return Call("GET", "/v1/runs", params=params)

    @staticmethod
    def runs_cancel(run_id: Id, reason: str | None) -> Call:
        return _Calls.runs_control(run_id, "cancel", reason)

    @staticmethod
    def runs_control(run_id: Id, action: str, reason: str | None) -> Call:
        body = {} if reason is None else {"reason": reason}
        return Call("POST", f"/v1/runs/{_seg(run_id)}/{action}", json=body)

    @staticmethod
    def dead_letters(job_id: Id | None, cursor: str | None, limit: int | None) -> Call:
        params = _params(job_id=job_id, cursor=cursor, limit=limit)
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
        params = _params(attempt=attempt, cursor=cursor, limit=limit)
        return Call("GET", f"/v1/runs/{_seg(run_id)}/logs", params=params)

    @staticmethod
    def alerts_list() -> Call:
        return Call("GET", "/v1/alerts")


class _BaseClient:
    """What both clients share: the base URL, the credentials, request building and
    error parsing. No I/O happens here."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        tenant: Id | None = None,
    ) -> None:
        self.url = self._validate_url(url)
        self.api_key = api_key
        self.timeout = timeout
        self.tenant = None if tenant is None else str(tenant)

    @staticmethod
    def _validate_url(url: str) -> str:
        """The base URL without its trailing slash; ValueError unless it is http(s)."""
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise ValueError(f"not a valid URL: {url!r} ({exc})") from exc
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"not an http(s) URL: {url!r} (expected http://host:port)")
        return str(parsed).rstrip("/")

    def _default_headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "cronwheel-python"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _headers_for(self, call: Call) -> dict[str, str]:
        headers = dict(call.headers)
        if self.tenant is not None:
            headers[TENANT_HEADER] = self.tenant
        return headers

    def _transport_error(self, exc: httpx.TransportError, call: Call) -> ApiConnectionError:
        if isinstance(exc, httpx.TimeoutException):
            return ApiConnectionError(
                f"{call.method} {self.url}{call.path} timed out after {self.timeout:g} s",
                code="timeout",
            )
        return ApiConnectionError(f"cannot reach {self.url}: {exc or type(exc).__name__}")

    @staticmethod
    def _parse(response: httpx.Response) -> Any:
        if response.is_error:
            raise error_from_response(response)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise ApiError(
                response.status_code, "bad_response", "the server answered something not JSON"
            ) from exc


# -- blocking ------------------------------------------------------------------------


class Client(_BaseClient):
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
        self.tenants = Tenants(self)
        self.jobs = Jobs(self)
        self.runs = Runs(self)
        self.alerts = Alerts(self)

    def with_tenant(self, tenant: Id | None) -> Client:
        """A view of this client acting for ``tenant``, sharing its connections."""
        other = object.__new__(Client)
        other.__dict__.update(self.__dict__)
        other.tenant = None if tenant is None else str(tenant)
        other._owns_http = False
        other.tenants, other.jobs, other.runs = Tenants(other), Jobs(other), Runs(other)
        other.alerts = Alerts(other)
        return other

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

    def get(self, path: str, **params: Any) -> Any:
        """A GET of any API path (for what the resources do not cover yet)."""
        return self.send(Call("GET", path, params=_params(**params)))

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
        return _page(self._client.send(call))


class Tenants(_Resource):
    def create(self, name: str, *, limits: Mapping[str, Any] | None = None) -> Json:
        """A new tenant; the answer holds its first operator ``api_key`` (shown once)."""
        return self._one(_Calls.tenants_create(name, limits))

    def get(self, tenant_id: Id) -> Json:
        return self._one(_Calls.tenants_get(tenant_id))

    def list(self, *, cursor: str | None = None, limit: int | None = None) -> Page[Json]:
        return self._page(_Calls.tenants_list(cursor, limit))

    def update(self, tenant_id: Id, *, limits: Mapping[str, Any]) -> Json:
        return self._one(_Calls.tenants_update(tenant_id, limits))

    def create_key(self, tenant_id: Id, *, role: str = "operator") -> Json:
        return self._one(_Calls.tenants_create_key(tenant_id, role))


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
        webhook)."""
        return self._one(_Calls.jobs_create(name, schedule, task, idempotency_key, fields))

    def get(self, job_id: Id) -> Json:
        return self._one(_Calls.jobs_get(job_id))

    def list(
        self,
        *,
        state: str | None = None,
        tag: str | None = None,
        name_prefix: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Json]:
        return self._page(_Calls.jobs_list(state, tag, name_prefix, cursor, limit))

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

    def cancel(self, job_id: Id, *, reason: str | None = None) -> Json:
        return self._one(_Calls.jobs_cancel(job_id, reason))

    def pause(self, job_id: Id, *, reason: str | None = None) -> Json:
        """Hold an active job's runs until :meth:`resume`; answers the job."""
        return self._one(_Calls.jobs_control(job_id, "pause", reason))

    def resume(self, job_id: Id, *, reason: str | None = None) -> Json:
        """Release a paused job's runs (missed ones are due at once); answers the job."""
        return self._one(_Calls.jobs_control(job_id, "resume", reason))

    def trigger(self, job_id: Id, *, payload: Mapping[str, Any] | None = None) -> Json:
        """A run now, outside the schedule, ``payload`` merged over the job's; answers
        the run."""
        return self._one(_Calls.jobs_trigger(job_id, payload))

    def backfill(
        self, job_id: Id, *, start: datetime, end: datetime, rate: float | None = None
    ) -> Json:
        """Runs for the occurrences in the past range ``[start, end)`` (idempotent),
        released ``rate`` per second; answers ``{"created": N, "runs": [ids]}``."""
        return self._one(_Calls.jobs_backfill(job_id, start, end, rate))

    def preview(self, job_id: Id, *, count: int | None = None) -> _Items:
        """The job's next ``count`` (default 10) due instants: ``due_at`` (UTC),
        ``due_local`` (with its offset), ``kind`` and ``reason``."""
        return _items(self._one(_Calls.jobs_preview(job_id, count)))


class Runs(_Resource):
    def get(self, run_id: Id) -> Json:
        """One run with its ``attempts`` and ``events``."""
        return self._one(_Calls.runs_get(run_id))

    def list(
        self,
        *,
        job_id: Id | None = None,
        state: str | Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tag: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Json]:
        return self._page(_Calls.runs_list(job_id, state, since, until, tag, cursor, limit))

    def iter(
        self,
        *,
        job_id: Id | None = None,
        state: str | Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tag: str | None = None,
        page_size: int | None = None,
    ) -> Iterator[Json]:
        cursor: str | None = None
        while True:
            page = self.list(
                job_id=job_id,
                state=state,
                since=since,
                until=until,
                tag=tag,
                cursor=cursor,
                limit=page_size,
            )
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def cancel(self, run_id: Id, *, reason: str | None = None) -> Json:
        return self._one(_Calls.runs_cancel(run_id, reason))

    def redrive(self, run_id: Id, *, reason: str | None = None) -> Json:
        """Send a dead-lettered run back for a new series of attempts."""
        return self._one(_Calls.runs_control(run_id, "redrive", reason))

    def retry(self, run_id: Id, *, reason: str | None = None) -> Json:
        """Run a failed, cancelled or dead-lettered run again."""
        return self._one(_Calls.runs_control(run_id, "retry", reason))

    def dead_letters(
        self, *, job_id: Id | None = None, cursor: str | None = None, limit: int | None = None
    ) -> Page[Json]:
        return self._page(_Calls.dead_letters(job_id, cursor, limit))

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
        return self._one(_Calls.dead_letters_redrive(run_ids, job_id, all, reason, limit))

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
        return self._one(_Calls.runs_logs(run_id, attempt, cursor, limit))

    def logs(
        self, run_id: Id, *, attempt: int | None = None, page_size: int | None = None
    ) -> Iterator[Json]:
        """Every log line of the run (or of one ``attempt``), oldest first, fetching
        pages as it goes. Each line has ``ts``, ``attempt``, ``level`` and ``message``."""
        cursor: str | None = None
        while True:
            page = self.logs_page(run_id, attempt=attempt, cursor=cursor, limit=page_size)
            yield from _lines(page)
            cursor = page.get("next_cursor")
            if not cursor:
                return


class Alerts(_Resource):
    def list(self) -> _Items:
        """Active alerts (``unroutable_runs``: dispatched runs no live worker can take;
        ``quarantined_runs``: runs a scheduler step failed on, taken out as dead letters),
        longest-standing first: the tenant's, or with the admin key every tenant's
        (one tenant's when the client names it)."""
        return _items(self._client.send(_Calls.alerts_list()))


# -- async ---------------------------------------------------------------------------


class AsyncClient(_BaseClient):
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
        self.tenants = AsyncTenants(self)
        self.jobs = AsyncJobs(self)
        self.runs = AsyncRuns(self)
        self.alerts = AsyncAlerts(self)

    def with_tenant(self, tenant: Id | None) -> AsyncClient:
        other = object.__new__(AsyncClient)
        other.__dict__.update(self.__dict__)
        other.tenant = None if tenant is None else str(tenant)
        other._owns_http = False
        other.tenants = AsyncTenants(other)
        other.jobs, other.runs = AsyncJobs(other), AsyncRuns(other)
        other.alerts = AsyncAlerts(other)
        return other

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

    async def get(self, path: str, **params: Any) -> Any:
        return await self.send(Call("GET", path, params=_params(**params)))

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
        return _page(await self._client.send(call))


class AsyncTenants(_AsyncResource):
    async def create(self, name: str, *, limits: Mapping[str, Any] | None = None) -> Json:
        return await self._one(_Calls.tenants_create(name, limits))

    async def get(self, tenant_id: Id) -> Json:
        return await self._one(_Calls.tenants_get(tenant_id))

    async def list(self, *, cursor: str | None = None, limit: int | None = None) -> Page[Json]:
        return await self._page(_Calls.tenants_list(cursor, limit))

    async def update(self, tenant_id: Id, *, limits: Mapping[str, Any]) -> Json:
        return await self._one(_Calls.tenants_update(tenant_id, limits))

    async def create_key(self, tenant_id: Id, *, role: str = "operator") -> Json:
        return await self._one(_Calls.tenants_create_key(tenant_id, role))


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
        return await self._one(_Calls.jobs_create(name, schedule, task, idempotency_key, fields))

    async def get(self, job_id: Id) -> Json:
        return await self._one(_Calls.jobs_get(job_id))

    async def list(
        self,
        *,
        state: str | None = None,
        tag: str | None = None,
        name_prefix: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Json]:
        return await self._page(_Calls.jobs_list(state, tag, name_prefix, cursor, limit))

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

    async def cancel(self, job_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(_Calls.jobs_cancel(job_id, reason))

    async def pause(self, job_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(_Calls.jobs_control(job_id, "pause", reason))

    async def resume(self, job_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(_Calls.jobs_control(job_id, "resume", reason))

    async def trigger(self, job_id: Id, *, payload: Mapping[str, Any] | None = None) -> Json:
        return await self._one(_Calls.jobs_trigger(job_id, payload))

    async def backfill(
        self, job_id: Id, *, start: datetime, end: datetime, rate: float | None = None
    ) -> Json:
        return await self._one(_Calls.jobs_backfill(job_id, start, end, rate))

    async def preview(self, job_id: Id, *, count: int | None = None) -> _Items:
        return _items(await self._one(_Calls.jobs_preview(job_id, count)))


class AsyncRuns(_AsyncResource):
    async def get(self, run_id: Id) -> Json:
        return await self._one(_Calls.runs_get(run_id))

    async def list(
        self,
        *,
        job_id: Id | None = None,
        state: str | Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tag: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[Json]:
        return await self._page(_Calls.runs_list(job_id, state, since, until, tag, cursor, limit))

    async def iter(
        self,
        *,
        job_id: Id | None = None,
        state: str | Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tag: str | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[Json]:
        cursor: str | None = None
        while True:
            page = await self.list(
                job_id=job_id,
                state=state,
                since=since,
                until=until,
                tag=tag,
                cursor=cursor,
                limit=page_size,
            )
            for item in page.items:
                yield item
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def cancel(self, run_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(_Calls.runs_cancel(run_id, reason))

    async def redrive(self, run_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(_Calls.runs_control(run_id, "redrive", reason))

    async def retry(self, run_id: Id, *, reason: str | None = None) -> Json:
        return await self._one(_Calls.runs_control(run_id, "retry", reason))

    async def dead_letters(
        self, *, job_id: Id | None = None, cursor: str | None = None, limit: int | None = None
    ) -> Page[Json]:
        return await self._page(_Calls.dead_letters(job_id, cursor, limit))

    async def redrive_many(
        self,
        run_ids: Sequence[Id] | None = None,
        *,
        job_id: Id | None = None,
        all: bool = False,
        reason: str | None = None,
        limit: int | None = None,
    ) -> Json:
        return await self._one(_Calls.dead_letters_redrive(run_ids, job_id, all, reason, limit))

    async def logs_page(
        self,
        run_id: Id,
        *,
        attempt: int | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Json:
        return await self._one(_Calls.runs_logs(run_id, attempt, cursor, limit))

    async def logs(
        self, run_id: Id, *, attempt: int | None = None, page_size: int | None = None
    ) -> AsyncIterator[Json]:
        cursor: str | None = None
        while True:
            page = await self.logs_page(run_id, attempt=attempt, cursor=cursor, limit=page_size)
            for line in _lines(page):
                yield line
            cursor = page.get("next_cursor")
            if not cursor:
                return


class AsyncAlerts(_AsyncResource):
    async def list(self) -> _Items:
        return _items(await self._client.send(_Calls.alerts_list()))
