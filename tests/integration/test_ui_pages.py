"""The dashboard over the real app and store (both backends), driven by an HTTP client
as a browser would: sign-in and its session, CSRF, tenant scoping, roles, and every
page rendering. The browser itself drives it in tests/ui."""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import timedelta

import httpx
import pytest

from conftest import ADMIN_KEY, Driver
from cronwheel.api.auth import hash_key
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
        audit = await api.client.get(f"/v1/audit?target_id={job['id']}", headers=api.admin)
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
    a = await api.tenant()
    job = await api.job(a, name="admin-sees-this")
    async with await _browser(api) as browser:
        r = await sign_in(browser, ADMIN_KEY)
        assert r.headers["location"] == "/ui/tenants"
        # No tenant chosen yet: a tenant's page sends the admin to choose one.
        assert (await browser.get("/ui/jobs")).headers["location"].startswith("/ui/tenants")
        tenants = await browser.get("/ui/tenants")
        assert a.name in tenants.text
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
