"""Spread through the API (both backends): a job shows its spread, its preview lists
each occurrence's spread instant beside its due instant, its first run fires at its
spread instant, and a spread that does not fit is refused with 422, nothing written."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from answers import error_of, parse

from cronwheel.timing.spread import spread_instant


async def test_a_job_shows_its_spread_and_its_preview_the_spread_instants(api) -> None:
    t = await api.tenant()
    job = await api.job(t, name="hourly", schedule={"cron": "0 * * * *"}, spread=600.0004)
    assert job["spread"] == 600.0  # whole milliseconds
    job_id = uuid.UUID(job["id"])
    r = await api.client.get(f"/v1/jobs/{job_id}/preview", params={"count": 24}, headers=t.headers)
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert len(items) == 24
    offsets = set()
    for item in items:
        due, fire = parse(item["due_at"]), parse(item["fire_at"])
        assert fire == spread_instant(job_id, due, 600)
        assert due <= fire < due + timedelta(seconds=600)
        offsets.add(fire - due)
    assert len(offsets) > 20  # each occurrence its own offset
    assert parse(items[0]["due_at"]) == parse(job["next_due_at"])

    run = (await api.client.get(f"/v1/runs/{job['first_run_id']}", headers=t.headers)).json()
    assert parse(run["due_at"]) == parse(items[0]["due_at"])
    assert parse(run["fire_at"]) == parse(items[0]["fire_at"])

    plain = await api.job(t, name="plain", schedule={"cron": "0 * * * *"})
    assert plain["spread"] == 0
    r = await api.client.get(f"/v1/jobs/{plain['id']}/preview", headers=t.headers)
    assert all(i["fire_at"] == i["due_at"] for i in r.json()["items"])


async def test_a_one_off_job_previews_its_spread_instant(api) -> None:
    t = await api.tenant()
    job = await api.job(t, name="soon", schedule={"delay": 3600}, spread=900)
    r = await api.client.get(f"/v1/jobs/{job['id']}/preview", headers=t.headers)
    [item] = r.json()["items"]
    due = parse(item["due_at"])
    assert parse(item["fire_at"]) == spread_instant(uuid.UUID(job["id"]), due, 900)
    assert due < parse(item["fire_at"]) < due + timedelta(seconds=900)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"spread": -1}, ("greater than or equal to 0",)),
        ({"spread": 86400.5}, ("less than or equal to 86400",)),
        ({"spread": "ten"}, ("number",)),
        ({"spread": 60, "schedule": {"interval": 60}}, ("shortest interval", "60")),
        ({"spread": 300, "schedule": {"cron": "*/5 * * * *"}}, ("shortest interval", "300")),
        ({"spread": 3600, "schedule": {"cron": "0 * * * *"}}, ("shortest interval",)),
    ],
)
async def test_a_spread_that_does_not_fit_is_refused(
    api, fields: dict[str, Any], words: tuple[str, ...]
) -> None:
    t = await api.tenant()
    before = await api.snapshot(t)
    body = {"name": "bad", "schedule": {"cron": "0 0 * * *"}, "task": "t", **fields}
    for path, payload, field in (
        ("/v1/jobs", body, "spread"),
        (
            "/v1/jobs/batch",
            {"jobs": [{"name": "ok", "schedule": {"asap": True}, "task": "t"}, body]},
            "jobs.1.spread",
        ),
    ):
        r = await api.client.post(path, json=payload, headers=t.headers)
        assert r.status_code == 422, r.text
        err = error_of(r)
        assert err["field"] == field and all(w in err["message"] for w in words), err
    assert await api.snapshot(t) == before
