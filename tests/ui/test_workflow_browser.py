"""A workflow run in headless Chromium: its DAG drawn with each node's state, and a
dead-lettered node retried from the page until the whole run succeeds."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .conftest import Site
from .test_dashboard_browser import page as page  # the fixture: a fresh browser context
from .test_dashboard_browser import reload_until, sign_in, state_of

pytestmark = pytest.mark.xdist_group("ui-browser")


def _api(site: Site, method: str, path: str, **body: Any) -> dict[str, Any]:
    """The tenant's operator calling the workflows API."""
    answer = httpx.request(
        method,
        f"{site.url}{path}",
        json=body or None,
        headers={"Authorization": f"Bearer {site.tenant_a['api_key']}"},
        timeout=30,
    )
    assert answer.is_success, answer.text
    found: dict[str, Any] = answer.json()
    return found


def _drawn(page: Any) -> dict[str, str]:
    """The DAG's node boxes: name -> state class."""
    boxes = page.locator("svg.dag g.node[data-node]")
    return {
        boxes.nth(i).get_attribute("data-node"): boxes.nth(i).get_attribute("class")
        for i in range(boxes.count())
    }


def test_see_a_workflow_runs_dag_and_retry_its_failed_node(page: Any, site: Site) -> None:
    workflow = _api(
        site,
        "POST",
        "/v1/workflows",
        name="browser-etl",
        schedule={"interval": 3600},
        nodes=[
            {"name": "extract", "task": "ui.ok", "payload": {"who": "extract"}},
            # Gives up on its first series; the retried one succeeds.
            {
                "name": "flaky",
                "task": "ui.flaky",
                "after": ["extract"],
                "retry": {"max_attempts": 1},
            },
            {"name": "load", "task": "ui.ok", "after": ["flaky"]},
        ],
    )
    run = _api(site, "POST", f"/v1/workflows/{workflow['id']}/trigger")
    sign_in(page, site.tenant_a["api_key"])
    page.click("nav >> text=Workflows")
    page.click("text=browser-etl")
    assert page.locator("svg.dag g.node").count() == 3
    url = f"/ui/workflow-runs/{run['id']}"
    reload_until(page, url, lambda p: state_of(p) == "FAILED")
    assert _drawn(page) == {
        "extract": "node s-SUCCESS",
        "flaky": "node s-DEAD_LETTER",
        "load": "node s-SKIPPED",
    }
    assert "upstream" in page.inner_text("tr[data-node='load']")  # why it was skipped
    # Each box links to its node's run page.
    page.click("svg.dag g[data-node='extract']")
    page.wait_for_url("**/ui/runs/*")
    assert state_of(page) == "SUCCESS" and "all good for extract" in page.inner_text("#log")
    page.go_back()
    page.click("tr[data-node='flaky'] button:has-text('Retry')")
    assert page.inner_text(".notice") == "Retried"
    reload_until(page, url, lambda p: state_of(p) == "SUCCESS")
    assert set(_drawn(page).values()) == {"node s-SUCCESS"}
    assert page.locator("button:has-text('Retry')").count() == 0
