"""The app under fuzzing: the real app over a real, migrated store, seeded with a few
objects of every kind, driven synchronously.

Schemathesis runs synchronous Hypothesis tests and sends requests with ``requests``;
the store's connections belong to the event loop that opened them. So the app, its
store and everything seeded live on one event loop owned here, and a ``requests``
adapter hands each request to the app on that loop (in process, no socket).
"""

from __future__ import annotations

import asyncio
import io
import uuid
from collections import Counter
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import requests
import requests.adapters
import urllib3
from asgi_lifespan import LifespanManager

from cronwheel.api import create_app
from cronwheel.settings import Settings, normalise_database_url
from cronwheel.store import Store, create_store
from pg_server import pg_admin, pg_url

__all__ = [
    "ADMIN_KEY",
    "BASE_URL",
    "FUZZ_RESULTS",
    "FuzzTarget",
    "Seeded",
    "fuzz_settings",
    "served_schema",
]

ADMIN_KEY = "fuzz-admin-key-0123456789"
BASE_URL = "http://cronwheel.test"
ALL_SHARDS = range(256)

T = TypeVar("T")

# (backend, requests sent, of which stateful steps, of which served with a 2xx, seconds)
# of each finished fuzz run, for the terminal summary.
FUZZ_RESULTS = pytest.StashKey[list[tuple[str, int, int, int, float]]]()


# Ids kept per parameter: those seeded, then the latest ones learnt from answers.
POOL_MAX = 24


@dataclass
class Seeded:
    """What the fuzzer can aim at: keys of every role, ids that exist and the tenant each
    belongs to, fencing tokens of leased attempts. Seeded at the start, then learnt
    from answers (:meth:`FuzzTarget.observe`)."""

    tenant_id: str = ""
    other_tenant_id: str = ""
    keys: dict[str, str] = field(default_factory=dict)  # role -> the tenant's key (and admin)
    other_keys: dict[str, str] = field(default_factory=dict)  # role -> another tenant's key
    ids: dict[str, list[str]] = field(default_factory=dict)  # parameter name -> ids
    # id -> the tenant it belongs to; "" for none (a worker serving every tenant).
    owners: dict[str, str] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)  # attempt id -> fencing token
    _fixed: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, ident: object, owner: object) -> None:
        if not isinstance(ident, str) or not ident:
            return
        pool = self.ids.setdefault(name, [])
        if ident not in pool:
            pool.append(ident)
            if len(pool) > POOL_MAX:  # forget the oldest learnt id, never a seeded one
                del pool[self._fixed.get(name, 0)]
        self.owners[ident] = owner if isinstance(owner, str) else ""

    def learnt(self, name: str) -> list[str]:
        """The ids of ``name`` learnt from answers, not seeded."""
        return self.ids.get(name, [])[self._fixed.get(name, 0) :]

    def freeze(self) -> None:
        """What is there now was seeded: it stays in the pools."""
        self._fixed = {name: len(pool) for name, pool in self.ids.items()}


class _AppAdapter(requests.adapters.HTTPAdapter):
    """Sends each prepared request to the app on the target's loop."""

    def __init__(self, target: FuzzTarget) -> None:
        super().__init__()
        self._target = target

    def send(  # type: ignore[override]
        self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
    ) -> requests.Response:
        body = request.body
        content = body.encode() if isinstance(body, str) else (body or b"")
        # Headers travel as latin-1 on the wire: the app reads the octets a server would give it.
        headers = [
            (name.encode("latin-1"), value.encode("latin-1") if isinstance(value, str) else value)
            for name, value in request.headers.items()
        ]
        assert request.method is not None and request.url is not None
        answer = self._target.run(
            self._target.client.request(
                request.method, request.url, headers=headers, content=content
            )
        )
        raw = urllib3.HTTPResponse(
            body=io.BytesIO(answer.content),
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in answer.headers.raw],
            status=answer.status_code,
            reason=answer.reason_phrase,
            version=11,
            preload_content=False,
            decode_content=False,
        )
        return self.build_response(request, raw)


def fuzz_settings(data_dir: Path) -> Settings:
    return Settings(
        data_dir=data_dir,
        admin_key=ADMIN_KEY,
        max_payload_bytes=4096,
        # A lease long-poll waits at most this long: generated `wait` values must not
        # make the run slow (larger ones are refused with a 422).
        lease_wait_max=0.02,
        heartbeat_interval=5.0,
        # No rate limits: the fuzzer sends far more a second than a client, and a 429
        # would stand in for the answer under test.
        rate_limit=0,
        worker_rate_limit=0,
        anonymous_rate_limit=0,
    )


def served_schema() -> dict[str, Any]:
    """The schema the app serves at /openapi.json (it does not depend on the store,
    which is not opened here). Tests are generated from it when the module is
    collected; :meth:`FuzzTarget.openapi` checks the running app still serves it."""
    unused = normalise_database_url("sqlite:///unused.db")
    return create_app(fuzz_settings(Path("unused")), create_store(unused)).openapi()


class FuzzTarget:
    """The app on its own event loop over a fresh database (a SQLite file, or a
    PostgreSQL database cloned from the migrated template); :meth:`run` drives a
    coroutine on that loop."""

    def __init__(self, data_dir: Path, *, pg_template: str | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.settings = fuzz_settings(data_dir)
        self._pg_database: str | None = None
        if pg_template is None:
            self.backend = "sqlite"
            database_url = normalise_database_url(f"sqlite:///{data_dir / 'fuzz.db'}")
        else:
            self.backend = "postgresql"
            self._pg_database = f"cw_fuzz_{uuid.uuid4().hex[:12]}"
            self._pg_template = pg_template
            database_url = pg_url(self._pg_database)
        self.store: Store = create_store(database_url)
        self.app = create_app(self.settings, self.store)
        self._lifespan: LifespanManager | None = None
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url=BASE_URL
        )
        self.session = requests.Session()
        self.session.mount("http://", _AppAdapter(self))
        self.seeded = Seeded()
        self.cases = 0  # requests sent, each generated by the fuzzer
        self.steps = 0  # of which steps of stateful scenarios
        # (operation, status) -> how many: what the fuzzer reached, for a look while tuning.
        self.answers: Counter[tuple[str, int]] = Counter()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def start(self) -> None:
        self.run(self._start())

    async def _start(self) -> None:
        if self._pg_database is not None:
            await pg_admin(f'CREATE DATABASE "{self._pg_database}" TEMPLATE "{self._pg_template}"')
        await self.store.open()
        await self.store.migrate()
        self._lifespan = LifespanManager(self.app)  # it needs the running loop
        await self._lifespan.__aenter__()
        await _seed(self)

    def stop(self) -> None:
        try:
            self.run(self._stop())
        finally:
            self.session.close()
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    async def _stop(self) -> None:
        try:
            await self.client.aclose()
            if self._lifespan is not None:
                await self._lifespan.__aexit__(None, None, None)
        finally:
            await self.store.close()
            if self._pg_database is not None:
                await pg_admin(f'DROP DATABASE IF EXISTS "{self._pg_database}" WITH (FORCE)')

    @property
    def served(self) -> int:
        return sum(n for (_, status), n in self.answers.items() if 200 <= status < 300)

    def observe(self, method: str, path: str, status: int, body: Any) -> None:
        """Learn the ids a successful answer names, and dispatch the runs it made due (no
        scheduler runs here), so that later requests can reach them: a created job's
        run is leased, its attempt completed with the token the lease answered."""
        self.answers[(f"{method} {path}", status)] += 1
        if not 200 <= status < 300 or not isinstance(body, dict):
            return
        seeded, fire = self.seeded, False
        if method == "POST" and path in ("/v1/jobs", "/v1/jobs/batch"):
            for job in body.get("items", []) if path.endswith("/batch") else [body]:
                seeded.add("job_id", job.get("id"), job.get("tenant_id"))
                seeded.add("run_id", job.get("first_run_id"), job.get("tenant_id"))
            fire = True
        elif method == "POST" and path.endswith(("/trigger", "/retry", "/redrive")):
            seeded.add("run_id", body.get("id"), body.get("tenant_id"))
            fire = True
        elif method == "POST" and path in ("/v1/dead-letters/redrive", "/v1/jobs/{job_id}/resume"):
            fire = True
        elif method == "POST" and path == "/v1/workers":
            seeded.add("worker_id", body.get("worker_id"), body.get("tenant_id"))
        elif path == "/v1/workers/{worker_id}/lease":
            for attempt in body.get("attempts", []):
                seeded.add("attempt_id", attempt.get("attempt_id"), attempt.get("tenant_id"))
                seeded.add("run_id", attempt.get("run_id"), attempt.get("tenant_id"))
                seeded.tokens[attempt["attempt_id"]] = attempt["fencing_token"]
        elif method == "POST" and path == "/v1/tenants":
            seeded.add("tenant_id", body.get("id"), body.get("id"))
        if fire:
            self.run(_fire(self.store))

    def openapi(self) -> dict[str, Any]:
        """The schema the app serves at /openapi.json."""
        answer = self.run(self.client.get("/openapi.json"))
        assert answer.status_code == 200, answer.text
        schema: dict[str, Any] = answer.json()
        return schema


# -- seeding ---------------------------------------------------------------------------


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _call(
    target: FuzzTarget,
    method: str,
    path: str,
    key: str,
    body: Mapping[str, Any] | None = None,
    *,
    expect: int = 200,
) -> Any:
    answer = await target.client.request(method, path, json=body, headers=_bearer(key))
    assert answer.status_code == expect, (method, path, answer.status_code, answer.text)
    return answer.json()


async def _tenant(target: FuzzTarget, name: str) -> tuple[str, dict[str, str]]:
    """A tenant and a key of every role."""
    made = await _call(target, "POST", "/v1/tenants", ADMIN_KEY, {"name": name}, expect=201)
    keys = {"operator": made["api_key"]}
    for role in ("viewer", "worker"):
        key = await _call(
            target, "POST", f"/v1/tenants/{made['id']}/keys", ADMIN_KEY, {"role": role}, expect=201
        )
        keys[role] = key["api_key"]
    return made["id"], keys


async def _fire(store: Store) -> None:
    """Dispatch every run due by now, as a scheduler owning every shard would."""
    await store.shard_leases_acquire(node_id="fuzz", shards=ALL_SHARDS, ttl=600)
    now = await store.db_now()
    due = await store.runs_due_scan(shards=ALL_SHARDS, until=now + timedelta(seconds=1))
    await store.runs_fire(run_ids=[d.id for d in due], node_id="fuzz")


async def _seed(target: FuzzTarget) -> None:
    """Two tenants; jobs of every kind and state; a run under a live lease, a dead-lettered
    one, a finished one; registered workers; log lines."""
    seeded = target.seeded
    seeded.tenant_id, keys = await _tenant(target, "fuzz-tenant")
    seeded.other_tenant_id, other = await _tenant(target, "fuzz-other")
    seeded.keys = {**keys, "admin": ADMIN_KEY}
    seeded.other_keys = other
    op = keys["operator"]

    async def job(key: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = {"task": "fuzz.task", **spec}
        made: dict[str, Any] = await _call(target, "POST", "/v1/jobs", key, body, expect=201)
        return made

    running = await job(op, {"name": "running", "schedule": {"asap": True}})
    dead = await job(op, {"name": "dead", "schedule": {"asap": True}, "retry": {"max_attempts": 1}})
    done = await job(op, {"name": "done", "schedule": {"asap": True}})
    cron = await job(
        op,
        {
            "name": "cron",
            "schedule": {"cron": "*/5 * * * *", "timezone": "Europe/Paris"},
            "tags": ["fuzz"],
        },
    )
    interval = await job(op, {"name": "interval", "schedule": {"interval": 3600}})
    paused = await job(op, {"name": "paused", "schedule": {"delay": 3600}})
    await _call(target, "POST", f"/v1/jobs/{paused['id']}/pause", op)
    cancelled = await job(op, {"name": "cancelled", "schedule": {"delay": 3600}})
    await _call(target, "POST", f"/v1/jobs/{cancelled['id']}/cancel", op)
    theirs = await job(other["operator"], {"name": "theirs", "schedule": {"asap": True}})
    await _fire(target.store)

    worker = await _call(target, "POST", "/v1/workers", keys["worker"], {"name": "fuzz-worker"})
    their_worker = await _call(target, "POST", "/v1/workers", other["worker"], {})
    wid, their_wid = worker["worker_id"], their_worker["worker_id"]
    leased = await _call(target, "POST", f"/v1/workers/{wid}/lease", keys["worker"], {"max": 10})
    by_run = {a["run_id"]: a for a in leased["attempts"]}
    assert set(by_run) == {running["first_run_id"], dead["first_run_id"], done["first_run_id"]}
    [their_attempt] = (
        await _call(target, "POST", f"/v1/workers/{their_wid}/lease", other["worker"], {"max": 10})
    )["attempts"]
    live = by_run[running["first_run_id"]]
    for attempt in (*by_run.values(), their_attempt):
        seeded.tokens[attempt["attempt_id"]] = attempt["fencing_token"]
    line = {"ts": "2030-01-01T00:00:00Z", "level": "INFO", "message": "hello"}
    await _call(
        target,
        "POST",
        f"/v1/attempts/{live['attempt_id']}/logs",
        keys["worker"],
        {"fencing_token": live["fencing_token"], "lines": [line]},
    )
    ended = by_run[dead["first_run_id"]]
    await _call(
        target,
        "POST",
        f"/v1/attempts/{ended['attempt_id']}/fail",
        keys["worker"],
        {"fencing_token": ended["fencing_token"], "error": "boom"},
    )
    finished = by_run[done["first_run_id"]]
    await _call(
        target,
        "POST",
        f"/v1/attempts/{finished['attempt_id']}/complete",
        keys["worker"],
        {"fencing_token": finished["fencing_token"], "result": {"ok": True}},
    )

    mine, theirs_id = seeded.tenant_id, seeded.other_tenant_id
    for tenant in (mine, theirs_id):
        seeded.add("tenant_id", tenant, tenant)
    for made in (running, dead, done, cron, interval, paused, cancelled, theirs):
        seeded.add("job_id", made["id"], made["tenant_id"])
        seeded.add("run_id", made["first_run_id"], made["tenant_id"])
    seeded.add("worker_id", wid, mine)
    seeded.add("worker_id", their_wid, theirs_id)
    for attempt in (*by_run.values(), their_attempt):
        seeded.add("attempt_id", attempt["attempt_id"], attempt["tenant_id"])
    seeded.freeze()
