"""Every metric of docs/metrics.md is fed by the code path it names: each test causes
the event through the API (or a scheduler node) and reads the change off ``/metrics``,
on both backends. The Grafana dashboard uses only metric names the exposition has."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from cronwheel.metrics import TaskLabels
from cronwheel.scheduler import Clock, SchedulerNode
from cronwheel.settings import Settings

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "cronwheel.json"
METRICS_DOC = Path(__file__).parents[2] / "docs" / "metrics.md"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def scrape(api: Any) -> Samples:
    api.app.state.api.runs_by_state.max_age = 0  # every scrape refreshes the gauges
    r = await api.client.get("/metrics", headers=api.admin)
    assert r.status_code == 200, r.text
    return samples(r.text)


def value(scrape: Samples, name: str, **labels: str) -> float:
    return scrape.get((name, tuple(sorted(labels.items()))), 0.0)


async def _leased(api: Any, worker: dict[str, str], wid: str, n: int) -> list[dict[str, Any]]:
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={"max": n}, headers=worker)
    assert r.status_code == 200, r.text
    got: list[dict[str, Any]] = r.json()["attempts"]
    return got


async def test_executions_retries_dead_letters_and_expiries_are_counted(api: Any) -> None:
    t = await api.tenant()
    for name, task, tries in (
        ("ok", "report.build", 1),
        ("retried", "report.send", 3),
        ("dead", "report.send", 1),
        ("lost", "report.lost", 2),
    ):
        retry = {"max_attempts": tries}
        await api.job(t, name=name, task=task, payload={"name": name}, retry=retry)
    await api.fire()
    worker = await api.key(t, "worker")
    wid = (await api.client.post("/v1/workers", json={}, headers=worker)).json()["worker_id"]
    before = await scrape(api)
    assert value(before, "cronwheel_workers_live", pool="default") >= 1
    assert value(before, "cronwheel_ready_queue", pool="default") >= 4
    leased = {a["payload"]["name"]: a for a in await _leased(api, worker, wid, 4)}
    assert set(leased) == {"ok", "retried", "dead", "lost"}

    def done(name: str, verb: str, **body: Any) -> Any:
        a = leased[name]
        return api.client.post(
            f"/v1/attempts/{a['attempt_id']}/{verb}",
            json={"fencing_token": a["fencing_token"], **body},
            headers=worker,
        )

    assert (await done("ok", "complete", result=1)).status_code == 200
    assert (await done("retried", "fail", error="boom")).status_code == 200
    assert (await done("dead", "fail", error="boom")).status_code == 200
    # The worker running "lost" stops heartbeating: the sweep ends its attempt LOST.
    ended = await api.store.attempts_expire(now=await api.store.db_now() + timedelta(seconds=100))
    assert ended == 1

    after = await scrape(api)

    def grew(name: str, by: float = 1, **labels: str) -> None:
        assert value(after, name, **labels) == value(before, name, **labels) + by, (name, labels)

    grew(
        "cronwheel_execution_duration_seconds_count",
        tenant=t.name,
        task="report.build",
        outcome="succeeded",
    )
    grew(
        "cronwheel_execution_duration_seconds_count",
        by=2,
        tenant=t.name,
        task="report.send",
        outcome="failed",
    )
    grew("cronwheel_retries_total", by=2, tenant=t.name)  # "retried", and "lost" once
    grew("cronwheel_dead_letters_total", tenant=t.name)
    grew("cronwheel_lease_expiries_total", reason="lost")
    grew("cronwheel_start_lateness_seconds_count", by=4, tenant=t.name, priority="P2")
    assert (
        value(after, "cronwheel_ready_queue", pool="default")
        == value(before, "cronwheel_ready_queue", pool="default") - 4
    )
    # api.fire() took every shard for one node.
    assert value(after, "cronwheel_shards", state="owned") == 256
    assert value(after, "cronwheel_shards", state="orphaned") == 0
    assert value(after, "cronwheel_shard_owners") == 1
    # Never a job or run id as a label value.
    ids = {a["run_id"] for a in leased.values()} | {a["job_id"] for a in leased.values()}
    assert not any(v in ids for _, labels in after for _, v in labels)


async def test_missed_runs_are_counted_by_tenant(api: Any) -> None:
    t = await api.tenant()
    await api.job(t, name="late", lateness_budget=1)
    before = await scrape(api)
    # A scheduler node that comes up a minute late: the run was missed, then fired.
    later = await api.store.db_now() + timedelta(seconds=60)
    settings = Settings(window_seconds=30, shard_lease_ttl=10, dispatch_lead=0)
    node = SchedulerNode(
        api.store, settings, node_id="late-node", clock=Clock(lambda: later, offset=timedelta(0))
    )
    assert await node.run_once() == 1
    after = await scrape(api)
    name = "cronwheel_runs_missed_total"
    assert value(after, name, tenant=t.name) == value(before, name, tenant=t.name) + 1
    assert (
        value(after, "cronwheel_dispatch_lateness_seconds_count", tenant=t.name, priority="P2") == 1
    )


def test_the_task_label_is_capped_per_process() -> None:
    labels = TaskLabels(limit=2)
    assert [labels.label(t) for t in ("a", "b", "c", "a", None)] == [
        "a",
        "b",
        "other",
        "a",
        "webhook",
    ]


def _dashboard_metrics() -> set[str]:
    model = json.loads(DASHBOARD.read_text())
    exprs = [
        target["expr"]
        for panel in model["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    assert exprs, "the dashboard has no queries"
    names = set()
    for expr in exprs:
        names |= set(re.findall(r"\b(cronwheel_[a-z_]+)", expr))
    return names


async def test_the_dashboard_uses_only_exported_metrics(api: Any) -> None:
    model = json.loads(DASHBOARD.read_text())
    assert model["title"] and isinstance(model["panels"], list) and model["schemaVersion"] > 0
    assert len({p["id"] for p in model["panels"]}) == len(model["panels"])
    for panel in model["panels"]:
        assert {"id", "type", "title", "gridPos"} <= set(panel), panel.get("title")
    text = (await api.client.get("/metrics", headers=api.admin)).text
    # The names the exposition declares (a labelled metric not observed yet has its
    # HELP and TYPE lines, no sample) and those of its samples.
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    exported = set()
    for family in text_string_to_metric_families(text):
        exported.add(family.name)
        exported |= {family.name + end for end in suffixes.get(family.type, ())}
        exported |= {s.name for s in family.samples}
    assert "cronwheel_runs_missed_total" in exported
    used = _dashboard_metrics()
    assert used - exported == set()
    # Every metric the dashboard shows is documented.
    doc = METRICS_DOC.read_text()
    for name in used:
        base = re.sub(r"_(total|bucket|count|sum)$", "", name)
        assert f"`{base}`" in doc or f"`{name}`" in doc, name


def test_every_metric_is_documented() -> None:
    from cronwheel.metrics import REGISTRY

    doc = METRICS_DOC.read_text()
    for family in REGISTRY.collect():
        exposed = f"{family.name}_total" if family.type == "counter" else family.name
        assert f"`{exposed}`" in doc, exposed
