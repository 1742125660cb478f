"""Quarantined runs through the API, on both backends: the run shows the error and
when it was taken out, ``GET /v1/alerts`` names its job (its tenant's key only), the
``cronwheel_runs_quarantined`` gauge counts it, and a redrive clears all three."""

from __future__ import annotations

import re
import uuid
from typing import Any

from cronwheel.store import Store


def _gauge(metrics_text: str) -> float:
    match = re.search(r"^cronwheel_runs_quarantined (\S+)$", metrics_text, re.MULTILINE)
    assert match is not None, "the gauge is not exported"
    return float(match.group(1))


async def _quarantined_run(api: Any, store: Store) -> tuple[Any, dict[str, Any], str]:
    t = await api.tenant()
    job = await api.job(t, name="nightly", schedule={"asap": True})
    run_id = job["first_run_id"]
    await api.fire()
    # As a scheduler node does when a step of its pass fails on this run alone.
    done = await store.runs_quarantine(
        run_ids=[uuid.UUID(run_id)],
        step="fire",
        error="InvalidScheduleError: minute field '61' is out of range 0-59",
        actor="node-a",
    )
    assert done == [uuid.UUID(run_id)]
    return t, job, run_id


async def test_a_quarantined_run_is_shown_alerted_and_counted(api: Any, store: Store) -> None:
    t, job, run_id = await _quarantined_run(api, store)
    other = await api.tenant()
    api.app.state.api.runs_by_state.max_age = 0  # every scrape refreshes

    run = (await api.client.get(f"/v1/runs/{run_id}", headers=t.headers)).json()
    assert run["state"] == "DEAD_LETTER"
    assert run["quarantined_at"] is not None
    assert run["reason"].startswith("quarantined: the scheduler failed firing it")
    assert "out of range" in run["last_error"]
    [event] = [e for e in run["events"] if e["to_state"] == "DEAD_LETTER"]
    assert event["from_state"] == "DISPATCHED"
    assert event["data"]["quarantined"] is True and event["data"]["step"] == "fire"
    dead = (await api.client.get("/v1/dead-letters", headers=t.headers)).json()
    assert [r["id"] for r in dead["items"]] == [run_id]

    [alert] = (await api.client.get("/v1/alerts", headers=t.headers)).json()["items"]
    assert alert["kind"] == "quarantined_runs"
    assert alert["job_id"] == job["id"]
    assert alert["run_ids"] == [run_id]
    assert alert["runs"] == 1
    assert "1 run of job 'nightly' quarantined" in alert["message"]
    assert (await api.client.get("/v1/alerts", headers=other.headers)).json()["items"] == []
    admin = (await api.client.get("/v1/alerts", headers=api.admin)).json()["items"]
    assert [a["job_id"] for a in admin] == [job["id"]]
    assert _gauge((await api.client.get("/metrics", headers=api.admin)).text) == 1.0

    r = await api.client.post(f"/v1/runs/{run_id}/redrive", headers=t.headers)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "SCHEDULED"
    assert r.json()["quarantined_at"] is None
    assert (await api.client.get("/v1/alerts", headers=t.headers)).json()["items"] == []
    assert _gauge((await api.client.get("/metrics", headers=api.admin)).text) == 0.0


async def test_cancelling_the_job_clears_its_alert(api: Any, store: Store) -> None:
    t, job, _run_id = await _quarantined_run(api, store)
    cron = await api.job(t, name="hourly", schedule={"cron": "0 * * * *"})
    await store.runs_quarantine(
        run_ids=[uuid.UUID(cron["first_run_id"])], step="fire", error="ValueError: x"
    )
    kinds = {
        a["job_id"] for a in (await api.client.get("/v1/alerts", headers=t.headers)).json()["items"]
    }
    assert kinds == {job["id"], cron["id"]}
    r = await api.client.post(f"/v1/jobs/{cron['id']}/cancel", headers=t.headers)
    assert r.status_code == 200, r.text
    kinds = {
        a["job_id"] for a in (await api.client.get("/v1/alerts", headers=t.headers)).json()["items"]
    }
    assert kinds == {job["id"]}
