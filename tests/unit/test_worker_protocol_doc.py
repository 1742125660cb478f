"""``docs/worker-protocol.md`` is what a team outside Python writes a worker from: it
names every path of the worker protocol, every field of its bodies and answers, and the
status and code of every error a worker meets. A field or path added to the protocol
without a word in the document fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from pydantic import BaseModel

from cronwheel.api import worker_schemas as ws
from cronwheel.api.routers import attempts, logs, workers
from cronwheel.domain.errors import (
    AuthError,
    CronwheelError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    StaleFencingTokenError,
    ValidationError,
    WorkerDeregisteredError,
)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "worker-protocol.md").read_text()

BODIES: list[type[BaseModel]] = [
    ws.WorkerRegister,
    ws.WorkerRegistered,
    ws.WorkerDeregistered,
    ws.LeaseRequest,
    ws.LeaseOut,
    ws.LeasedAttemptOut,
    ws.StartRequest,
    ws.StartOut,
    ws.CancelsRequest,
    ws.CancelsOut,
    ws.CancelOut,
    ws.GatesRequest,
    ws.GatesOut,
    ws.GateOpenedOut,
    ws.HeartbeatRequest,
    ws.HeartbeatOut,
    ws.CompleteRequest,
    ws.FailRequest,
    ws.AttemptResultOut,
    ws.BatchRequest,
    ws.HeartbeatItemIn,
    ws.CompleteItemIn,
    ws.FailItemIn,
    ws.OutcomeOut,
    ws.LogAppendRequest,
    ws.LogLineIn,
    ws.LogAppendOut,
]
ERRORS: list[type[CronwheelError]] = [
    AuthError,
    PermissionDeniedError,
    NotFoundError,
    StaleFencingTokenError,
    WorkerDeregisteredError,
    PayloadTooLargeError,
    ValidationError,
    RateLimitedError,
]


def _protocol_routes() -> list[tuple[str, str]]:
    routes = [r for m in (workers, attempts) for r in m.router.routes if isinstance(r, APIRoute)]
    routes += [
        r for r in logs.router.routes if isinstance(r, APIRoute) and "worker protocol" in r.tags
    ]
    return sorted((method, r.path) for r in routes for method in r.methods or ())


def test_the_routes_are_found() -> None:
    """register, lease, start, cancels, deregister; heartbeat, complete, fail, release,
    logs, batch"""
    assert len(_protocol_routes()) >= 11


@pytest.mark.parametrize(("method", "path"), _protocol_routes())
def test_every_path_is_described(method: str, path: str) -> None:
    assert f"`{method} {path}`" in DOC


@pytest.mark.parametrize(
    ("body", "field"),
    [(body, name) for body in BODIES for name in body.model_fields],
    ids=lambda value: value.__name__ if isinstance(value, type) else str(value),
)
def test_every_field_is_described(body: type[BaseModel], field: str) -> None:
    assert f"`{field}`" in DOC or f'"{field}"' in DOC, f"{body.__name__}.{field}"


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
def test_every_error_has_its_status_and_code(error: type[CronwheelError]) -> None:
    assert f"| {error.status} | `{error.code}` |" in DOC
