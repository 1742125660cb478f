"""The workflow pages over the real app and store (both backends): the list and its
buttons, a workflow's DAG, a workflow run's DAG coloured by its nodes' states with the
cancel and retry buttons going through the API's routes; tenant scoping, a viewer's
missing buttons, CSRF, and a 1,000-node fan-out that stays a small page."""

from __future__ import annotations

import html
import re
import uuid
import xml.etree.ElementTree as ET
from typing import Any

from test_ui_pages import _browser, _csrf, sign_in

from conftest import Driver, TenantInfo
from cronwheel.domain.workflow import NODES_MAX

SVG = "{http://www.w3.org/2000/svg}"

# extract ─▶ clean ─┐
#        └─▶ geo  ──┴─▶ load
DIAMOND = [
    {"name": "extract", "task": "etl.extract"},
    {"name": "clean", "task": "etl.clean", "after": ["extract"]},
    {"name": "geo", "task": "etl.geo", "after": ["extract"]},
    {"name": "load", "task": "etl.load", "after": ["clean", "geo"], "trigger_rule": "all_done"},
]


async def _workflow(
    api: Driver, tenant: TenantInfo, *, nodes: list[dict[str, Any]] = DIAMOND, **fields: Any
) -> dict[str, Any]:
    body = {"name": "nightly-etl", "schedule": {"interval": 3600}, "nodes": nodes, **fields}
    r = await api.client.post("/v1/workflows", json=body, headers=tenant.headers)
    assert r.status_code == 201, r.text
    created: dict[str, Any] = r.json()
    return created


async def _trigger(api: Driver, tenant: TenantInfo, workflow_id: str) -> dict[str, Any]:
    """A workflow run, fired: its root nodes handed to the dispatcher."""
    r = await api.client.post(f"/v1/workflows/{workflow_id}/trigger", headers=tenant.headers)
    assert r.status_code == 201, r.text
    await api.fire()
    return await _workflow_run(api, tenant, r.json()["id"])


async def _workflow_run(api: Driver, tenant: TenantInfo, run_id: str) -> dict[str, Any]:
    r = await api.client.get(f"/v1/workflow-runs/{run_id}", headers=tenant.headers)
    assert r.status_code == 200, r.text
    found: dict[str, Any] = r.json()
    return found


def _dag(html: str) -> ET.Element:
    start = html.index('<svg class="dag"')
    return ET.fromstring(html[start : html.index("</svg>", start) + len("</svg>")])


def _drawn(html: str) -> dict[str, str]:
    """Each node box of the page's DAG: its name and its class."""
    return {
        g.get("data-node", ""): g.get("class", "")
        for g in _dag(html).iter(f"{SVG}g")
        if g.get("data-node")
    }


async def test_the_list_and_a_workflows_page_draw_its_nodes(api: Driver) -> None:
    tenant = await api.tenant()
    workflow = await _workflow(api, tenant)
    await api.job(tenant, name="plain-job")
    async with await _browser(api) as browser:
        await sign_in(browser, tenant.key)
        listed = await browser.get("/ui/workflows")
        assert listed.status_code == 200, listed.text
        assert "nightly-etl" in listed.text and "every hour" in listed.text
        assert "plain-job" not in listed.text  # a job is not a workflow
        assert f"/ui/workflows/{workflow['id']}/pause" in listed.text
        assert '<a href="/ui/workflows" class="current"' in listed.text  # the nav's link
        page = await browser.get(f"/ui/workflows/{workflow['id']}")
        assert page.status_code == 200, page.text
        assert _drawn(page.text) == {n["name"]: "node s-none" for n in DIAMOND}
        svg = _dag(page.text)
        assert len(svg.findall(f"{SVG}path")) == 4  # one per edge
        assert "etl.load · all_done" in page.text
        # Its first workflow run, scheduled: every node waits.
        assert f"/ui/workflow-runs/{workflow['first_run_id']}" in page.text
        assert "4 PENDING" in page.text
        first = await browser.get(f"/ui/workflow-runs/{workflow['first_run_id']}")
        assert first.status_code == 200, first.text
        assert set(_drawn(first.text).values()) == {"node s-PENDING"}
        assert not list(_dag(first.text).iter(f"{SVG}a"))  # no node run yet to link to


async def test_a_workflow_runs_page_colours_each_node_by_its_state(api: Driver) -> None:
    tenant = await api.tenant()
    workflow = await _workflow(api, tenant)
    run = await _trigger(api, tenant, workflow["id"])
    async with await _browser(api) as browser:
        await sign_in(browser, tenant.key)
        page = await browser.get(f"/ui/workflow-runs/{run['id']}")
        assert page.status_code == 200, page.text
        states = {n["node"]: n["state"] for n in run["nodes"]}
        assert states["load"] == "PENDING"
        assert _drawn(page.text) == {name: f"node s-{s}" for name, s in states.items()}
        links = {a.get("href") for a in _dag(page.text).iter(f"{SVG}a")}
        assert {f"/ui/runs/{n['run_id']}" for n in run["nodes"] if n["run_id"]} <= links
        assert "PENDING" in page.text and "Cancel workflow run" in page.text
        listed = await browser.get(f"/ui/workflows/{workflow['id']}")
        assert f"/ui/workflow-runs/{run['id']}" in listed.text
        for path, status in (
            (f"/ui/workflow-runs/{run['id']}?state=NOPE", 422),
            (f"/ui/workflow-runs/{run['id']}?state=PENDING", 200),
            ("/ui/workflow-runs/not-an-id", 404),
            (f"/ui/workflow-runs/{uuid.uuid4()}", 404),
            (f"/ui/workflows/{uuid.uuid4()}", 404),
        ):
            assert (await browser.get(path)).status_code == status, path


async def test_cancel_a_workflow_run_and_retry_a_node_from_its_page(api: Driver) -> None:
    tenant = await api.tenant()
    workflow = await _workflow(api, tenant)
    run = await _trigger(api, tenant, workflow["id"])
    url = f"/ui/workflow-runs/{run['id']}"
    async with await _browser(api) as browser:
        await sign_in(browser, tenant.key)
        csrf = _csrf((await browser.get(url)).text)
        r = await browser.post(f"{url}/cancel", data={})  # no CSRF token: refused
        assert r.status_code == 403
        assert (await _workflow_run(api, tenant, run["id"]))["state"] == run["state"]
        r = await browser.post(f"{url}/cancel", data={"csrf": csrf})
        assert r.status_code == 303 and r.headers["location"] == f"{url}?notice=Cancelled"
        cancelled = await _workflow_run(api, tenant, run["id"])
        assert cancelled["state"] == "CANCELLED"
        page = await browser.get(r.headers["location"])
        assert "Cancelled" in page.text and "Cancel workflow run" not in page.text
        assert _drawn(page.text)["load"] == "node s-CANCELLED"
        # Retry buttons for extract and load (all_done: its upstream nodes have ended),
        # not for clean and geo: their rule cannot hold until extract has run again.
        assert page.text.count('name="node" value=') == 2
        assert 'name="node" value="clean"' not in page.text
        r = await browser.post(f"{url}/retry", data={"csrf": csrf, "node": "extract"})
        assert r.status_code == 303 and r.headers["location"] == f"{url}?notice=Retried"
        retried = await _workflow_run(api, tenant, run["id"])
        by_name = {n["node"]: n["state"] for n in retried["nodes"]}
        assert by_name["extract"] == "SCHEDULED" and by_name["load"] == "PENDING"
        assert retried["state"] == "RUNNING"
        # A node that is not failed or cancelled any more: the API's 409, as a page.
        r = await browser.post(f"{url}/retry", data={"csrf": csrf, "node": "extract"})
        assert r.status_code == 409
        r = await browser.post(f"{url}/retry", data={"csrf": csrf})
        assert r.status_code == 422


async def test_pause_resume_and_trigger_from_the_list(api: Driver) -> None:
    tenant = await api.tenant()
    workflow = await _workflow(api, tenant)
    base = f"/ui/workflows/{workflow['id']}"
    async with await _browser(api) as browser:
        await sign_in(browser, tenant.key)
        csrf = _csrf((await browser.get("/ui/workflows")).text)
        r = await browser.post(f"{base}/pause", data={"csrf": csrf, "back": "list"})
        assert r.status_code == 303 and r.headers["location"] == "/ui/workflows?notice=Paused"
        listed = await browser.get(r.headers["location"])
        assert f"{base}/resume" in listed.text and f"{base}/pause" not in listed.text
        r = await browser.post(f"{base}/resume", data={"csrf": csrf})
        assert r.headers["location"] == f"{base}?notice=Resumed"
        got = await api.client.get(f"/v1/workflows/{workflow['id']}", headers=tenant.headers)
        assert got.json()["state"] == "active"
        r = await browser.post(f"{base}/trigger", data={"csrf": csrf, "back": "list"})
        assert r.status_code == 303
        location = r.headers["location"]
        assert location.startswith("/ui/workflow-runs/") and location.endswith("?notice=Triggered")
        run_id = location.split("/")[-1].split("?")[0]
        assert (await _workflow_run(api, tenant, run_id))["workflow_id"] == workflow["id"]
        r = await browser.post(f"{base}/cancel", data={"csrf": csrf})
        assert r.headers["location"] == f"{base}?notice=Cancelled"
        r = await browser.post(f"{base}/pause", data={"csrf": csrf})
        assert r.status_code == 409  # cancelled: the API's answer, as a page
        r = await browser.post(f"{base}/explode", data={"csrf": csrf})
        assert r.status_code == 422


async def test_another_tenants_workflow_and_its_runs_are_not_found(api: Driver) -> None:
    a, b = await api.tenant(), await api.tenant()
    workflow = await _workflow(api, a, name="a-secret-flow")
    run = await _trigger(api, a, workflow["id"])
    async with await _browser(api) as browser:
        await sign_in(browser, b.key)
        for path in (f"/ui/workflows/{workflow['id']}", f"/ui/workflow-runs/{run['id']}"):
            assert (await browser.get(path)).status_code == 404, path
        csrf = _csrf((await browser.get("/ui/workflows")).text)
        for path, data in (
            (f"/ui/workflows/{workflow['id']}/pause", {}),
            (f"/ui/workflows/{workflow['id']}/trigger", {}),
            (f"/ui/workflow-runs/{run['id']}/cancel", {}),
            (f"/ui/workflow-runs/{run['id']}/retry", {"node": "extract"}),
        ):
            r = await browser.post(path, data={"csrf": csrf, **data})
            assert r.status_code == 404, (path, r.status_code)
        assert "a-secret-flow" not in (await browser.get("/ui/workflows")).text
    assert (await _workflow_run(api, a, run["id"]))["state"] == run["state"]


async def test_a_viewer_sees_no_buttons_and_may_not_post(api: Driver) -> None:
    tenant = await api.tenant()
    viewer = (await api.key(tenant, "viewer"))["Authorization"].split()[1]
    workflow = await _workflow(api, tenant)
    run = await _trigger(api, tenant, workflow["id"])
    await api.client.post(f"/v1/workflow-runs/{run['id']}/cancel", headers=tenant.headers)
    async with await _browser(api) as browser:
        await sign_in(browser, viewer)
        for path in (
            "/ui/workflows",
            f"/ui/workflows/{workflow['id']}",
            f"/ui/workflow-runs/{run['id']}",
        ):
            page = await browser.get(path)
            assert page.status_code == 200, page.text
            for action in ("/pause", "/resume", "/trigger", "/cancel", "/retry"):
                assert f'{action}"' not in page.text, (path, action)
            assert "Retry</button>" not in page.text
        csrf = _csrf(page.text)
        r = await browser.post(
            f"/ui/workflow-runs/{run['id']}/retry", data={"csrf": csrf, "node": "extract"}
        )
        assert r.status_code == 403
        r = await browser.post(f"/ui/workflows/{workflow['id']}/pause", data={"csrf": csrf})
        assert r.status_code == 403
    assert (await _workflow_run(api, tenant, run["id"]))["state"] == "CANCELLED"


async def test_a_thousand_node_fan_out_is_a_small_page(api: Driver) -> None:
    tenant = await api.tenant()
    fan = [f"shard-{i:04d}" for i in range(1000)]
    nodes = [
        {"name": "split", "task": "t.split"},
        *({"name": name, "task": "t.shard", "after": ["split"]} for name in fan),
        {"name": "merge", "task": "t.merge", "after": fan},
    ]
    workflow = await _workflow(api, tenant, nodes=nodes, name="fan-out")
    run = await _trigger(api, tenant, workflow["id"])
    async with await _browser(api) as browser:
        await sign_in(browser, tenant.key)
        page = await browser.get(f"/ui/workflow-runs/{run['id']}")
        assert page.status_code == 200, page.text
        assert len(page.content) < 150_000
        drawn = _drawn(page.text)
        assert len(drawn) <= 14 and {"split", "merge"} <= drawn.keys()
        assert "988 more nodes" in page.text or "989 more nodes" in page.text
        assert "Nodes 1 to 200 of 1002" in page.text
        pending = await browser.get(f"/ui/workflow-runs/{run['id']}?state=PENDING")
        assert pending.text.count("<tr data-node=") == 200
        # Every node can be reached: page after page, or by a part of its name.
        seen: list[str] = []
        path = f"/ui/workflow-runs/{run['id']}?state=PENDING"
        while path:
            listed = await browser.get(path)
            assert listed.status_code == 200, listed.text
            seen += re.findall(r'<tr data-node="([^"]+)"', listed.text)
            more = re.search(r'<a href="([^"]+)">Next \d+ »</a>', listed.text)
            path = html.unescape(more.group(1)) if more else ""
        assert len(seen) == len(set(seen)) == 1001 and set(fan) <= set(seen)
        assert "Nodes 1001 to 1001 of 1001" in listed.text and "« Previous 200" in listed.text
        named = await browser.get(f"/ui/workflow-runs/{run['id']}?name=shard-09")
        assert re.findall(r'<tr data-node="([^"]+)"', named.text) == fan[900:1000]
        for bad in ("start=-1", "start=x", f"start={NODES_MAX + 1}", "name=" + "n" * 101):
            refused = await browser.get(f"/ui/workflow-runs/{run['id']}?{bad}")
            assert refused.status_code == 422, bad
        beyond = await browser.get(f"/ui/workflow-runs/{run['id']}?start=1500")
        assert beyond.status_code == 200 and "No node run from number 1501" in beyond.text
        definition = await browser.get(f"/ui/workflows/{workflow['id']}")
        assert len(_drawn(definition.text)) <= 14
        assert len(definition.content) < 60_000


async def test_runs_lead_to_their_workflow_and_jobs_leave_workflows_out(api: Driver) -> None:
    tenant = await api.tenant()
    workflow = await _workflow(api, tenant)
    await api.job(tenant, name="plain-job")
    run = await _trigger(api, tenant, workflow["id"])
    extract = run["nodes"][0]["run_id"]
    async with await _browser(api) as browser:
        await sign_in(browser, tenant.key)
        jobs = await browser.get("/ui/jobs")
        assert "plain-job" in jobs.text and "nightly-etl" not in jobs.text
        # The workflow run's own run page is its DAG's.
        moved = await browser.get(f"/ui/runs/{run['id']}")
        assert moved.status_code == 303, moved.text
        assert moved.headers["location"] == f"/ui/workflow-runs/{run['id']}"
        node = await browser.get(f"/ui/runs/{extract}")
        assert node.status_code == 200, node.text
        assert f'href="/ui/workflow-runs/{run["id"]}"' in node.text
        assert "node <code>extract</code>" in node.text
        # In the runs list, a node run names its node and leads to its workflow run.
        listed = await browser.get("/ui/runs")
        assert listed.status_code == 200, listed.text
        row = listed.text[listed.text.index(f'href="/ui/runs/{extract}"') :]
        row = row[: row.index("</tr>")]
        assert f'href="/ui/workflow-runs/{run["id"]}"' in row
        assert "node <code>extract</code>" in row
