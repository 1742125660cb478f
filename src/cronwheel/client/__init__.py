"""The Python client of the cronwheel HTTP API.

``Client`` (blocking) and ``AsyncClient`` share ``BaseClient``: everything that needs
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

``jobs.update`` edits a job (``if_version=`` makes the edit conditional on the job's
version: :class:`PreconditionFailedError` when it moved on). ``jobs.create_many``
creates jobs by the thousand and says, job by job, what was
created and what failed and why (:class:`CreatedMany`).

``workflows.create`` takes a :class:`Workflow` written with ``>>`` between its nodes
(``extract >> [transform_a, transform_b] >> load``) or the body of ``POST
/v1/workflows``; ``workflows.run`` shows a workflow run with each node's state.

The modules: ``errors`` (:class:`ApiError` and what raises it), ``calls`` (each
request as a :class:`Call`), ``batches`` (``create_many``'s plan), ``builder``
(:class:`Workflow`), ``base`` (the
I/O-free ``BaseClient``), ``sync`` (:class:`Client`) and ``aio``
(:class:`AsyncClient`). The two clients are written side by side;
``tests/unit/test_client_parity.py`` fails when they part.
"""

from __future__ import annotations

from cronwheel.client.aio import (
    AsyncAlerts,
    AsyncClient,
    AsyncJobs,
    AsyncPools,
    AsyncRuns,
    AsyncTenants,
    AsyncWorkers,
    AsyncWorkflows,
)
from cronwheel.client.base import DEFAULT_TIMEOUT, TENANT_HEADER
from cronwheel.client.batches import CreatedMany
from cronwheel.client.builder import Node, Workflow
from cronwheel.client.calls import Call, Id, Json
from cronwheel.client.errors import (
    ApiConnectionError,
    ApiError,
    PreconditionFailedError,
    error_from_response,
)
from cronwheel.client.sync import (
    Alerts,
    Client,
    Jobs,
    Pools,
    Runs,
    Tenants,
    Workers,
    Workflows,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "TENANT_HEADER",
    "Alerts",
    "ApiConnectionError",
    "ApiError",
    "AsyncAlerts",
    "AsyncClient",
    "AsyncJobs",
    "AsyncPools",
    "AsyncRuns",
    "AsyncTenants",
    "AsyncWorkers",
    "AsyncWorkflows",
    "Call",
    "Client",
    "CreatedMany",
    "Id",
    "Jobs",
    "Json",
    "Node",
    "Pools",
    "PreconditionFailedError",
    "Runs",
    "Tenants",
    "Workers",
    "Workflow",
    "Workflows",
    "error_from_response",
]
