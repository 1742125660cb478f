"""The blocking Client against a real server (uvicorn on a free port, on its own
thread), on both backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cronwheel import ApiError, Client, PreconditionFailedError
from cronwheel.runtime import BackgroundRuntime, Runtime
from cronwheel.settings import Settings

ADMIN_KEY = "sync-client-admin-key"


@pytest.fixture
def server(store_url: str, tmp_path: Path) -> Iterator[BackgroundRuntime]:
    settings = Settings(database_url=store_url, data_dir=tmp_path, port=0, admin_key=ADMIN_KEY)
    with BackgroundRuntime(Runtime(settings, scheduler=False)) as running:
        yield running


def test_blocking_client_end_to_end(server: BackgroundRuntime) -> None:
    with Client(server.url, api_key=ADMIN_KEY) as admin:
        tenant = admin.tenants.create("sync-team")
        key = admin.tenants.create_key(tenant["id"], role="operator")["api_key"]
        scoped = admin.with_tenant(tenant["id"])

    with Client(server.url + "/", api_key=key) as client:
        ids = [
            client.jobs.create(
                name=f"job-{i}", schedule={"delay": 300}, task="t", payload={"i": i}
            )["id"]
            for i in range(3)
        ]
        assert [j["id"] for j in client.jobs.iter(page_size=2)] == ids[::-1]
        assert client.jobs.list(name_prefix="job-1").items[0]["id"] == ids[1]

        cancelled = client.jobs.cancel(ids[0], reason="no")
        assert cancelled["state"] == "cancelled"
        states = {r["job_id"]: r["state"] for r in client.runs.iter()}
        assert states == {ids[0]: "CANCELLED", ids[1]: "SCHEDULED", ids[2]: "SCHEDULED"}
        assert [r["job_id"] for r in client.runs.list(state="CANCELLED").items] == [ids[0]]
        tagged = client.jobs.create(
            name="tagged", schedule={"delay": 900}, task="t", pool="gpu", tags=["a", "b,c"]
        )
        assert [r["id"] for r in client.runs.iter(tag=["a", "b,c"], page_size=1)] == [
            tagged["first_run_id"]
        ]
        assert [r["id"] for r in client.runs.list(pool="gpu", tag="a").items] == [
            tagged["first_run_id"]
        ]
        assert client.runs.list(pool="gpu", tag=["a", "b"]).items == []
        events = list(client.runs.iter_events(tagged["first_run_id"], page_size=1))
        assert [e["to_state"] for e in events] == ["SCHEDULED"]
        assert client.runs.events(tagged["first_run_id"]).next_cursor is None

        with pytest.raises(ApiError) as info:
            client.runs.get("not-a-run")
        assert info.value.status in (404, 422)

    # the view's connections closed with its parent: it fails cleanly, not silently
    with pytest.raises(RuntimeError):
        scoped.jobs.list()


def test_blocking_client_bad_key(server: BackgroundRuntime) -> None:
    with Client(server.url, api_key="cw_wrong") as client, pytest.raises(ApiError) as info:
        client.tenants.list()
    assert (info.value.status, info.value.code) == (401, "unauthorized")


def test_blocking_client_deletes(server: BackgroundRuntime) -> None:
    with Client(server.url, api_key=ADMIN_KEY) as admin:
        tenant = admin.tenants.create("sync-deleted")
        with Client(server.url, api_key=tenant["api_key"]) as client:
            job = client.jobs.create(name="j", schedule={"delay": 300}, task="t")
            assert client.jobs.delete(job["id"], force=True)["runs_deleted"] == 1
            with pytest.raises(ApiError) as info:
                client.jobs.delete(job["id"])
            assert info.value.status == 404
        out = admin.tenants.delete(tenant["id"], reason="done")
        assert (out["name"], out["jobs_deleted"], out["api_keys_deleted"]) == ("sync-deleted", 0, 1)
        with pytest.raises(ApiError) as info:
            admin.tenants.get(tenant["id"])
        assert info.value.status == 404


def test_blocking_create_many(server: BackgroundRuntime) -> None:
    """The blocking client's create_many answers as the asyncio one's does."""
    with Client(server.url, api_key=ADMIN_KEY) as admin:
        tenant = admin.tenants.create("sync-many")
    with Client(server.url, api_key=tenant["api_key"]) as client:
        jobs = [{"name": f"s-{i}", "schedule": {"delay": 60}, "task": "t"} for i in range(5)]
        jobs[2]["schedule"] = {"delay": -1}
        done = client.jobs.create_many(jobs, chunk_size=2)
        assert sorted(done.errors) == [2]
        assert [j is None for j in done.jobs] == [False, False, True, False, False]
        assert done.errors[2].status == 422
        assert len(client.jobs.list(name_prefix="s-").items) == 4


def test_blocking_update(server: BackgroundRuntime) -> None:
    with Client(server.url, api_key=ADMIN_KEY) as admin:
        tenant = admin.tenants.create("sync-edit")
    with Client(server.url, api_key=tenant["api_key"]) as client:
        job = client.jobs.create(name="e", schedule={"cron": "0 0 1 1 *"}, task="t")
        edited = client.jobs.update(
            job["id"], if_version=1, schedule={"cron": "0 6 * * *", "timezone": "Asia/Tokyo"}
        )
        assert edited["schedule"]["timezone"] == "Asia/Tokyo" and edited["version"] == 2
        assert edited["next_due_at"] != job["next_due_at"]
        with pytest.raises(PreconditionFailedError) as info:
            client.jobs.update(job["id"], if_version=1, name="late")
        assert info.value.current_version == 2
        client.jobs.cancel(job["id"])
        with pytest.raises(ApiError) as over:
            client.jobs.update(job["id"], name="late")
        assert (over.value.status, over.value.code) == (409, "illegal_transition")
