"""The dashboard as a person uses it, in headless Chromium: sign in, watch a run
succeed, follow a running run's log live, pause and resume a job, read a failed run's
log, redrive a dead letter; and
what must not work — another tenant's pages, a viewer's buttons, a form without its
CSRF token."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .conftest import CSRF, Site, gate

# One process runs them all: one server, worker and browser for the module.
pytestmark = pytest.mark.xdist_group("ui-browser")

_WAIT = 30.0  # seconds: a generous bound on the slowest CI; the checks end far sooner


@pytest.fixture
def page(browser: Any, site: Site) -> Iterator[Any]:
    context = browser.new_context(base_url=site.url)
    context.set_default_timeout(_WAIT * 1000)
    try:
        yield context.new_page()
    finally:
        context.close()


def sign_in(page: Any, key: str) -> None:
    page.goto("/ui/sign-in")
    page.fill("#api_key", key)
    page.click("button:has-text('Sign in')")
    page.wait_for_selector("header nav")


def reload_until(page: Any, url: str, done: Callable[[Any], bool]) -> None:
    """Open ``url`` again until ``done(page)``: the server's state changes on its own."""
    deadline = time.monotonic() + _WAIT
    while True:
        page.goto(url)
        if done(page):
            return
        assert time.monotonic() < deadline, f"{url} never got there: {page.inner_text('main')}"
        page.wait_for_timeout(250)


def state_of(page: Any) -> str:
    return str(page.inner_text("h1 .badge")).strip()


def test_sign_in_and_see_a_job_fire_and_its_run_succeed(page: Any, site: Site) -> None:
    job = site.operator.jobs.create(
        name="say-hello", schedule={"asap": True}, task="ui.ok", payload={"who": "the browser"}
    )
    sign_in(page, site.tenant_a["api_key"])
    assert site.tenant_a["name"] in page.inner_text("header")
    page.click("nav >> text=Jobs")
    page.click("text=say-hello")
    assert "once, as soon as possible" in page.inner_text("main").lower()
    run_url = f"/ui/runs/{job['first_run_id']}"
    reload_until(page, run_url, lambda p: state_of(p) == "SUCCESS")
    assert "all good for the browser" in page.inner_text("#log")
    assert page.locator("svg.timeline rect.a-SUCCEEDED").count() == 1
    page.click("nav >> text=Overview")
    assert page.locator("svg.chart").count() == 3


def test_a_running_runs_log_follows_live_without_a_reload(page: Any, site: Site) -> None:
    gates = [f"follow-{uuid.uuid4().hex[:8]}-{i}" for i in (1, 2)]
    job = site.operator.jobs.create(
        name="followed", schedule={"asap": True}, task="ui.follow", payload={"gates": gates}
    )
    try:
        sign_in(page, site.tenant_a["api_key"])
        run_url = f"/ui/runs/{job['first_run_id']}"
        reload_until(
            page,
            run_url,
            lambda p: state_of(p) == "RUNNING" and "before the gates" in p.inner_text("#log"),
        )
        assert page.get_attribute("#log", "data-live") == "yes"
        assert page.is_visible("#log-live")
        # A mark on this very document: a reload would lose it.
        page.evaluate("window.stillTheSamePage = true")
        gate(gates[0]).set()
        page.wait_for_function(
            "gate => document.getElementById('log').textContent.includes('through gate ' + gate)",
            arg=gates[0],
        )
        assert page.evaluate("window.stillTheSamePage === true")
        assert state_of(page) == "RUNNING"
        # Once the run is over the script reloads the page once, to show its outcome.
        with page.expect_navigation():
            gate(gates[1]).set()
        assert page.evaluate("window.stillTheSamePage === undefined")
        assert state_of(page) == "SUCCESS"
        assert page.get_attribute("#log", "data-live") == "no"
        log = page.inner_text("#log")
        assert log.index("before the gates") < log.index(gates[0]) < log.index(gates[1])
    finally:  # never leave the handler waiting
        for name in gates:
            gate(name).set()


def test_pause_and_resume_a_job(page: Any, site: Site) -> None:
    job = site.operator.jobs.create(name="hourly", schedule={"interval": 3600}, task="ui.ok")
    sign_in(page, site.tenant_a["api_key"])
    page.goto(f"/ui/jobs/{job['id']}")
    assert state_of(page) == "active"
    page.click("button:has-text('Pause')")
    assert page.inner_text(".notice") == "Paused" and state_of(page) == "paused"
    assert site.operator.jobs.get(job["id"])["state"] == "paused"
    page.click("button:has-text('Resume')")
    assert page.inner_text(".notice") == "Resumed" and state_of(page) == "active"
    assert site.operator.jobs.get(job["id"])["state"] == "active"


def test_open_a_failed_run_and_read_its_log(page: Any, site: Site) -> None:
    job = site.operator.jobs.create(name="doomed", schedule={"asap": True}, task="ui.fail")
    sign_in(page, site.tenant_a["api_key"])
    page.goto(f"/ui/runs?job={job['id']}")
    reload_until(
        page, f"/ui/runs?job={job['id']}&state=FAILED", lambda p: "doomed" in p.inner_text("main")
    )
    page.click("table a:has-text('…')")
    assert state_of(page) == "FAILED"
    assert "about to fail on purpose" in page.inner_text("#log")
    assert "the disk is full" in page.inner_text("main")


def test_redrive_a_dead_letter(page: Any, site: Site) -> None:
    job = site.operator.jobs.create(
        name="flaky", schedule={"asap": True}, task="ui.flaky", retry={"max_attempts": 1}
    )
    run_id = job["first_run_id"]
    sign_in(page, site.tenant_a["api_key"])
    reload_until(page, "/ui/dead-letters", lambda p: run_id[:8] in p.inner_text("main"))
    page.check(f"input[value='{run_id}']")
    page.click("button:has-text('Redrive selected')")
    assert page.inner_text(".notice") == "Redriven"
    reload_until(page, f"/ui/runs/{run_id}", lambda p: state_of(p) == "SUCCESS")
    assert "redrive" in page.inner_text("main")  # the event in its history


def test_another_tenants_pages_are_not_found(page: Any, site: Site) -> None:
    job = site.operator.jobs.create(name="secret", schedule={"asap": True}, task="ui.ok")
    sign_in(page, site.tenant_b["api_key"])
    for path in (f"/ui/jobs/{job['id']}", f"/ui/runs/{job['first_run_id']}"):
        answer = page.goto(path)
        assert answer.status == 404, path
    page.goto("/ui/jobs")
    assert "secret" not in page.inner_text("main")


def test_a_viewer_sees_no_buttons_and_its_posts_are_refused(page: Any, site: Site) -> None:
    job = site.operator.jobs.create(name="watched", schedule={"interval": 3600}, task="ui.ok")
    sign_in(page, site.viewer_key)
    page.goto(f"/ui/jobs/{job['id']}")
    assert page.locator("main button").count() == 0
    csrf = CSRF.search(page.content())
    assert csrf is not None  # the sign-out form's: a valid token, still not enough
    answer = page.request.post(f"/ui/jobs/{job['id']}/pause", form={"csrf": csrf.group(1)})
    assert answer.status == 403
    assert site.operator.jobs.get(job["id"])["state"] == "active"


def test_a_form_without_its_csrf_token_is_refused(page: Any, site: Site) -> None:
    job = site.operator.jobs.create(name="guarded", schedule={"interval": 3600}, task="ui.ok")
    sign_in(page, site.tenant_a["api_key"])
    for form in ({}, {"csrf": "0" * 64}):
        answer = page.request.post(f"/ui/jobs/{job['id']}/pause", form=form)
        assert answer.status == 403
    assert site.operator.jobs.get(job["id"])["state"] == "active"
    page.click("button:has-text('Sign out')")
    page.wait_for_selector("#api_key")
    assert page.goto("/ui/jobs").url.endswith("/ui/sign-in")
