"""The built-in webhook worker end to end: the real API (uvicorn on a free port) over the
real store (both backends), the worker, and a real HTTP receiver on 127.0.0.1 — which
the worker reaches only because the allow-list admits loopback. Runs are fired as a
scheduler owning every shard would (never before they are due)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import socket
import ssl
import time
import uuid
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path
from typing import Any

import pytest
from webhook_checks import verify

from cronwheel import AsyncClient
from cronwheel.api import create_app
from cronwheel.client import Call
from cronwheel.runtime import serving
from cronwheel.settings import Settings
from cronwheel.store import Store
from cronwheel.testing import wait_until_async
from cronwheel.worker import Lease, Worker, webhook_worker
from cronwheel.worker.webhook import WebhookCaller, WebhookFailure

pytestmark = pytest.mark.usefixtures("only_loopback_traffic")

ALL_SHARDS = range(256)
ALLOW_LOOPBACK = ["127.0.0.1/32"]


# -- the receiver ---------------------------------------------------------------------

Reply = tuple[int, dict[str, str], bytes]
Step = Reply | Callable[[], Reply] | str  # "hang": answer only when the test ends


@dataclass
class Received:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    at: float  # wall clock on arrival
    answered_at: float = 0.0


class Receiver:
    """A real HTTP endpoint (ASGI, served by uvicorn): records every request and answers
    from the script of its path, then 200."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.script: dict[str, deque[Step]] = defaultdict(deque)
        self.release = asyncio.Event()
        self.url = ""

    def on(self, path: str) -> list[Received]:
        return [r for r in self.requests if r.path == path]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": f"{message['type']}.complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        got = Received(
            method=scope["method"],
            path=scope["path"],
            query=scope["query_string"].decode(),
            headers={k.decode().lower(): v.decode() for k, v in scope["headers"]},
            body=body,
            at=time.time(),
        )
        self.requests.append(got)
        script = self.script[got.path]
        step = script.popleft() if script else (200, {}, b'{"ok":true}')
        if step == "hang":
            await self.release.wait()
            step = (200, {}, b"too late")
        assert not isinstance(step, str)
        status, headers, content = step() if callable(step) else step
        got.answered_at = time.time()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
            }
        )
        await send({"type": "http.response.body", "body": content})


# -- the environment ------------------------------------------------------------------


@dataclass
class Env:
    url: str
    store: Store
    operator: AsyncClient
    tenant_id: str
    worker_key: str
    receiver: Receiver
    background: list[asyncio.Task[Any]] = field(default_factory=list)

    async def hook(
        self,
        path: str = "/hook",
        *,
        url: str | None = None,
        method: str = "POST",
        headers: dict[str, str] | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        fields.setdefault("schedule", {"asap": True})
        fields.setdefault("name", f"hook-{uuid.uuid4().hex[:6]}")
        webhook: dict[str, Any] = {"url": url or self.receiver.url + path, "method": method}
        if headers:
            webhook["headers"] = headers
        return await self.operator.jobs.create(webhook=webhook, **fields)

    async def fire(self) -> int:
        await self.store.shard_leases_acquire(node_id="t", shards=ALL_SHARDS, ttl=60)
        now = await self.store.db_now()
        due = await self.store.runs_due_scan(shards=ALL_SHARDS, until=now + timedelta(seconds=1))
        return len(await self.store.runs_fire(run_ids=[d.id for d in due], node_id="t"))

    async def secret(self) -> str:
        call = Call("GET", f"/v1/tenants/{self.tenant_id}/webhook-secret")
        return str((await self.operator.send(call))["webhook_secret"])

    async def wait_run(self, run_id: str, *states: str, timeout: float = 30.0) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        async def reached() -> dict[str, Any] | None:
            seen.update(await self.operator.runs.get(run_id))
            if seen["state"] in states:
                return seen
            for task in self.background:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise AssertionError("a background task failed") from task.exception()
            return None

        def stuck() -> str:
            return f"run {run_id} is {seen['state']} (not {states}): {seen['last_error']}"

        run: dict[str, Any] = await wait_until_async(
            reached, timeout, what=stuck, interval=0.05, not_yet=()
        )
        return run

    @contextlib.asynccontextmanager
    async def working(self, **options: Any) -> AsyncIterator[Worker]:
        """A webhook worker and a scheduler stand-in that fires runs as they fall due."""
        options.setdefault("allow", ALLOW_LOOPBACK)
        options.setdefault("lease_wait", 1.0)
        worker = webhook_worker(self.url, api_key=self.worker_key, **options)
        stop = asyncio.Event()

        async def fire_when_due() -> None:
            while not stop.is_set():
                await self.fire()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.05):
                        await stop.wait()

        tasks = [asyncio.create_task(worker.run_async(stop)), asyncio.create_task(fire_when_due())]
        self.background = tasks
        try:
            yield worker
        finally:
            stop.set()
            async with asyncio.timeout(30):
                await asyncio.gather(*tasks)
            self.background = []


@contextlib.asynccontextmanager
async def open_env(settings: Settings, store: Store) -> AsyncIterator[Env]:
    assert settings.admin_key is not None
    receiver = Receiver()
    async with (
        serving(create_app(settings, store)) as url,
        serving(receiver) as receiver_url,
        AsyncClient(url, api_key=settings.admin_key) as admin,
    ):
        receiver.url = receiver_url
        tenant = await admin.tenants.create(f"hooks-{uuid.uuid4().hex[:6]}")
        key = await admin.tenants.create_key(tenant["id"], role="worker")
        async with AsyncClient(url, api_key=tenant["api_key"]) as operator:
            try:
                yield Env(url, store, operator, tenant["id"], key["api_key"], receiver)
            finally:
                receiver.release.set()


@pytest.fixture
async def env(settings: Settings, store: Store) -> AsyncIterator[Env]:
    async with open_env(settings, store) as opened:
        yield opened


def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# -- calls ----------------------------------------------------------------------------


async def test_a_call_carries_the_payload_and_signed_headers(env: Env) -> None:
    env.receiver.script["/big"].append((200, {}, b"x" * 5000))
    before = int(time.time())
    job = await env.hook(
        "/hook?x=1", payload={"amount": 3, "note": "é"}, headers={"X-Team": "billing"}
    )
    big = await env.hook("/big", method="PUT")
    async with env.working():
        run = await env.wait_run(job["first_run_id"], "SUCCESS")
        big_run = await env.wait_run(big["first_run_id"], "SUCCESS")
    after = int(time.time())

    assert job["requires"] == ["webhook"]
    [got] = env.receiver.on("/hook")
    assert (got.method, got.query) == ("POST", "x=1")
    headers = got.headers
    assert headers["host"] == env.receiver.url.removeprefix("http://")
    assert headers["x-team"] == "billing"
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"].startswith("cronwheel-webhook")
    [attempt] = run["attempts"]
    assert headers["cronwheel-run-id"] == run["id"]
    assert headers["cronwheel-job-id"] == job["id"]
    assert headers["cronwheel-attempt"] == "1"
    assert headers["cronwheel-fencing-token"] == str(attempt["fencing_token"])
    assert headers["idempotency-key"] == f"{run['id']}:1"
    assert before <= int(headers["cronwheel-timestamp"]) <= after
    assert json.loads(got.body) == {"amount": 3, "note": "é"}

    secret = await env.secret()
    assert verify(secret, headers, got.body)
    assert not verify(secret + "x", headers, got.body)
    assert not verify(secret, headers, got.body + b" ")
    assert run["result"] == {"status": 200, "body": '{"ok":true}', "truncated": False}

    [put] = env.receiver.on("/big")
    assert put.method == "PUT" and json.loads(put.body) == {}
    assert big_run["result"] == {"status": 200, "body": "x" * 1024, "truncated": True}


async def test_a_compressed_answer_is_not_inflated(env: Env) -> None:
    """The worker asks for an identity body; a receiver that compresses anyway gets its
    status recorded and its body left unread (a small gzip can inflate to gigabytes)."""
    bomb = gzip.compress(b"0" * 5_000_000)
    env.receiver.script["/gz"].append((200, {"Content-Encoding": "gzip"}, bomb))
    job = await env.hook("/gz")
    async with env.working():
        run = await env.wait_run(job["first_run_id"], "SUCCESS")
    [got] = env.receiver.on("/gz")
    assert got.headers["accept-encoding"] == "identity"
    # The worker registered as one that only calls webhooks.
    [attempt] = run["attempts"]
    worker = await env.store.workers_get(uuid.UUID(attempt["worker_id"]))
    assert worker.webhooks_only and worker.capabilities == ["webhook"]
    assert run["result"] == {
        "status": 200,
        "body": "(a gzip-encoded body, not read)",
        "truncated": False,
    }


async def test_retry_after_is_honoured(env: Env) -> None:
    said: dict[str, datetime] = {}

    def slow_down() -> Reply:
        when = formatdate(time.time() + 3, usegmt=True)
        said["retry_at"] = parsedate_to_datetime(when)
        return 429, {"Retry-After": when}, b"slow down"

    env.receiver.script["/busy"].extend([(503, {"Retry-After": "2"}, b"busy"), slow_down])
    job = await env.hook("/busy", retry={"max_attempts": 3, "initial_delay": 0, "jitter": "none"})
    async with env.working():
        run = await env.wait_run(job["first_run_id"], "SUCCESS", "DEAD_LETTER", timeout=45)
    assert run["state"] == "SUCCESS" and run["attempt"] == 3

    first, second, third = env.receiver.on("/busy")
    # The receiver's own clock: no retry came before the receiver said it could.
    assert second.at - first.answered_at >= 2.0
    assert third.at >= said["retry_at"].timestamp()
    assert [r.headers["cronwheel-attempt"] for r in (first, second, third)] == ["1", "2", "3"]
    keys = [r.headers["idempotency-key"] for r in (first, second, third)]
    assert keys == [f"{run['id']}:{n}" for n in (1, 2, 3)]
    tokens = [int(r.headers["cronwheel-fencing-token"]) for r in (first, second, third)]
    assert tokens == sorted(set(tokens))

    # The server's clock: the second attempt started 2 s after the first ended at least.
    one, two, _ = sorted(run["attempts"], key=lambda a: a["number"])
    assert _instant(two["started_at"]) - _instant(one["finished_at"]) >= timedelta(seconds=2)
    assert "HTTP 503" in one["error"] and "busy" in one["error"]
    assert "Retry-After: 2 s" in one["error"]
    assert "HTTP 429" in two["error"]
    reasons = [e["reason"] or "" for e in run["events"]]
    assert any("in 2.00 s (as the worker asked: retry_after)" in r for r in reasons), reasons


async def test_other_client_errors_fail_at_once(env: Env) -> None:
    env.receiver.script["/reject"].append((400, {}, b'{"error":"bad input"}'))
    env.receiver.script["/gone"].append((404, {}, b""))
    env.receiver.script["/moved"].append((302, {"Location": "http://169.254.169.254/"}, b""))
    retry = {"max_attempts": 5, "initial_delay": 0, "jitter": "none"}
    jobs = {path: await env.hook(path, retry=retry) for path in ("/reject", "/gone", "/moved")}
    async with env.working():
        runs = {
            path: await env.wait_run(job["first_run_id"], "FAILED", "SUCCESS", "DEAD_LETTER")
            for path, job in jobs.items()
        }
    for path, run in runs.items():
        assert run["state"] == "FAILED" and run["attempt"] == 1, (path, run)
        assert len(env.receiver.on(path)) == 1
    assert "HTTP 400" in runs["/reject"]["last_error"]
    assert "bad input" in runs["/reject"]["last_error"]
    assert "HTTP 404" in runs["/gone"]["last_error"]
    assert "redirects are not followed" in runs["/moved"]["last_error"]
    assert [r.path for r in env.receiver.requests if r.path not in jobs] == []


async def test_timeouts_and_network_errors_are_retried(env: Env) -> None:
    env.receiver.script["/deadline"].append("hang")
    env.receiver.script["/slow"].append("hang")
    retry = {"max_attempts": 2, "initial_delay": 0, "jitter": "none"}
    # The request's timeout: the attempt's deadline (1 s) or the worker's maximum (2 s).
    deadline = await env.hook("/deadline", retry=retry, timeout=1)
    slow = await env.hook("/slow", retry=retry)
    with socket.socket() as closed:  # bound, not listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        refused = await env.hook(url=f"http://127.0.0.1:{port}/x", retry=retry)
        async with env.working(timeout=2.0):
            for job in (deadline, slow):
                run = await env.wait_run(job["first_run_id"], "SUCCESS", "DEAD_LETTER")
                assert run["state"] == "SUCCESS" and run["attempt"] == 2, run
            down = await env.wait_run(refused["first_run_id"], "DEAD_LETTER", "FAILED")
    assert down["attempt"] == 2 and "network error" in down["last_error"]

    by_deadline = await env.operator.runs.get(deadline["first_run_id"])
    error = min(by_deadline["attempts"], key=lambda a: a["number"])["error"]
    assert "no answer within 1 s" in error or "deadline exceeded" in error, error
    by_maximum = await env.operator.runs.get(slow["first_run_id"])
    error = min(by_maximum["attempts"], key=lambda a: a["number"])["error"]
    assert "no answer within 2 s" in error, error


# A self-signed certificate for the name "localhost" only (not for 127.0.0.1), valid
# from 2000 to 2100: test material, made with openssl for these tests.
LOCALHOST_CERT = """\
-----BEGIN CERTIFICATE-----
MIIBcTCCARegAwIBAgIBATAKBggqhkjOPQQDAjAUMRIwEAYDVQQDDAlsb2NhbGhv
c3QwIBcNMDAwMTAxMDAwMDAwWhgPMjEwMDAxMDEwMDAwMDBaMBQxEjAQBgNVBAMM
CWxvY2FsaG9zdDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABFdCIbWy/nbs4uAn
r9iHirGoFFp81RwAfmY1kedqRM/0BcuohOsN21TEepEjZspFmMaSs4uphNnd9hdY
9+2xnY+jWDBWMBQGA1UdEQQNMAuCCWxvY2FsaG9zdDAPBgNVHRMBAf8EBTADAQH/
MA4GA1UdDwEB/wQEAwIChDAdBgNVHQ4EFgQUUKBHfEollvkSu25W2CftlnuNV1cw
CgYIKoZIzj0EAwIDSAAwRQIhAKSt9mxRp8JkJV+4gJQzdPAE2PTFC+xTbraA8PIU
FjxoAiBzH3/+fa97N7aMRehD46+luvuGJyvcokHSBzbGGumQuA==
-----END CERTIFICATE-----
"""
LOCALHOST_KEY = """\
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgZu/RzN+SW3mo/n+e
6PwKIT1QgDfPA4CfQ6YuBd4qVO2hRANCAARXQiG1sv527OLgJ6/Yh4qxqBRafNUc
AH5mNZHnakTP9AXLqITrDdtUxHqRI2bKRZjGkrOLqYTZ3fYXWPftsZ2P
-----END PRIVATE KEY-----
"""


def _lease(url: str) -> Lease:
    now = datetime.now(UTC)
    return Lease(
        attempt_id=str(uuid.uuid4()),
        run_id=str(uuid.uuid4()),
        job_id=str(uuid.uuid4()),
        attempt=1,
        task=None,
        webhook={"url": url, "method": "POST"},
        payload={},
        fencing_token=1,
        lease_expires_at=now + timedelta(seconds=30),
        deadline=now + timedelta(seconds=30),
        due_at=now,
        heartbeat_timeout=30.0,
        signing_secret="s3cret",
    )


async def test_tls_checks_the_urls_host_while_connecting_to_the_checked_address(
    tmp_path: Path,
) -> None:
    (tmp_path / "cert.pem").write_text(LOCALHOST_CERT)
    (tmp_path / "key.pem").write_text(LOCALHOST_KEY)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server_names: list[str | None] = []

    def on_hello(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        server_names.append(name)

    tls.sni_callback = on_hello
    requests: list[tuple[str, dict[str, str]]] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (h.split(":", 1) for h in head[1:] if h)}
        await reader.readexactly(int(headers.get("content-length", "0")))
        requests.append((head[0], headers))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    caller = WebhookCaller(
        allow=["localhost", "127.0.0.1"], verify=ssl.create_default_context(cadata=LOCALHOST_CERT)
    )
    try:
        result = await caller.call(_lease(f"https://localhost:{port}/tls"), {"a": 1})
        # The same server by its address: the certificate does not name it.
        with pytest.raises(WebhookFailure) as by_address:
            await caller.call(_lease(f"https://127.0.0.1:{port}/tls"), {})
    finally:
        await caller.aclose()
        server.close()
        await server.wait_closed()
    assert result == {"status": 200, "body": "ok", "truncated": False}
    assert server_names[0] == "localhost"  # SNI: the URL's host, not the address dialled
    [(line, headers)] = requests
    assert line == "POST /tls HTTP/1.1" and headers["host"] == f"localhost:{port}"
    assert by_address.value.retryable and "CERTIFICATE_VERIFY_FAILED" in str(by_address.value)


# -- refusals (SSRF) ------------------------------------------------------------------


async def test_private_and_link_local_addresses_are_refused_without_an_allow_list(
    env: Env,
) -> None:
    retry = {"max_attempts": 3, "initial_delay": 0, "jitter": "none"}
    metadata = await env.hook(url="http://169.254.169.254/latest/meta-data/", retry=retry)
    private = await env.hook(url="http://10.0.0.1:8080/hook", retry=retry)
    loopback = await env.hook("/never", retry=retry)
    named = await env.hook(url=env.receiver.url.replace("127.0.0.1", "localhost"), retry=retry)
    async with env.working(allow=[]):
        runs = [
            await env.wait_run(j["first_run_id"], "FAILED", "SUCCESS", "DEAD_LETTER")
            for j in (metadata, private, loopback, named)
        ]
    for run in runs:
        assert run["state"] == "FAILED" and run["attempt"] == 1, run
        assert "webhook_allow" in run["last_error"]
    assert "169.254.169.254: a link-local address" in runs[0]["last_error"]
    assert "10.0.0.1: a private address" in runs[1]["last_error"]
    assert "127.0.0.1: a loopback address" in runs[2]["last_error"]
    assert "localhost (" in runs[3]["last_error"] and "loopback" in runs[3]["last_error"]
    assert env.receiver.requests == []


async def test_loopback_is_refused_when_the_allow_list_does_not_admit_it(env: Env) -> None:
    job = await env.hook("/never")
    async with env.working(allow=["10.0.0.0/8", "hooks.internal"]):
        run = await env.wait_run(job["first_run_id"], "FAILED", "SUCCESS", "DEAD_LETTER")
    assert run["state"] == "FAILED" and "a loopback address" in run["last_error"]
    assert env.receiver.requests == []


# -- routing --------------------------------------------------------------------------


async def test_webhook_runs_go_only_to_workers_that_call_webhooks(api: Any) -> None:
    t = await api.tenant()
    worker_key = await api.key(t, "worker")
    hook = {"url": "https://example.com/h"}
    w1 = await api.job(t, name="w1", task=None, webhook=hook)
    r = await api.client.post(
        "/v1/jobs/batch",
        json={
            "jobs": [
                {"name": "w2", "schedule": {"asap": True}, "webhook": hook, "requires": ["eu"]},
                {"name": "t1", "schedule": {"asap": True}, "task": "t.run", "requires": ["eu"]},
            ]
        },
        headers=t.headers,
    )
    assert r.status_code == 201, r.text
    w2, t1 = r.json()["items"]
    assert (w1["requires"], w2["requires"], t1["requires"]) == (
        ["webhook"],
        ["eu", "webhook"],
        ["eu"],
    )
    await api.fire()

    async def lease(capabilities: list[str], **body: Any) -> list[dict[str, Any]]:
        reg = await api.client.post(
            "/v1/workers", json={"capabilities": capabilities}, headers=worker_key
        )
        assert reg.status_code == 200, reg.text
        answer = await api.client.post(
            f"/v1/workers/{reg.json()['worker_id']}/lease",
            json={"max": 10, **body},
            headers=worker_key,
        )
        assert answer.status_code == 200, answer.text
        items: list[dict[str, Any]] = answer.json()["attempts"]
        return items

    # A worker without the capability never gets a webhook run, however many wait.
    plain = await lease(["eu", "gpu"])
    assert [a["run_id"] for a in plain] == [t1["first_run_id"]]
    assert plain[0]["signing_secret"] is None

    # A webhook-only worker leaves task runs to others, even ones it could take.
    t2 = await api.job(t, name="t2", task="t.run")
    await api.fire()
    hooks = await lease(["webhook", "eu"], webhooks_only=True)
    assert {a["run_id"] for a in hooks} == {w1["first_run_id"], w2["first_run_id"]}
    secret = await api.store.tenants_webhook_secret(uuid.UUID(t.id))
    assert [a["signing_secret"] for a in hooks] == [secret, secret]
    assert await lease(["webhook"], webhooks_only=True) == []
    both = await lease(["webhook"])
    assert [a["run_id"] for a in both] == [t2["first_run_id"]]


async def test_the_webhook_secret_endpoints(api: Any) -> None:
    t = await api.tenant()
    other = await api.tenant()
    path = f"/v1/tenants/{t.id}/webhook-secret"
    stored = await api.store.tenants_webhook_secret(uuid.UUID(t.id))

    as_admin = await api.client.get(path, headers=api.admin)
    assert as_admin.status_code == 200, as_admin.text
    assert as_admin.json() == {"tenant_id": t.id, "webhook_secret": stored}
    as_operator = await api.client.get(path, headers=t.headers)
    assert as_operator.status_code == 200 and as_operator.json()["webhook_secret"] == stored

    # Another tenant's key does not even learn the tenant exists; a lesser key of the
    # tenant is told it may not.
    for method, url in (("GET", path), ("POST", f"{path}/rotate")):
        r = await api.client.request(method, url, headers=other.headers)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
        for role in ("viewer", "worker"):
            r = await api.client.request(method, url, headers=await api.key(t, role))
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text
        r = await api.client.request(method, url)
        assert r.status_code == 401
    for missing in (str(uuid.uuid4()), "not-an-id"):
        r = await api.client.get(f"/v1/tenants/{missing}/webhook-secret", headers=api.admin)
        assert r.status_code == 404
    assert await api.store.tenants_webhook_secret(uuid.UUID(t.id)) == stored

    rotated = await api.client.post(f"{path}/rotate", headers=t.headers)
    assert rotated.status_code == 200, rotated.text
    fresh = rotated.json()["webhook_secret"]
    assert fresh != stored and len(fresh) >= 32
    assert (await api.client.get(path, headers=api.admin)).json()["webhook_secret"] == fresh
    assert await api.store.tenants_webhook_secret(uuid.UUID(t.id)) == fresh
    again = await api.client.post(f"{path}/rotate", headers=api.admin)
    assert again.json()["webhook_secret"] not in (stored, fresh)
    # the other tenant's secret never moved
    assert (
        await api.client.get(f"/v1/tenants/{other.id}/webhook-secret", headers=other.headers)
    ).json()["webhook_secret"] == await api.store.tenants_webhook_secret(uuid.UUID(other.id))

    events = (await api.store.events_list(uuid.UUID(t.id), limit=100)).items
    rotations = [e for e in events if e.kind == "tenant.webhook_secret_rotated"]
    assert [e.actor for e in rotations][1:] == ["admin"] and len(rotations) == 2
    assert all(fresh not in json.dumps(e.data) for e in rotations)
