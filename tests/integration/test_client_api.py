"""AsyncClient against the real app over the real store (both backends), in-process
through httpx's ASGI transport."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from cronwheel import ApiError, AsyncClient, PreconditionFailedError
from cronwheel.api import create_app
from cronwheel.settings import Settings
from cronwheel.store import Store

ADMIN_KEY = "client-test-admin-key"
BASE = "http://cronwheel.test"


@pytest.fixture
async def app(store: Store, tmp_path: Path) -> AsyncIterator[FastAPI]:
    application = create_app(Settings(data_dir=tmp_path, admin_key=ADMIN_KEY), store)
    async with LifespanManager(application):
        yield application


def _client(app: FastAPI, key: str | None, **kwargs: Any) -> AsyncClient:
    return AsyncClient(BASE, api_key=key, transport=httpx.ASGITransport(app=app), **kwargs)


@pytest.fixture
async def admin(app: FastAPI) -> AsyncIterator[AsyncClient]:
    async with _client(app, ADMIN_KEY) as client:
        yield client


@pytest.fixture
async def tenant(admin: AsyncClient) -> dict[str, Any]:
    return await admin.tenants.create(f"team-{uuid.uuid4().hex[:6]}")


@pytest.fixture
async def operator(app: FastAPI, tenant: dict[str, Any]) -> AsyncIterator[AsyncClient]:
    async with _client(app, tenant["api_key"]) as client:
        yield client


async def test_job_round_trip(operator: AsyncClient) -> None:
    job = await operator.jobs.create(
        name="hello",
        schedule={"delay": 60},
        task="hello",
        payload={"n": 1},
        tags=["t1"],
        priority=1,
        retry={"max_attempts": 5},
    )
    assert job["state"] == "active" and job["task"] == "hello" and job["priority"] == 1
    assert job["payload"] == {"n": 1} and job["retry"]["max_attempts"] == 5
    assert await operator.jobs.get(job["id"]) == {**job, "first_run_id": None}

    page = await operator.jobs.list(tag="t1")
    assert [j["id"] for j in page.items] == [job["id"]] and page.next_cursor is None

    runs = await operator.runs.list(job_id=job["id"])
    [run] = runs.items
    assert run["id"] == job["first_run_id"] and run["state"] == "SCHEDULED"
    detail = await operator.runs.get(run["id"])
    assert detail["attempts"] == [] and detail["events"][0]["to_state"] == "SCHEDULED"


async def test_datetimes_and_models_are_sent_as_json(operator: AsyncClient) -> None:
    at = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    job = await operator.jobs.create(name="at", schedule={"at": at}, task="t")
    assert datetime.fromisoformat(job["next_due_at"].replace("Z", "+00:00")) == at
    page = await operator.runs.list(since=at - timedelta(seconds=1), until=at + timedelta(1))
    assert [r["job_id"] for r in page.items] == [job["id"]]


async def test_idempotency_key_returns_the_same_job(operator: AsyncClient) -> None:
    first = await operator.jobs.create(
        name="once", schedule={"asap": True}, task="t", idempotency_key="k-1"
    )
    again = await operator.jobs.create(
        name="once", schedule={"asap": True}, task="t", idempotency_key="k-1"
    )
    assert again["id"] == first["id"]
    with pytest.raises(ApiError) as info:
        await operator.jobs.create(
            name="other", schedule={"asap": True}, task="t", idempotency_key="k-1"
        )
    assert (info.value.status, info.value.code) == (409, "idempotency_conflict")
    assert len((await operator.jobs.list()).items) == 1


async def test_iter_walks_every_page(operator: AsyncClient) -> None:
    made = [
        (await operator.jobs.create(name=f"j{i}", schedule={"delay": 600}, task="t"))["id"]
        for i in range(5)
    ]
    seen = [j["id"] async for j in operator.jobs.iter(page_size=2)]
    assert seen == made[::-1]
    runs = [r["job_id"] async for r in operator.runs.iter(page_size=2)]
    assert runs == made[::-1]  # each due 600 s after its creation: newest first
    pooled = await operator.jobs.create(
        name="pooled", schedule={"delay": 60}, task="t", pool="etl", tags=["x", "y"]
    )
    listed = [r["id"] async for r in operator.runs.iter(pool="etl", tag=["x", "y"], page_size=1)]
    assert listed == [pooled["first_run_id"]]
    assert (await operator.runs.list(pool="etl", tag=["x", "z"])).items == []
    events = [e async for e in operator.runs.iter_events(pooled["first_run_id"], page_size=1)]
    assert [e["to_state"] for e in events] == ["SCHEDULED"]


async def test_cancel_then_cancel_again_is_a_conflict(operator: AsyncClient) -> None:
    job = await operator.jobs.create(name="c", schedule={"delay": 600}, task="t")
    cancelled = await operator.jobs.cancel(job["id"], reason="not needed")
    assert cancelled["state"] == "cancelled"
    run = await operator.runs.get(job["first_run_id"])
    assert run["state"] == "CANCELLED"
    assert any(e.get("reason") == "not needed" for e in run["events"])
    with pytest.raises(ApiError) as info:
        await operator.jobs.cancel(job["id"])
    assert (info.value.status, info.value.code) == (409, "illegal_transition")


async def test_run_cancel(operator: AsyncClient) -> None:
    job = await operator.jobs.create(name="c", schedule={"delay": 600}, task="t")
    run = await operator.runs.cancel(job["first_run_id"], reason="skip it")
    assert run["state"] == "CANCELLED"


async def test_overrides_round_trip(operator: AsyncClient) -> None:
    job = await operator.jobs.create(
        name="o", schedule={"delay": 600}, task="t", payload={"a": 1, "b": 2}
    )
    run_id = job["first_run_id"]
    # A None inside the payload patch is sent: it removes the key.
    made = await operator.overrides.create(
        job_id=job["id"], scope="next", payload={"b": None, "c": 3}, pool="gpu"
    )
    assert (made["run_id"], made["runs"]) == (run_id, [run_id])
    run = await operator.runs.get(run_id)
    assert (run["payload"], run["pool"], run["override_ids"]) == (
        {"a": 1, "c": 3},
        "gpu",
        [made["id"]],
    )
    assert [o["id"] for o in await operator.overrides.list(run_id=run_id)] == [made["id"]]
    removed = await operator.overrides.remove(made["id"], job_id=job["id"], reason="done")
    assert removed["status"] == "removed"
    assert await operator.overrides.remove_all(job["id"]) == []
    assert (await operator.runs.get(run_id))["payload"] == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match="not both"):
        await operator.overrides.list(job_id=job["id"], run_id=run_id)


async def test_validation_errors_name_the_field(operator: AsyncClient) -> None:
    with pytest.raises(ApiError) as info:
        await operator.jobs.create(name="bad", schedule={"delay": 5}, task="t", priority=9)
    assert info.value.status == 422 and info.value.field == "priority"
    with pytest.raises(ApiError) as info:
        await operator.jobs.create(name="bad", schedule={"delay": 5, "asap": True}, task="t")
    assert info.value.status == 422 and (info.value.field or "").startswith("schedule")
    assert (await operator.jobs.list()).items == []


async def test_bad_or_missing_key_is_unauthorized(app: FastAPI) -> None:
    for key in ("cw_not-a-real-key", None):
        async with _client(app, key) as client:
            with pytest.raises(ApiError) as info:
                await client.jobs.list()
            assert (info.value.status, info.value.code) == (401, "unauthorized")


async def test_another_tenants_ids_are_not_found(
    app: FastAPI, admin: AsyncClient, operator: AsyncClient
) -> None:
    job = await operator.jobs.create(name="mine", schedule={"delay": 600}, task="t")
    other = await admin.tenants.create("other-team")
    async with _client(app, other["api_key"]) as stranger:
        for call in (
            stranger.jobs.get(job["id"]),
            stranger.jobs.cancel(job["id"]),
            stranger.runs.get(job["first_run_id"]),
        ):
            with pytest.raises(ApiError) as info:
                await call
            assert (info.value.status, info.value.code) == (404, "not_found")
    assert (await operator.jobs.get(job["id"]))["state"] == "active"


async def test_admin_acts_for_a_tenant_named_by_header(
    app: FastAPI, admin: AsyncClient, tenant: dict[str, Any], operator: AsyncClient
) -> None:
    job = await operator.jobs.create(name="seen-by-admin", schedule={"delay": 600}, task="t")
    with pytest.raises(ApiError) as info:
        await admin.jobs.list()
    assert info.value.code == "tenant_required" and info.value.field == "Cronwheel-Tenant"

    scoped = admin.with_tenant(tenant["id"])
    assert [j["id"] for j in (await scoped.jobs.list()).items] == [job["id"]]
    await scoped.aclose()  # a view: the shared connection pool stays open
    assert (await admin.tenants.get(tenant["id"]))["name"] == tenant["name"]

    async with _client(app, ADMIN_KEY, tenant=uuid.UUID(tenant["id"])) as direct:
        assert (await direct.jobs.get(job["id"]))["name"] == "seen-by-admin"


async def test_tenant_resource(app: FastAPI, admin: AsyncClient, tenant: dict[str, Any]) -> None:
    updated = await admin.tenants.update(tenant["id"], limits={"max_concurrent_runs": 7})
    assert updated["limits"]["max_concurrent_runs"] == 7
    assert tenant["id"] in [t["id"] for t in (await admin.tenants.list()).items]

    viewer = await admin.tenants.create_key(tenant["id"], role="viewer")
    assert viewer["role"] == "viewer" and viewer["api_key"].startswith("cw_")
    async with _client(app, viewer["api_key"]) as client:
        assert (await client.jobs.list()).items == []
        with pytest.raises(ApiError) as info:
            await client.jobs.create(name="x", schedule={"asap": True}, task="t")
        assert (info.value.status, info.value.code) == (403, "forbidden")

    async with _client(app, tenant["api_key"]) as operator:
        with pytest.raises(ApiError) as info:
            await operator.tenants.list()
        assert info.value.status == 403


async def test_delete_a_job_and_a_tenant(
    app: FastAPI, admin: AsyncClient, tenant: dict[str, Any], operator: AsyncClient
) -> None:
    job = await operator.jobs.create(name="gone", schedule={"delay": 60}, task="t")
    deleted = await operator.jobs.delete(job["id"], reason="tidy")
    assert (deleted["id"], deleted["deleted"], deleted["runs_deleted"]) == (job["id"], True, 1)
    with pytest.raises(ApiError) as info:
        await operator.jobs.get(job["id"])
    assert info.value.status == 404

    await operator.jobs.create(name="live", schedule={"delay": 60}, task="t")
    with pytest.raises(ApiError) as info:
        await admin.tenants.delete(tenant["id"])
    assert (info.value.status, info.value.code) == (409, "in_use")
    with pytest.raises(ApiError) as info:
        await operator.tenants.delete(tenant["id"], force=True)
    assert info.value.status == 403
    gone = await admin.tenants.delete(tenant["id"], force=True, reason="left")
    assert (gone["id"], gone["jobs_deleted"], gone["api_keys_deleted"]) == (tenant["id"], 1, 1)
    with pytest.raises(ApiError) as info:
        await operator.jobs.list()
    assert info.value.status == 401


async def test_every_tenant_limit_is_read_and_set(
    admin: AsyncClient, tenant: dict[str, Any]
) -> None:
    from cronwheel.domain.spec import TenantLimits

    every = {
        "max_concurrent_runs": 5,
        "max_dispatch_rate": 2.5,
        "dispatch_burst": 10,
        "max_pending_runs": 1000,
        "api_rate": 20.0,
        "api_burst": 40,
        "weight": 3.0,
    }
    assert set(every) == set(TenantLimits.model_fields)
    assert (await admin.tenants.update(tenant["id"], limits=every))["limits"] == every
    # A model sends the fields set, None among them: it clears that limit alone.
    out = await admin.tenants.update(tenant["id"], limits=TenantLimits(api_rate=None))
    assert out["limits"] == {**every, "api_rate": None}
    assert (await admin.tenants.get(tenant["id"]))["limits"] == out["limits"]
    with pytest.raises(ApiError) as info:
        await admin.tenants.update(tenant["id"], limits={"max_pending_runs": 0})
    assert (info.value.status, info.value.field) == (422, "limits.max_pending_runs")
    assert (await admin.tenants.get(tenant["id"]))["limits"] == out["limits"]


async def test_create_many_chunks_and_names_each_bad_job(operator: AsyncClient) -> None:
    """Bad jobs among good ones: the good ones are created (in chunks), each bad one
    gets its own error naming its field, and nothing else is lost."""
    jobs: list[dict[str, Any]] = [
        {"name": f"many-{i}", "schedule": {"delay": 60 + i}, "task": "t"} for i in range(7)
    ]
    jobs[1]["schedule"] = {"delay": -5}  # refused by the schema (422)
    jobs[4]["priority"] = 99  # refused by the schema too, in another chunk
    jobs[5]["schedule"] = {"at": "2000-01-01T00:00:00Z"}  # refused by the rules (400)
    done = await operator.jobs.create_many(jobs, chunk_size=3)
    assert sorted(done.errors) == [1, 4, 5]
    assert done.errors[1].field is not None and done.errors[1].field.startswith("schedule")
    assert done.errors[4].field == "priority"
    assert done.errors[5].field is not None and done.errors[5].field.startswith("schedule")
    created = [j for j in done.jobs if j is not None]
    assert [j["name"] for j in created] == ["many-0", "many-2", "many-3", "many-6"]
    assert all(j["first_run_id"] for j in created)
    stored = {j["name"] for j in (await operator.jobs.list(name_prefix="many-")).items}
    assert stored == {"many-0", "many-2", "many-3", "many-6"}
    with pytest.raises(ApiError) as info:
        done.raise_for_errors()
    assert info.value.field is not None and info.value.field.startswith("jobs.1.")


async def test_create_many_limit_fails_the_whole_chunk(
    admin: AsyncClient, operator: AsyncClient, tenant: dict[str, Any]
) -> None:
    """An error of no single job (max_pending_runs) is every job's of its chunk:
    nothing of that chunk is stored; the chunks before it are, and a later one that
    fits is too."""
    await admin.tenants.update(tenant["id"], limits={"max_pending_runs": 3})
    jobs = [{"name": f"lim-{i}", "schedule": {"delay": 60}, "task": "t"} for i in range(5)]
    done = await operator.jobs.create_many(jobs, chunk_size=2)
    assert [j is not None for j in done.jobs] == [True, True, False, False, True]
    assert {i: e.status for i, e in done.errors.items()} == {2: 429, 3: 429}
    assert done.errors[2].code == "limit_exceeded"


async def test_concurrent_single_creates_each_get_their_own_answer(
    app: FastAPI, operator: AsyncClient, admin: AsyncClient, tenant: dict[str, Any]
) -> None:
    """Creates of one tenant arriving together are stored together (group commit),
    and each request still gets its own answer or its own error: an idempotency
    conflict in the batch fails only the request that made it, a reused key returns
    the first job."""
    import asyncio

    first = await operator.jobs.create(
        name="keyed", schedule={"delay": 60}, task="t", idempotency_key="k-1"
    )

    async def one(i: int) -> Any:
        try:
            if i == 3:  # the same key with another request
                return await operator.jobs.create(
                    name="other", schedule={"delay": 60}, task="t", idempotency_key="k-1"
                )
            if i == 5:  # the same key with the same request
                return await operator.jobs.create(
                    name="keyed", schedule={"delay": 60}, task="t", idempotency_key="k-1"
                )
            return await operator.jobs.create(name=f"c-{i}", schedule={"delay": 60}, task="t")
        except ApiError as exc:
            return exc

    answers = await asyncio.gather(*(one(i) for i in range(12)))
    assert isinstance(answers[3], ApiError) and answers[3].code == "idempotency_conflict"
    assert answers[5]["id"] == first["id"]
    names = [a["name"] for i, a in enumerate(answers) if i not in (3, 5)]
    assert names == [f"c-{i}" for i in range(12) if i not in (3, 5)]
    assert len({a["id"] for i, a in enumerate(answers) if i != 3}) == 11
    stored = (await operator.jobs.list(name_prefix="c-", limit=100)).items
    assert len(stored) == 10


async def test_update_edits_a_job_conditionally(operator: AsyncClient) -> None:
    job = await operator.jobs.create(
        name="edit-me", schedule={"delay": 600}, task="t", payload={"n": 1}, tags=["a"]
    )
    edited = await operator.jobs.update(
        job["id"], if_version=job["version"], reason="more", payload={"n": 2}, tags=None
    )
    assert (edited["version"], edited["payload"], edited["tags"]) == (2, {"n": 2}, [])
    [run] = (await operator.runs.list(job_id=job["id"])).items
    assert run["payload"] == {"n": 2}  # the pending run follows
    with pytest.raises(PreconditionFailedError) as info:
        await operator.jobs.update(job["id"], if_version=1, priority=0)
    assert (info.value.status, info.value.current_version) == (412, 2)
    with pytest.raises(ApiError) as bad:
        await operator.jobs.update(job["id"], priority=9)
    assert (bad.value.status, bad.value.field) == (422, "priority")
    assert (await operator.jobs.get(job["id"]))["version"] == 2
