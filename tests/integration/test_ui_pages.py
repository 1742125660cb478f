"""The dashboard over the real app and store (both backends), driven by an HTTP client
as a browser would: sign-in and its session, CSRF, tenant scoping, roles, and every
page rendering. The browser itself drives it in tests/ui."""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from sqlalchemy import event
from test_api_logs import leased, lines, post_logs

from conftest import ADMIN_KEY, Driver, TenantInfo
from cronwheel.api.auth import hash_key
from cronwheel.store import Store
from cronwheel.store.sql import SqlStore
from cronwheel.ui.sessions import SESSION_COOKIE, SIGN_IN_COOKIE

_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


def _csrf(html: str) -> str:
    found = _CSRF.search(html)
    assert found is not None, html[:500]
    return found.group(1)


async def _browser(api: Driver) -> httpx.AsyncClient:
    """A second client on the same app with its own cookie jar: one browser."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api.app), base_url="http://cronwheel.test"
    )


async def sign_in(client: httpx.AsyncClient, key: str) -> httpx.Response:
    form = await client.get("/ui/sign-in")
    assert form.status_code == 200
    return await client.post(
        "/ui/sign-in", data={"api_key": key, "csrf": _csrf(form.text)}, follow_redirects=False
    )


async def _page_csrf(client: httpx.AsyncClient, path: str = "/ui/jobs") -> str:
    r = await client.get(path)
    assert r.status_code == 200, r.text
    return _csrf(r.text)


async def test_sign_in_makes_a_strict_http_only_session(api: Driver) -> None:
    tenant = await api.tenant()
    async with await _browser(api) as browser:
        assert (await browser.get("/ui/jobs")).headers["location"].startswith("/ui/sign-in")
        r = await sign_in(browser, tenant.key)
        assert r.status_code == 303 and r.headers["location"] == "/ui/overview"
        cookie = next(c for c in r.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE))
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
        assert "Secure" not in cookie  # plain http here
        # Only the token's hash is stored, and not the key.
        token = browser.cookies[SESSION_COOKIE]
        session = await api.store.ui_sessions_get(
            token_hash=hashlib.sha256(token.encode()).hexdigest()
        )
        assert session is not None and session.key_hash == hash_key(tenant.key)
        page = await browser.get("/ui/overview")
        assert page.status_code == 200 and tenant.name in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]


async def test_a_wrong_key_or_a_worker_key_does_not_sign_in(api: Driver) -> None:
    tenant = await api.tenant()
    worker = await api.key(tenant, "worker")
    async with await _browser(api) as browser:
        r = await sign_in(browser, "cw_not-a-key")
        assert r.status_code == 401 and "not valid" in r.text
        r = await sign_in(browser, worker["Authorization"].split()[1])
        assert r.status_code == 403 and "worker keys" in r.text
        assert SESSION_COOKIE not in browser.cookies


async def test_sign_in_without_its_csrf_token_is_refused(api: Driver) -> None:
    tenant = await api.tenant()
    async with await _browser(api) as browser:
        await browser.get("/ui/sign-in")
        r = await browser.post("/ui/sign-in", data={"api_key": tenant.key, "csrf": "0" * 64})
        assert r.status_code == 403
        assert SESSION_COOKIE not in browser.cookies
        assert SIGN_IN_COOKIE in browser.cookies


async def test_every_post_needs_the_sessions_csrf_token(api: Driver) -> None:
    tenant = await api.tenant()
    job = await api.job(tenant, schedule={"interval": 60}, name="nightly")
    async with await _browser(api) as browser:
        await sign_in(browser, tenant.key)
        for data in ({}, {"csrf": "f" * 64}):
            r = await browser.post(f"/ui/jobs/{job['id']}/pause", data=data)
            assert r.status_code == 403, r.text
        assert (
            await api.store.jobs_get(uuid.UUID(tenant.id), uuid.UUID(job["id"]))
        ).state == "active"
        # Another browser's token is no good either.
        async with await _browser(api) as other:
            await sign_in(other, tenant.key)
            theirs = await _page_csrf(other)
        r = await browser.post(f"/ui/jobs/{job['id']}/pause", data={"csrf": theirs})
        assert r.status_code == 403
        csrf = await _page_csrf(browser)
        r = await browser.post(f"/ui/jobs/{job['id']}/pause", data={"csrf": csrf})
        assert r.status_code == 303 and r.headers["location"].endswith("?notice=Paused")
        assert (
            await api.store.jobs_get(uuid.UUID(tenant.id), uuid.UUID(job["id"]))
        ).state == "paused"
        # Recorded on the audit trail as the key did it, like the API's own pause.
        audit = await api.client.get(f"/v1/audit?target={job['id']}", headers=api.admin)
        assert audit.status_code == 200, audit.text
        assert any(r["action"] == "job.pause" for r in audit.json()["items"])
        r = await browser.post(f"/ui/jobs/{job['id']}/pause", data={"csrf": csrf})
        assert r.status_code == 409  # already paused: the API's answer, as a page
        r = await browser.post("/ui/sign-out", data={"csrf": csrf})
        assert r.status_code == 303
        assert (await browser.get("/ui/jobs")).headers["location"].startswith("/ui/sign-in")


async def test_another_tenants_pages_are_not_found(api: Driver) -> None:
    a, b = await api.tenant(), await api.tenant()
    job = await api.job(a, name="a-job")
    await api.fire()
    run_id = job["first_run_id"]
    async with await _browser(api) as browser:
        await sign_in(browser, b.key)
        for path in (f"/ui/jobs/{job['id']}", f"/ui/runs/{run_id}", f"/ui/runs/{run_id}/logs.json"):
            r = await browser.get(path)
            assert r.status_code == 404, (path, r.status_code)
        csrf = await _page_csrf(browser)
        r = await browser.post(f"/ui/jobs/{job['id']}/cancel", data={"csrf": csrf})
        assert r.status_code == 404
        assert (await browser.get("/ui/tenants")).status_code == 403
        jobs = await browser.get("/ui/jobs")
        assert "a-job" not in jobs.text


async def test_a_viewer_sees_no_buttons_and_may_not_post(api: Driver) -> None:
    tenant = await api.tenant()
    viewer = (await api.key(tenant, "viewer"))["Authorization"].split()[1]
    job = await api.job(tenant, schedule={"interval": 60})
    async with await _browser(api) as browser:
        await sign_in(browser, viewer)
        page = await browser.get(f"/ui/jobs/{job['id']}")
        assert page.status_code == 200
        assert "/pause" not in page.text and "Trigger" not in page.text
        csrf = _csrf(page.text)  # the sign-out form's
        r = await browser.post(f"/ui/jobs/{job['id']}/pause", data={"csrf": csrf})
        assert r.status_code == 403


async def test_a_revoked_key_ends_its_sessions(api: Driver) -> None:
    tenant = await api.tenant()
    r = await api.client.post(
        f"/v1/tenants/{tenant.id}/keys", json={"role": "operator"}, headers=api.admin
    )
    key, key_id = r.json()["api_key"], r.json()["id"]
    async with await _browser(api) as browser:
        await sign_in(browser, key)
        assert (await browser.get("/ui/jobs")).status_code == 200
        r = await api.client.delete(f"/v1/tenants/{tenant.id}/keys/{key_id}", headers=api.admin)
        assert r.status_code in (200, 204), r.text
        r = await browser.get("/ui/jobs")
        assert r.status_code == 303 and "no+longer+valid" in r.headers["location"]


async def test_a_session_expires_when_idle(api: Driver) -> None:
    tenant = await api.tenant()
    async with await _browser(api) as browser:
        await sign_in(browser, tenant.key)
        token = browser.cookies[SESSION_COOKIE]
        token_hash = hashlib.sha256(token.encode()).hexdigest()
        session = await api.store.ui_sessions_get(token_hash=token_hash)
        assert session is not None
        idle = api.app.state.settings.ui_session_idle
        later = session.last_seen_at + timedelta(seconds=idle + 1)
        assert await api.store.ui_sessions_get(token_hash=token_hash, now=later) is None
        # Touched, it lasts from its last use, never past its lifetime.
        soon = session.last_seen_at + timedelta(seconds=idle / 2)
        await api.store.ui_sessions_touch(
            token_hash=token_hash, idle=idle, lifetime=idle * 1.2, now=soon
        )
        assert await api.store.ui_sessions_get(token_hash=token_hash, now=later) is not None
        end = session.created_at + timedelta(seconds=idle * 1.2 + 1)
        assert await api.store.ui_sessions_get(token_hash=token_hash, now=end) is None


async def test_the_admin_sees_every_tenant_and_opens_one(api: Driver) -> None:
    a, unlimited = await api.tenant(), await api.tenant()
    limits = {"max_concurrent_runs": 7, "max_pending_runs": 1234, "max_dispatch_rate": 2.5}
    r = await api.client.patch(f"/v1/tenants/{a.id}", json={"limits": limits}, headers=api.admin)
    assert r.status_code == 200, r.text
    job = await api.job(a, name="admin-sees-this")
    async with await _browser(api) as browser:
        r = await sign_in(browser, ADMIN_KEY)
        assert r.headers["location"] == "/ui/tenants"
        # No tenant chosen yet: a tenant's page sends the admin to choose one.
        assert (await browser.get("/ui/jobs")).headers["location"].startswith("/ui/tenants")
        tenants = await browser.get("/ui/tenants")
        assert a.name in tenants.text
        # Each tenant's row shows the limits set on it with their values, and the
        # share every tenant has (weight); no limit left unset.
        rows = dict(re.findall(r"<tr[^>]*>\s*<td>([^<]+)<br>(.*?)</tr>", tenants.text, re.S))
        shown = dict(re.findall(r"<dt>(\w+)</dt><dd>([^<]*)</dd>", rows[a.name]))
        assert shown == {**{k: str(v) for k, v in limits.items()}, "weight": "1.0"}
        assert re.findall(r"<dt>(\w+)</dt>", rows[unlimited.name]) == ["weight"]
        r = await browser.post(
            "/ui/tenants/choose", data={"csrf": _csrf(tenants.text), "tenant": a.id}
        )
        assert r.status_code == 303
        assert "admin-sees-this" in (await browser.get("/ui/jobs")).text
        assert (await browser.get(f"/ui/jobs/{job['id']}")).status_code == 200
        # The tenant deleted under it, the admin is asked to choose another.
        r = await api.client.delete(f"/v1/tenants/{a.id}?force=true", headers=api.admin)
        assert r.status_code == 200, r.text
        assert (await browser.get("/ui/jobs")).headers["location"].startswith("/ui/tenants")
        assert (await browser.get("/ui/overview")).status_code == 200


async def test_every_page_renders(api: Driver) -> None:
    tenant = await api.tenant()
    job = await api.job(
        tenant, schedule={"cron": "*/5 * * * *", "timezone": "Europe/Paris"}, name="cron-job"
    )
    once = await api.job(tenant, name="once")
    await api.fire()
    async with await _browser(api) as browser:
        await sign_in(browser, tenant.key)
        run_id = once["first_run_id"]
        for path in (
            "/ui/overview",
            "/ui/jobs",
            "/ui/jobs?name=cron&state=active",
            f"/ui/jobs/{job['id']}",
            "/ui/runs",
            f"/ui/runs?job={once['id']}&state=DISPATCHED&since=2000-01-01T00:00",
            f"/ui/runs/{run_id}",
            f"/ui/runs/{run_id}/logs.json",
            "/ui/dead-letters",
            "/ui/workers",
        ):
            r = await browser.get(path)
            assert r.status_code == 200, (path, r.text[:2000])
        page = await browser.get(f"/ui/jobs/{job['id']}")
        assert "very 5 minutes (Europe/Paris)" in page.text
        assert "+01:00" in page.text or "+02:00" in page.text  # the zone's offset
        for path, status in (
            ("/ui/runs?state=NOPE", 422),
            ("/ui/runs?since=yesterday", 422),
            ("/ui/jobs/not-an-id", 404),
            ("/ui/nothing-here", 404),
        ):
            assert (await browser.get(path)).status_code == status, path
        assert (await browser.get("/ui/static/ui.css")).status_code == 200


@pytest.mark.parametrize("path", ["/ui/overview", "/ui/runs/x/logs.json"])
async def test_without_a_session(api: Driver, path: str) -> None:
    async with await _browser(api) as browser:
        r = await browser.get(path)
        assert r.status_code in (303, 401)
        if r.status_code == 401:
            assert r.json()["error"]["message"]


async def test_over_https_the_session_cookie_is_secure(api: Driver) -> None:
    tenant = await api.tenant()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=api.app), base_url="https://cronwheel.test"
    ) as browser:
        r = await sign_in(browser, tenant.key)
        assert r.status_code == 303
        cookie = next(c for c in r.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE))
        assert "Secure" in cookie and "HttpOnly" in cookie
        assert (await browser.get("/ui/jobs")).status_code == 200


async def test_the_runs_page_filters_by_tag_and_pool(api: Driver) -> None:
    tenant = await api.tenant()
    red_gpu = await api.job(tenant, name="red-gpu", tags=["red", "night"], pool="gpu")
    red = await api.job(tenant, name="red-default", tags=["red"])
    blue_gpu = await api.job(tenant, name="blue-gpu", tags=["blue"], pool="gpu")
    runs = {j["name"]: j["first_run_id"] for j in (red_gpu, red, blue_gpu)}

    def listed(html: str) -> set[str]:
        return {name for name, run_id in runs.items() if f"/ui/runs/{run_id}" in html}

    async with await _browser(api) as browser:
        await sign_in(browser, tenant.key)
        assert listed((await browser.get("/ui/runs")).text) == set(runs)
        for query, names in (
            ({"tag": "red"}, {"red-gpu", "red-default"}),
            ({"tag": "red, night"}, {"red-gpu"}),  # every tag named
            ({"tag": "green"}, set()),
            ({"pool": "gpu"}, {"red-gpu", "blue-gpu"}),
            ({"pool": " gpu ", "tag": "blue"}, {"blue-gpu"}),
            ({"pool": "gpu", "state": "SUCCESS"}, set()),
        ):
            r = await browser.get("/ui/runs", params=query)
            assert r.status_code == 200, (query, r.text[:500])
            assert listed(r.text) == names, query
        # The filters stay in the form, and in the pager's links.
        r = await browser.get("/ui/runs", params={"tag": "red", "pool": "gpu"})
        assert 'name="tag" value="red"' in r.text and 'name="pool" value="gpu"' in r.text
        # Bad values: a page naming the problem, never a 5xx.
        for query, problem in (
            ({"tag": ",".join(f"t{i}" for i in range(11))}, "tag: at most 10 tags"),
            ({"tag": "x" * 101}, "tag: each tag is 1 to 100 characters"),
            ({"pool": "p" * 101}, "pool"),
        ):
            r = await browser.get("/ui/runs", params=query)
            assert r.status_code == 422, (query, r.status_code)
            assert problem in r.text, (query, r.text[:2000])


async def test_the_jobs_list_shows_cron_local_time_and_last_outcome(
    api: Driver, store: Store
) -> None:
    tenant = await api.tenant()
    cron = await api.job(
        tenant,
        name="paris-cron",
        schedule={"cron": "30 9 * * 1-5", "timezone": "Europe/Paris"},
    )
    worker, attempt = await leased(api, tenant)  # a second job's run, leased
    r = await api.client.post(
        f"/v1/attempts/{attempt['attempt_id']}/fail",
        json={"fencing_token": attempt["fencing_token"], "error": "boom", "retryable": False},
        headers=worker,
    )
    assert r.status_code == 200, r.text
    failed_run = attempt["run_id"]
    idle = await api.job(tenant, name="idle")  # its run not fired
    async with await _browser(api) as browser:
        await sign_in(browser, tenant.key)
        r = await browser.get("/ui/jobs")
        assert r.status_code == 200, r.text
        rows = _rows(r.text)
        # The cron job: its words, its expression, its next due in Paris with the offset.
        paris = rows[cron["id"]]
        assert "at 09:30 on Monday through Friday (Europe/Paris)" in paris
        assert '<code class="cron">30 9 * * 1-5</code>' in paris
        job = await store.jobs_get(uuid.UUID(tenant.id), uuid.UUID(cron["id"]))
        assert job.next_due_at is not None
        local = job.next_due_at.astimezone(ZoneInfo("Europe/Paris"))
        offset = local.strftime("%z")
        assert local.strftime("%Y-%m-%d %H:%M:%S") == local.strftime("%Y-%m-%d 09:30:00")
        assert f"{local:%Y-%m-%d %H:%M:%S} {offset[:3]}:{offset[3:]}" in paris
        assert "none" in rows[idle["id"]] and "/ui/runs/" not in rows[idle["id"]]
        assert "/ui/runs/" not in rows[cron["id"]]
        # The failed run's job: FAILED, linking to that run.
        [leased_job] = [k for k in rows if k not in (cron["id"], idle["id"])]
        assert f'href="/ui/runs/{failed_run}"' in rows[leased_job]
        assert ">FAILED<" in rows[leased_job]


def _rows(html: str) -> dict[str, str]:
    """The jobs table's rows by job id."""
    found = re.findall(r'<tr>\s*<td><a href="/ui/jobs/([0-9a-f-]+)">(.*?)</tr>', html, re.S)
    return {job_id: row for job_id, row in found}


async def test_the_jobs_list_reads_as_many_statements_for_many_jobs(
    api: Driver, store: Store
) -> None:
    """The last outcomes are one read for the whole page: a page of twelve jobs, some
    with a finished run, sends no more statements than a page of one."""
    assert isinstance(store, SqlStore)
    engine = store.engine

    async def statements(tenant: TenantInfo, jobs: int) -> int:
        sent: list[str] = []

        def catch(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            sent.append(statement)

        async with await _browser(api) as browser:
            await sign_in(browser, tenant.key)
            assert (await browser.get("/ui/jobs")).status_code == 200  # the session warm
            event.listen(engine.sync_engine, "before_cursor_execute", catch)
            try:
                r = await browser.get("/ui/jobs")
            finally:
                event.remove(engine.sync_engine, "before_cursor_execute", catch)
            assert r.status_code == 200 and len(_rows(r.text)) == jobs
            assert r.text.count(">CANCELLED<") == (jobs + 1) // 2
        return len(sent)

    one, many = await api.tenant(), await api.tenant()
    for tenant, count in ((one, 1), (many, 12)):
        for i in range(count):
            job = await api.job(tenant, name=f"job-{i}")
            if i % 2 == 0:
                r = await api.client.post(
                    f"/v1/runs/{job['first_run_id']}/cancel", headers=tenant.headers
                )
                assert r.status_code == 200, r.text
    assert await statements(many, 12) == await statements(one, 1)


async def test_a_running_runs_log_follows_live(api: Driver) -> None:
    """What the page's script polls: lines after the cursor, live while the run goes
    on, then not."""
    tenant = await api.tenant()
    worker, attempt = await leased(api, tenant)
    run_id = attempt["run_id"]
    assert (await post_logs(api, worker, attempt, {"lines": lines("one")})).status_code == 200
    async with await _browser(api) as browser:
        await sign_in(browser, tenant.key)
        page = await browser.get(f"/ui/runs/{run_id}")
        assert page.status_code == 200
        log = re.search(r'<pre[^>]*id="log"[^>]*>', page.text)
        assert log is not None, page.text
        assert 'data-live="yes"' in log.group(0)
        cursor = re.search(r'data-cursor="([^"]*)"', log.group(0))
        assert cursor is not None and cursor.group(1)
        assert "one" in page.text

        async def poll(at: str) -> dict[str, Any]:
            r = await browser.get(f"/ui/runs/{run_id}/logs.json", params={"cursor": at})
            assert r.status_code == 200, r.text
            assert r.headers["cache-control"] == "no-store"
            body: dict[str, Any] = r.json()
            return body

        body = await poll(cursor.group(1))
        assert body["live"] is True and body["run_state"] == "RUNNING" and body["lines"] == []
        posted = await post_logs(api, worker, attempt, {"lines": lines("two", "three")})
        assert posted.status_code == 200
        body = await poll(cursor.group(1))
        assert body["live"] is True
        assert [line["message"] for line in body["lines"]] == ["two", "three"]
        end = body["next_cursor"] or body["end_cursor"]
        assert (await poll(end))["lines"] == []
        r = await api.client.post(
            f"/v1/attempts/{attempt['attempt_id']}/complete",
            json={"fencing_token": attempt["fencing_token"]},
            headers=worker,
        )
        assert r.status_code == 200, r.text
        body = await poll(end)
        assert body["live"] is False and body["run_state"] == "SUCCESS" and body["lines"] == []
        page = await browser.get(f"/ui/runs/{run_id}")
        assert 'data-live="no"' in page.text
