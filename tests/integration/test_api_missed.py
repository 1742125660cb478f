"""A job's ``lateness_budget`` and the ``missed_runs`` and ``stalled_schedule`` alerts
through the API, on both backends: the budget is shown, bounded and editable (an edit
rewrites no run); the alerts name the job, show to its tenant only, and clear when the
cause does."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from cronwheel.domain.model import ScheduleProbe
from cronwheel.scheduler import Clock, SchedulerNode
from cronwheel.settings import Settings
from cronwheel.store.schema import NUM_SHARDS

ALL = list(range(NUM_SHARDS))


async def test_the_budget_is_shown_bounded_and_editable(api: Any) -> None:
    t = await api.tenant()
    plain = await api.job(t)
    assert plain["lateness_budget"] == 30.0
    job = await api.job(t, name="tight", schedule={"cron": "0 * * * *"}, lateness_budget=12.5)
    assert job["lateness_budget"] == 12.5
    got = (await api.client.get(f"/v1/jobs/{job['id']}", headers=t.headers)).json()
    assert got["lateness_budget"] == 12.5

    before = await api.snapshot(t)
    for bad in (0, 0.5, 86_401, "soon", None, True):
        body = {"name": "x", "schedule": {"asap": True}, "task": "t", "lateness_budget": bad}
        r = await api.client.post("/v1/jobs", json=body, headers=t.headers)
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["error"]["field"] == "lateness_budget", r.text
    assert await api.snapshot(t) == before

    r = await api.client.patch(
        f"/v1/jobs/{job['id']}", json={"lateness_budget": 60}, headers=t.headers
    )
    assert r.status_code == 200, r.text
    assert (r.json()["lateness_budget"], r.json()["version"]) == (60.0, 2)
    # Read from the job by the missed-run check: its pending run is not rewritten.
    events = (await api.client.get(f"/v1/runs/{job['first_run_id']}", headers=t.headers)).json()[
        "events"
    ]
    assert "run.edited" not in [e["kind"] for e in events]
    r = await api.client.patch(
        f"/v1/jobs/{job['id']}", json={"lateness_budget": -1}, headers=t.headers
    )
    assert r.status_code == 422 and r.json()["error"]["field"] == "lateness_budget"
    r = await api.client.patch(
        f"/v1/jobs/{job['id']}", json={"lateness_budget": None}, headers=t.headers
    )
    assert r.json()["lateness_budget"] == 30.0  # back to the default


async def _alerts(api: Any, headers: dict[str, str]) -> list[dict[str, Any]]:
    r = await api.client.get("/v1/alerts", headers=headers)
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


async def test_missed_runs_are_alerted_per_job_until_dispatched(api: Any) -> None:
    t = await api.tenant()
    other = await api.tenant()
    job = await api.job(t, name="late-report", lateness_budget=5)
    again = await api.job(t, name="late-report-2", lateness_budget=5)
    later = await api.store.db_now() + timedelta(seconds=10)
    missed = await api.store.runs_mark_missed(shards=ALL, now=later)
    assert {m.job_id for m in missed} == {uuid.UUID(job["id"]), uuid.UUID(again["id"])}

    alerts = await _alerts(api, t.headers)
    assert sorted(a["kind"] for a in alerts) == ["missed_runs", "missed_runs"]
    [alert] = [a for a in alerts if a["job_id"] == job["id"]]
    assert alert["run_ids"] == [job["first_run_id"]] and alert["runs"] == 1
    assert "1 run of job 'late-report' not dispatched" in alert["message"]
    assert alert["tenant_id"] == t.id and alert["pool"] == "default"
    assert await _alerts(api, other.headers) == []
    admin = await _alerts(api, {**api.admin, "Cronwheel-Tenant": t.id})
    assert len(admin) == 2

    await api.fire()  # dispatched at last: the alert clears
    assert await _alerts(api, t.headers) == []


async def test_a_stalled_schedule_is_alerted_until_it_resumes(api: Any) -> None:
    t = await api.tenant()
    other = await api.tenant()
    job = await api.job(t, name="hourly", schedule={"interval": 3600})
    await api.store.runs_quarantine(
        run_ids=[uuid.UUID(job["first_run_id"])], step="fire", error="ValueError: x"
    )
    later = await api.store.db_now() + timedelta(hours=2)
    settings = Settings(window_seconds=30, shard_lease_ttl=10, dispatch_lead=0)
    node = SchedulerNode(
        api.store, settings, node_id="n", clock=Clock(lambda: later, offset=timedelta(0))
    )
    await node.run_once()
    alerts = await _alerts(api, t.headers)
    stalled = [a for a in alerts if a["kind"] == "stalled_schedule"]
    assert [a["job_id"] for a in stalled] == [job["id"]]
    assert "the schedule of job 'hourly' stalled" in stalled[0]["message"]
    assert not any(a["kind"] == "stalled_schedule" for a in await _alerts(api, other.headers))
    events = (await api.client.get(f"/v1/runs/{job['first_run_id']}", headers=t.headers)).json()
    assert events["state"] == "DEAD_LETTER"

    # Cancelling the job ends it: the next check clears the alert.
    r = await api.client.post(f"/v1/jobs/{job['id']}/cancel", headers=t.headers)
    assert r.status_code == 200, r.text
    node._next_missed_check = later - timedelta(days=1)
    await node.run_once()
    assert not any(a["kind"] == "stalled_schedule" for a in await _alerts(api, t.headers))


async def test_a_job_whose_schedule_cannot_be_read_is_left_alone(
    api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job whose stored schedule fails the check is isolated: the others are still
    marked."""
    t = await api.tenant()
    bad = await api.job(t, name="bad", schedule={"interval": 3600})
    good = await api.job(t, name="good", schedule={"interval": 3600})
    for j in (bad, good):
        await api.store.runs_quarantine(
            run_ids=[uuid.UUID(j["first_run_id"])], step="fire", error="x"
        )
    from cronwheel.scheduler import node as node_module

    real = node_module.stall_reason

    def reason(probe: ScheduleProbe, now: Any) -> str | None:
        if str(probe.job_id) == bad["id"]:
            raise ValueError("the stored schedule does not parse")
        return real(probe, now)

    monkeypatch.setattr(node_module, "stall_reason", reason)
    later = await api.store.db_now() + timedelta(hours=2)
    settings = Settings(window_seconds=30, shard_lease_ttl=10, dispatch_lead=0)
    node = SchedulerNode(
        api.store, settings, node_id="n", clock=Clock(lambda: later, offset=timedelta(0))
    )
    await node.run_once()
    stalled = [
        a["job_id"] for a in await _alerts(api, t.headers) if a["kind"] == "stalled_schedule"
    ]
    assert stalled == [good["id"]]
