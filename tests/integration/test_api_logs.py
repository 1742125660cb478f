"""Worker logs over HTTP, on both backends and with both log stores (files, and the
database's ``log_chunks``): ``POST /v1/attempts/{id}/logs`` fenced like every attempt
call, ``GET /v1/runs/{id}/logs`` scoped like every run read."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from answers import error_of
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from cronwheel.api import create_app
from cronwheel.logstore import FileLogStore, LogStore
from cronwheel.logstore_db import DatabaseLogStore
from cronwheel.settings import Settings
from cronwheel.store import Store

TS = "2031-03-04T12:00:00.250Z"
TS_OUT = "2031-03-04T12:00:00.250000Z"


@pytest.fixture(params=["files", "database"])
def log_store(request: pytest.FixtureRequest, tmp_path: Path, store: Store) -> LogStore:
    if request.param == "database":
        return DatabaseLogStore(store, max_bytes_per_attempt=4096)
    return FileLogStore(tmp_path / "run-logs", max_bytes_per_attempt=4096)


async def nothing_written(log_store: LogStore, run_id: str, *tenants: Any) -> bool:
    """No line of the run under any of ``tenants`` (and, for files, no file at all)."""
    if isinstance(log_store, FileLogStore):
        return not log_store.root.exists()
    for tenant in tenants:
        page = await log_store.read(uuid.UUID(tenant.id), run_id=uuid.UUID(run_id))
        if page.lines:
            return False
    return True


@pytest.fixture
async def app(settings: Settings, store: Store, log_store: LogStore) -> AsyncIterator[FastAPI]:
    application = create_app(settings, store, log_store=log_store)
    async with LifespanManager(application):
        yield application


def lines(*messages: str, level: str = "INFO") -> list[dict[str, str]]:
    return [{"ts": TS, "level": level, "message": m} for m in messages]


async def leased(api: Any, tenant: Any) -> tuple[dict[str, str], dict[str, Any]]:
    """A job of ``tenant`` fired and leased by a fresh worker: its key and the lease."""
    job = await api.job(tenant)
    await api.fire()
    worker = await api.key(tenant, "worker")
    r = await api.client.post("/v1/workers", json={}, headers=worker)
    assert r.status_code == 200, r.text
    r = await api.client.post(
        f"/v1/workers/{r.json()['worker_id']}/lease", json={"max": 1}, headers=worker
    )
    assert r.status_code == 200, r.text
    [attempt] = r.json()["attempts"]
    assert attempt["run_id"] == job["first_run_id"]
    return worker, attempt


async def post_logs(
    api: Any, headers: dict[str, str], attempt: dict[str, Any], body: dict[str, Any]
) -> httpx.Response:
    body.setdefault("fencing_token", attempt["fencing_token"])
    response: httpx.Response = await api.client.post(
        f"/v1/attempts/{attempt['attempt_id']}/logs", json=body, headers=headers
    )
    return response


async def read(api: Any, headers: dict[str, str], run_id: str, **params: Any) -> dict[str, Any]:
    r = await api.client.get(f"/v1/runs/{run_id}/logs", params=params, headers=headers)
    assert r.status_code == 200, r.text
    page: dict[str, Any] = r.json()
    return page


async def test_append_then_read(api: Any) -> None:
    t = await api.tenant()
    worker, attempt = await leased(api, t)
    r = await post_logs(
        api,
        worker,
        attempt,
        {"lines": [*lines("starting"), *lines("it broke\n  twice", level="ERROR")]},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["attempt_id"] == attempt["attempt_id"]
    assert (body["accepted"], body["dropped"]) == (2, 0) and body["size"] > 0

    for reader in (t.headers, await api.key(t, "viewer"), {**api.admin, "Cronwheel-Tenant": t.id}):
        page = await read(api, reader, attempt["run_id"])
        assert page["run_id"] == attempt["run_id"] and page["run_state"] == "RUNNING"
        assert page["lines"] == [
            {"ts": TS_OUT, "attempt": 1, "level": "INFO", "message": "starting"},
            {"ts": TS_OUT, "attempt": 1, "level": "ERROR", "message": "it broke\n  twice"},
        ]
        assert page["next_cursor"] is None and page["end_cursor"]

    # Worker keys write logs; they do not read runs.
    r = await api.client.get(f"/v1/runs/{attempt['run_id']}/logs", headers=worker)
    assert r.status_code == 403


async def test_pages_and_attempt_filter(api: Any) -> None:
    t = await api.tenant()
    worker, attempt = await leased(api, t)
    for batch in (("1", "2", "3"), ("4", "5")):
        r = await post_logs(api, worker, attempt, {"lines": lines(*batch)})
        assert r.status_code == 200, r.text

    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = await read(api, t.headers, attempt["run_id"], **params)
        seen += [line["message"] for line in page["lines"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ["1", "2", "3", "4", "5"]

    # Following from end_cursor: only newer lines.
    end = page["end_cursor"]
    assert (await read(api, t.headers, attempt["run_id"], cursor=end))["lines"] == []
    assert (await post_logs(api, worker, attempt, {"lines": lines("6")})).status_code == 200
    newer = await read(api, t.headers, attempt["run_id"], cursor=end)
    assert [line["message"] for line in newer["lines"]] == ["6"]

    assert len((await read(api, t.headers, attempt["run_id"], attempt=1))["lines"]) == 6
    assert (await read(api, t.headers, attempt["run_id"], attempt=2))["lines"] == []


async def test_stale_token_is_409_and_writes_nothing(
    api: Any, store: Store, log_store: LogStore
) -> None:
    t = await api.tenant()
    worker, attempt = await leased(api, t)
    run_id = uuid.UUID(attempt["run_id"])
    assert (await post_logs(api, worker, attempt, {"lines": lines("kept")})).status_code == 200
    size = await log_store.size(uuid.UUID(t.id), run_id=run_id, attempt=1)

    async def refused(body: dict[str, Any]) -> None:
        r = await post_logs(api, worker, attempt, body)
        assert r.status_code == 409, r.text
        err = error_of(r)
        assert err["code"] == "stale_fencing_token" and err["field"] == "fencing_token"
        assert await log_store.size(uuid.UUID(t.id), run_id=run_id, attempt=1) == size

    await refused({"lines": lines("zombie"), "fencing_token": attempt["fencing_token"] + 1})
    await refused({"lines": lines("zombie"), "fencing_token": 2**63 - 1})

    # Once the outcome is in, the attempt's own token is stale too.
    r = await api.client.post(
        f"/v1/attempts/{attempt['attempt_id']}/complete",
        json={"fencing_token": attempt["fencing_token"]},
        headers=worker,
    )
    assert r.status_code == 200, r.text
    await refused({"lines": lines("too late")})

    page = await read(api, t.headers, attempt["run_id"])
    assert [line["message"] for line in page["lines"]] == ["kept"]
    assert page["run_state"] == "SUCCESS"


async def test_a_lost_attempt_is_superseded(api: Any, store: Store) -> None:
    t = await api.tenant()
    worker, first = await leased(api, t)  # the default retry policy allows 3 attempts
    assert (await post_logs(api, worker, first, {"lines": lines("first try")})).status_code == 200
    # The lease expires (an hour from now): the attempt is lost, the run retried.
    later = await store.db_now() + timedelta(hours=1)
    assert await store.attempts_expire(now=later) == 1
    r = await post_logs(api, worker, first, {"lines": lines("zombie")})
    assert r.status_code == 409 and error_of(r)["code"] == "stale_fencing_token"

    run = await store.runs_get(uuid.UUID(t.id), uuid.UUID(first["run_id"]))
    assert run.state == "SCHEDULED"
    # The retry, fired and leased in that hour (its lease outlives the real clock).
    await store.shard_leases_acquire(node_id="t", shards=range(256), ttl=7200, now=later)
    retry_at = run.fire_at
    fired = await store.runs_fire(run_ids=[run.id], node_id="t", now=retry_at)
    assert [f.id for f in fired] == [run.id]
    [worker_id] = {a.worker_id for a in await store.attempts_list(run.tenant_id, run_id=run.id)}
    assert worker_id is not None
    [lease] = await store.attempts_lease(
        worker=await store.workers_get(worker_id), max=1, now=retry_at
    )
    second = {
        "attempt_id": str(lease.attempt_id),
        "run_id": str(lease.run_id),
        "attempt": lease.number,
        "fencing_token": lease.fencing_token,
    }
    assert second["attempt"] == 2
    assert (await post_logs(api, worker, second, {"lines": lines("second try")})).status_code == 200
    # The old token does not open the new attempt either.
    r = await post_logs(
        api, worker, second, {"lines": lines("zombie"), "fencing_token": first["fencing_token"]}
    )
    assert r.status_code == 409

    page = await read(api, t.headers, first["run_id"])
    assert [(line["attempt"], line["message"]) for line in page["lines"]] == [
        (1, "first try"),
        (2, "second try"),
    ]
    only = await read(api, t.headers, first["run_id"], attempt=2)
    assert [line["message"] for line in only["lines"]] == ["second try"]


async def test_unknown_and_other_tenants_are_404(api: Any, log_store: LogStore) -> None:
    mine, other = await api.tenant(), await api.tenant()
    worker, attempt = await leased(api, mine)
    other_worker = await api.key(other, "worker")

    for path_id, headers in [
        (str(uuid.uuid4()), worker),
        ("not-a-uuid", worker),
        (attempt["attempt_id"], other_worker),  # another tenant's attempt
    ]:
        r = await api.client.post(
            f"/v1/attempts/{path_id}/logs",
            json={"fencing_token": attempt["fencing_token"], "lines": lines("x")},
            headers=headers,
        )
        assert r.status_code == 404, r.text
        assert error_of(r)["code"] == "not_found"
    assert await nothing_written(log_store, attempt["run_id"], mine, other)

    for run_id, headers in [
        (attempt["run_id"], other.headers),  # another tenant's run
        (str(uuid.uuid4()), mine.headers),
        ("nope", mine.headers),
    ]:
        r = await api.client.get(f"/v1/runs/{run_id}/logs", headers=headers)
        assert r.status_code == 404, r.text
        assert error_of(r)["code"] == "not_found"


async def test_bad_input_is_422_and_writes_nothing(api: Any, log_store: LogStore) -> None:
    t = await api.tenant()
    worker, attempt = await leased(api, t)
    good = lines("ok")[0]
    for body, field in [
        ({"lines": []}, "lines"),
        ({"lines": [{**good, "level": "LOUD"}]}, "lines.0.level"),
        ({"lines": [{**good, "ts": "2031-03-04T12:00:00"}]}, "lines.0.ts"),  # no zone
        ({"lines": [{**good, "message": "m" * 16_385}]}, "lines.0.message"),
        ({"lines": [{**good, "colour": "red"}]}, "lines.0.colour"),
        ({"lines": [good] * 1001}, "lines"),
        ({"lines": [good], "fencing_token": "x"}, "fencing_token"),
        ({"lines": [good], "fencing_token": 2**64}, "fencing_token"),
    ]:
        r = await post_logs(api, worker, attempt, body)
        assert r.status_code == 422, (field, r.text)
        assert error_of(r)["field"] == field, r.text
    r = await api.client.post(
        f"/v1/attempts/{attempt['attempt_id']}/logs", json={"lines": [good]}, headers=worker
    )
    assert r.status_code == 422 and error_of(r)["field"] == "fencing_token"
    assert await nothing_written(log_store, attempt["run_id"], t)

    for params, field in [
        ({"cursor": "garbage"}, "cursor"),
        ({"cursor": "1:\u00b2"}, "cursor"),  # a digit to str.isdigit, not to int()
        ({"attempt": 0}, "attempt"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
    ]:
        r = await api.client.get(
            f"/v1/runs/{attempt['run_id']}/logs", params=params, headers=t.headers
        )
        assert r.status_code == 422, (params, r.text)
        assert error_of(r)["field"] == field, r.text


async def test_the_cap_is_reported_and_marked(api: Any) -> None:
    t = await api.tenant()
    worker, attempt = await leased(api, t)
    big = "z" * 1500  # two fit under the 4096-byte cap
    r = await post_logs(api, worker, attempt, {"lines": lines(big, big, big, big)})
    assert r.status_code == 200, r.text
    assert (r.json()["accepted"], r.json()["dropped"]) == (2, 2)
    r = await post_logs(api, worker, attempt, {"lines": lines("small")})
    assert (r.json()["accepted"], r.json()["dropped"]) == (0, 1)

    page = await read(api, t.headers, attempt["run_id"])
    assert [line["message"] for line in page["lines"][:2]] == [big, big]
    [marker] = page["lines"][2:]
    assert marker["level"] == "WARNING" and "3 later lines" in marker["message"]


async def test_the_default_log_store_lives_under_the_data_dir(
    settings: Settings, store: Store
) -> None:
    app = create_app(settings, store)
    logs = app.state.logs
    assert isinstance(logs, FileLogStore)
    assert logs.root == settings.data_dir / "logs"
    assert logs.max_bytes_per_attempt == settings.max_log_bytes_per_attempt == 1 << 20
    elsewhere = settings.model_copy(
        update={"log_dir": settings.data_dir / "elsewhere", "max_log_bytes_per_attempt": 8192}
    )
    moved = create_app(elsewhere, store).state.logs
    assert (moved.root, moved.max_bytes_per_attempt) == (settings.data_dir / "elsewhere", 8192)


async def test_the_database_log_store_is_the_default_on_postgresql(
    settings: Settings, store: Store
) -> None:
    """API nodes on one PostgreSQL database read each other's lines: their default log
    store is the database; SQLite (one machine) keeps files. The setting decides."""
    on_postgres = settings.model_copy(update={"database_url": "postgresql+asyncpg://h/db"})
    logs = create_app(on_postgres, store).state.logs
    assert isinstance(logs, DatabaseLogStore)
    assert (logs.max_bytes_per_attempt, logs.retention_days) == (1 << 20, 30)
    files = on_postgres.model_copy(update={"log_store": "files"})
    assert isinstance(create_app(files, store).state.logs, FileLogStore)
    kept = settings.model_copy(update={"log_store": "database", "log_retention_days": 7})
    logs = create_app(kept, store).state.logs
    assert isinstance(logs, DatabaseLogStore) and logs.retention_days == 7
