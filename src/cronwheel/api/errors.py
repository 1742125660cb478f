"""Every error the API answers is JSON of one shape::

    {"error": {"code": "invalid_request", "message": "...", "field": "schedule.at"}}

- :class:`CronwheelError` (and subclasses): its ``status`` and ``to_dict()``.
- Request validation (FastAPI / Pydantic): 422 ``invalid_request`` naming the first
  offending field as a dotted path without the ``body`` / ``query`` prefix; malformed
  JSON is 400 ``invalid_json``.
- Starlette's HTTP errors (unknown route, wrong method): their status, a stable code; a
  405 lists in ``Allow`` every method of the resource, not only those of the one route
  that matched its path first.
- The database unreachable or overloaded (no connection to be had): 503
  ``store_unavailable`` with ``Retry-After``.
- Anything else: 500 ``internal_error``, logged with its traceback, never shown.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from cronwheel.domain.errors import (
    AuthError,
    CronwheelError,
    StaleVersionError,
    StoreUnavailableError,
    TenantLimitError,
)
from cronwheel.metrics import RUNS_THROTTLED

__all__ = [
    "AllowedMethods",
    "TenantRequiredError",
    "error_response",
    "install_error_handlers",
    "validation_error_body",
]

log = logging.getLogger("cronwheel.api")

_LOCATION_PREFIXES = frozenset({"body", "query", "path", "header", "cookie"})

_HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


class AllowedMethods:
    """The methods each path answers, across every route: a resource such as
    ``/v1/tenants`` is served by one route per method, and the router's 405 names only
    the methods of the first route whose path matched. Where a literal path and a
    template both match (``/v1/jobs/batch`` and ``/v1/jobs/{job_id}``), the resource is
    the one with the fewest parameters: ``batch`` is not a job id."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self._routes = [
            (r.path_regex, len(r.param_convertors), frozenset(r.methods or ())) for r in routes
        ]

    def for_path(self, path: str) -> list[str]:
        found: dict[int, set[str]] = {}
        for regex, params, methods in self._routes:
            if regex.match(path):
                found.setdefault(params, set()).update(methods)
        return sorted(found[min(found)]) if found else []


class TenantRequiredError(CronwheelError):
    """The admin key acted on tenant resources without naming the tenant."""

    status = 400
    code = "tenant_required"


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        body["field"] = field
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def _field_of(loc: Sequence[Any]) -> str | None:
    parts = [str(p) for p in loc]
    if parts and parts[0] in _LOCATION_PREFIXES:
        parts = parts[1:]
    return ".".join(parts) or None


def _message_of(error: dict[str, Any], field: str | None) -> str:
    kind = error.get("type", "")
    msg = str(error.get("msg", "invalid value"))
    if kind == "extra_forbidden":
        msg = "unknown field"
    elif kind == "missing":
        msg = "field required"
    elif msg.startswith(("Value error, ", "Assertion failed, ")):
        msg = msg.split(", ", 1)[1]
    elif kind.startswith(("datetime_", "timezone_")):
        msg += " (write an ISO-8601 instant with an offset, e.g. 2030-01-31T09:30:00Z)"
    if field is None:
        return msg
    return f"{field}: {msg}"


def _node_of(body: Any, loc: Sequence[Any]) -> str | None:
    """The name of the workflow node a field of the request ``body`` belongs to
    (``nodes.3.timeout``: the fourth node's), when it has a name to show: a node is
    known to the user by its name, not by its place in a list."""
    if len(loc) < 3 or list(loc[:2]) != ["body", "nodes"] or not isinstance(loc[2], int):
        return None
    nodes = body.get("nodes") if isinstance(body, dict) else None
    if not isinstance(nodes, list) or not 0 <= loc[2] < len(nodes):
        return None
    node = nodes[loc[2]]
    name = node.get("name") if isinstance(node, dict) else None
    return name if isinstance(name, str) and len(name) <= 100 else None


def validation_error_body(errors: Sequence[Any], body: Any = None) -> tuple[int, dict[str, Any]]:
    """The status and JSON body for a list of Pydantic/FastAPI error dicts (``body``:
    the request's, to name the workflow node a field belongs to)."""
    if not errors:
        return 422, {"error": {"code": "invalid_request", "message": "invalid request"}}
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "malformed JSON")
        return 400, {
            "error": {
                "code": "invalid_json",
                "message": f"the request body is not valid JSON: {detail}",
            }
        }
    loc = tuple(first.get("loc", ()))
    if loc == ("body",) and first.get("type") == "missing":
        return 422, {
            "error": {"code": "invalid_request", "message": "a JSON request body is required"}
        }
    field = _field_of(loc)
    node = _node_of(body, loc)
    shown = field if node is None or field is None else f"{field} (node {node!r})"
    out: dict[str, Any] = {"code": "invalid_request", "message": _message_of(first, shown)}
    if field is not None:
        out["field"] = field
    if len(errors) > 1:
        out["details"] = {
            "errors": [
                {"field": _field_of(e.get("loc", ())), "message": _message_of(e, None)}
                for e in errors
            ]
        }
    return 422, {"error": out}


async def _cronwheel_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CronwheelError)
    headers: dict[str, str] | None = None
    if isinstance(exc, AuthError):
        headers = {"WWW-Authenticate": "Bearer"}
    elif isinstance(exc, StoreUnavailableError):
        # Overload or a failover: the same request may well succeed in a moment.
        headers = {"Retry-After": "1"}
    elif isinstance(exc, StaleVersionError) and "current_version" in exc.details:
        # The version it is at, as a read of it would tag it.
        headers = {"ETag": f'"{exc.details["current_version"]}"'}
    elif isinstance(exc, TenantLimitError):
        # Once per refused request, by tenant name, as leasing counts its holds.
        details = exc.details
        RUNS_THROTTLED.labels(
            tenant=str(details.get("tenant")), limit=str(details.get("limit"))
        ).inc()
    return JSONResponse(exc.to_dict(), status_code=exc.status, headers=headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    status, body = validation_error_body(exc.errors(), exc.body)
    return JSONResponse(body, status_code=status)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    if exc.status_code == 404:
        message = f"no such endpoint: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    headers = dict(exc.headers or {})
    allowed: AllowedMethods | None = getattr(request.app.state, "allowed_methods", None)
    if exc.status_code == 405 and allowed is not None:
        methods = allowed.for_path(request.scope["path"])
        if methods:
            headers["Allow"] = ", ".join(methods)
    return error_response(exc.status_code, code, message, headers=headers or None)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.error(
        "unhandled error on %s %s",
        request.method,
        request.url.path,
        exc_info=exc,
        extra={"event": "api.unhandled_error"},
    )
    return error_response(500, "internal_error", "internal server error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(CronwheelError, _cronwheel_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
