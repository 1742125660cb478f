"""Workers failing for real, on real processes (``cronwheel api``, ``cronwheel scheduler``
and ``cronwheel worker`` on PostgreSQL): killed with ``kill -9``, frozen with ``SIGSTOP``
past their lease, handlers that hang past their timeout or always fail, and runs that
no live worker can take. One API and scheduler serve the whole module; each test has
its own tenant, pool and workers."""

from __future__ import annotations

import asyncio
import itertools
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from cronwheel.testing import Cluster
from pg_server import pg_admin, pg_url

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

HERE = Path(__file__).resolve().parent
LIVENESS_BOUND = 30.0  # the requirement: dead workers detected within 30 s
T = TypeVar("T")
Json = dict[str, Any]


# -- the cluster, shared by the module ----------------------------------------------


@pytest.fixture(scope="module")
def cluster(pg_template: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    database = f"cw_faults_{uuid.uuid4().hex[:12]}"
    asyncio.run(pg_admin(f'CREATE DATABASE "{database}" TEMPLATE "{pg_template}"'))
    url = pg_url(database)
    running = Cluster(
        database_url=url,
        workdir=tmp_path_factory.mktemp("faults"),
        python_path=[HERE],
        # Expiry keeps its default sweep; the routing check runs often so that a test
        # does not wait for it.
        extra_env={
            "CRONWHEEL_ROUTE_CHECK_INTERVAL": "0.25",
            "CRONWHEEL_ROUTE_WAIT": "1",
            "CRONWHEEL_METRICS_POOLS": "default,route",  # the gauge test's pool
            "COLUMNS": "250",  # log lines unwrapped
        },
    )
    try:
        running.start("api", "api", "--port", str(running.port))
        running.start("scheduler", "scheduler", "--node-id", "faults-node")
        asyncio.run(running.wait_ready())
        yield running
    finally:
        running.stop()
        asyncio.run(pg_admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


@dataclass
class Tenant:
    cluster: Cluster
    id: str
    operator_key: str
    worker_key: str
    api: httpx.AsyncClient  # as the tenant's operator
    marks: Path  # where the handlers leave their marks
    workers: list[str]

    def start_worker(self, name: str, pool: str, **options: Any) -> None:
        self.cluster.start_worker(
            name, self.worker_key, pool=pool, module="fault_tasks", grace_period=1, **options
        )
        self.workers.append(name)

    async def job(self, **fields: Any) -> str:
        """Create an as-soon-as-possible job; return its run's id."""
        body: Json = {"name": "fault", "schedule": {"asap": True}, **fields}
        body["payload"] = {"dir": str(self.marks), **body.get("payload", {})}
        r = await self.api.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["first_run_id"])

    async def run(self, run_id: str) -> Json:
        r = await self.api.get(f"/v1/runs/{run_id}")
        assert r.status_code == 200, r.text
        body: Json = r.json()
        return body

    async def until(
        self, what: str, check: Callable[[], Awaitable[T | None]], timeout: float = 60
    ) -> T:
        """Poll ``check`` until it returns something true, with a deadline."""
        value: T = await self.cluster.wait_until(check, timeout, what=what)
        return value

    async def run_in(self, run_id: str, *states: str, timeout: float = 60) -> Json:
        async def check() -> Json | None:
            run = await self.run(run_id)
            return run if run["state"] in states else None

        return await self.until(f"run {run_id} {'/'.join(states)}", check, timeout)

    async def mark(self, run_id: str, what: str, timeout: float = 30) -> None:
        path = self.marks / f"{run_id}.{what}"

        async def check() -> bool:
            return path.exists()

        await self.until(f"mark {path.name}", check, timeout)


@pytest.fixture
async def tenant(cluster: Cluster, tmp_path: Path) -> AsyncIterator[Tenant]:
    tenant_id, operator_key, worker_key = await cluster.tenant(f"faults-{uuid.uuid4().hex[:8]}")
    headers = {"Authorization": f"Bearer {operator_key}"}
    async with httpx.AsyncClient(base_url=cluster.url, headers=headers, timeout=30) as api:
        t = Tenant(cluster, tenant_id, operator_key, worker_key, api, tmp_path, [])
        try:
            yield t
        finally:
            cluster.stop(t.workers)
            for name in t.workers:
                cluster.procs.pop(name, None)


def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _seconds(start: str, end: str) -> float:
    return (_instant(end) - _instant(start)).total_seconds()


def _detection(attempt: Json) -> float:
    """From the worker's last heartbeat (or its lease, if it never beat) to the
    attempt being declared lost."""
    assert attempt["state"] == "LOST", attempt
    return _seconds(attempt["heartbeat_at"] or attempt["started_at"], attempt["finished_at"])


def _transitions(run: Json) -> list[tuple[str | None, str | None]]:
    return [
        (e["from_state"], e["to_state"]) for e in run["events"] if e["kind"] == "run.transition"
    ]


# -- 1. kill -9 ------------------------------------------------------------------------


async def test_a_killed_workers_runs_go_to_another_worker(tenant: Tenant) -> None:
    """Two runs held by a worker killed with ``kill -9``: each attempt is declared lost
    when its lease expires — within 30 s of the last heartbeat with the default
    heartbeat timeout, sooner with a shorter one — and another worker finishes it."""
    pool = "kill"
    default = await tenant.job(task="fault.hold", pool=pool)
    short = await tenant.job(task="fault.hold", pool=pool, heartbeat_timeout=3)
    tenant.start_worker("kill-a", pool, concurrency=2)
    for run_id in (default, short):
        await tenant.mark(run_id, "1.started")
    tenant.start_worker("kill-b", pool)  # idle: everything is held by kill-a
    tenant.cluster.kill("kill-a")

    done = {r: await tenant.run_in(r, "SUCCESS", timeout=90) for r in (default, short)}
    detected = {}
    for run_id, run in done.items():
        lost, second = run["attempts"]
        assert (lost["state"], second["state"]) == ("LOST", "SUCCEEDED")
        assert second["worker_id"] != lost["worker_id"]  # re-leased by the other worker
        assert run["result"] == {"attempt": 2}
        detected[run_id] = _detection(lost)
        # Never before the lease ran out.
        assert detected[run_id] >= run["heartbeat_timeout"] - 0.01, detected

    assert done[default]["heartbeat_timeout"] < LIVENESS_BOUND  # the job left the default
    assert detected[default] <= LIVENESS_BOUND, f"detected after {detected[default]:.2f} s"
    assert done[short]["heartbeat_timeout"] == 3
    assert detected[short] < detected[default]
    assert detected[short] <= 3 + 5, f"detected after {detected[short]:.2f} s"


# -- 2. SIGSTOP past the lease ------------------------------------------------------------


async def test_a_frozen_worker_cannot_complete_a_run_another_finished(tenant: Tenant) -> None:
    """A worker frozen past its lease: the run goes to another worker and succeeds;
    thawed, the first worker's completion is refused for its stale fencing token and
    the result stays the second worker's."""
    pool = "freeze"
    retry = {"max_attempts": 3, "initial_delay": 0.1, "jitter": "none"}
    run_id = await tenant.job(task="fault.hold", pool=pool, heartbeat_timeout=2, retry=retry)
    tenant.start_worker("freeze-a", pool)
    await tenant.mark(run_id, "1.started")
    tenant.cluster.pause("freeze-a")
    tenant.start_worker("freeze-b", pool)

    run = await tenant.run_in(run_id, "SUCCESS")
    first, second = run["attempts"]
    assert (first["state"], second["state"]) == ("LOST", "SUCCEEDED")
    assert run["result"] == {"attempt": 2}

    # Thawed, the first attempt's handler returns; its completion is refused.
    (tenant.marks / f"{run_id}.go").touch()
    tenant.cluster.resume("freeze-a")

    rejected = (
        f"worker.outcome_rejected attempt_id={first['id']} outcome=succeeded "
        "error=stale_fencing_token"
    )

    async def refused() -> bool:
        return rejected in " ".join(tenant.cluster.log("freeze-a").split())

    await tenant.until("the frozen worker's completion refused", refused, timeout=30)
    # The same completion sent again is a 409 that changes nothing.
    worker = {"Authorization": f"Bearer {tenant.worker_key}"}
    late = await tenant.api.post(
        f"/v1/attempts/{first['id']}/complete",
        json={"fencing_token": first["fencing_token"], "result": {"attempt": 1}},
        headers=worker,
    )
    assert late.status_code == 409, late.text
    assert late.json()["error"]["code"] == "stale_fencing_token"

    after = await tenant.run(run_id)
    assert (after["state"], after["result"]) == ("SUCCESS", {"attempt": 2})
    assert [a["state"] for a in after["attempts"]] == ["LOST", "SUCCEEDED"]
    assert _transitions(after).count(("RUNNING", "SUCCESS")) == 1
    assert second["fencing_token"] > first["fencing_token"]


# -- 3. hanging past the timeout --------------------------------------------------------


async def test_a_handler_hanging_past_its_timeout_is_timed_out_and_retried(
    tenant: Tenant,
) -> None:
    """An async handler is cancelled by the worker at the timeout, a sync one is asked
    to stop once the server has timed its attempt out; either way the attempt ends
    TIMED_OUT and the run is retried and succeeds."""
    pool = "hang"
    retry = {"max_attempts": 2, "initial_delay": 0.1, "jitter": "none"}
    common: Json = {"pool": pool, "timeout": 2, "heartbeat_timeout": 3, "retry": retry}
    runs = {
        "async": await tenant.job(task="fault.hang", **common),
        "sync": await tenant.job(task="fault.hang_sync", **common),
    }
    tenant.start_worker("hang-a", pool, concurrency=3)

    for kind, run_id in runs.items():
        run = await tenant.run_in(run_id, "SUCCESS")
        first, second = run["attempts"]
        assert (first["state"], second["state"]) == ("TIMED_OUT", "SUCCEEDED"), (kind, run)
        assert run["result"] == {"attempt": 2}
        ran = _seconds(first["started_at"], first["finished_at"])
        assert ran >= 2 - 0.01, (kind, ran)  # never before the deadline
        retried = [e["reason"] or "" for e in run["events"] if e["to_state"] == "SCHEDULED"]
        assert any(r.startswith("retry 2 of 2") for r in retried), (kind, retried)
        # The worker stopped the handler itself (cancelled, or asked to stop).
        await tenant.mark(run_id, "1.cancelled")


# -- 4. always failing ------------------------------------------------------------------


def _backoff_bounds(policy: Json, failed_attempt: int) -> tuple[float, float]:
    """The delays the retry policy allows after ``failed_attempt`` failed."""
    base = min(
        policy["max_delay"], policy["initial_delay"] * policy["multiplier"] ** (failed_attempt - 1)
    )
    return {"full": (0.0, base), "equal": (base / 2, base), "none": (base, base)}[policy["jitter"]]


_RETRY_IN = re.compile(r"^retry (\d+) of (\d+) in ([0-9.]+) s")


def _check_series(run: Json, attempts: list[Json], policy: Json) -> None:
    """Each gap between consecutive attempts follows the policy: the delay drawn (in the
    event's reason) lies within the jitter bounds, and the next attempt starts no
    sooner than that delay after the failure, and not much later."""
    drawn: dict[int, float] = {}
    for event in run["events"]:
        match = _RETRY_IN.match(event["reason"] or "")
        if event["kind"] == "run.transition" and match:
            drawn[int(match.group(1)) - 1] = float(match.group(3))
    for failed, following in itertools.pairwise(attempts):
        number = failed["number"]
        low, high = _backoff_bounds(policy, number)
        delay = drawn[number]
        assert low - 0.005 <= delay <= high + 0.005, (number, delay, low, high)
        gap = _seconds(failed["finished_at"], following["started_at"])
        assert delay - 0.01 <= gap <= delay + 10, (number, gap, delay)


async def test_a_handler_that_always_fails_ends_dead_letter_and_redrives(tenant: Tenant) -> None:
    pool = "fail"
    policy: Json = {
        "max_attempts": 4,
        "initial_delay": 0.4,
        "multiplier": 2.0,
        "max_delay": 1.0,
        "jitter": "equal",
    }
    run_id = await tenant.job(task="fault.fail", pool=pool, retry=policy)
    tenant.start_worker("fail-a", pool)

    run = await tenant.run_in(run_id, "DEAD_LETTER")
    attempts = run["attempts"]
    assert [a["number"] for a in attempts] == [1, 2, 3, 4]
    assert all(a["state"] == "FAILED" for a in attempts)
    assert run["reason"].startswith("gave up after 4 attempts")
    assert "fails, as every attempt does" in run["last_error"]
    _check_series(run, attempts, policy)

    redriven = await tenant.api.post(f"/v1/runs/{run_id}/redrive", json={"reason": "try again"})
    assert redriven.status_code == 200, redriven.text
    assert redriven.json()["state"] == "SCHEDULED"

    async def second_series() -> Json | None:
        now = await tenant.run(run_id)
        return now if now["state"] == "DEAD_LETTER" and len(now["attempts"]) == 8 else None

    again = await tenant.until("a second dead letter", second_series)
    assert [a["number"] for a in again["attempts"]] == list(range(1, 9))
    assert again["max_attempts"] == 8
    assert again["reason"].startswith("gave up after 8 attempts")
    _check_series(again, again["attempts"][4:], policy)
    transitions = _transitions(again)
    assert transitions.count(("DEAD_LETTER", "SCHEDULED")) == 1
    assert transitions.count(("RUNNING", "DEAD_LETTER")) == 2


# -- 5. no worker can take it -------------------------------------------------------------


def _gauge(text: str, pool: str) -> float | None:
    match = re.search(
        rf'^cronwheel_runs_unroutable\{{pool="{re.escape(pool)}"\}} (\S+)$', text, re.MULTILINE
    )
    return None if match is None else float(match.group(1))


async def test_a_run_no_worker_can_take_waits_with_its_reason(tenant: Tenant) -> None:
    pool = "route"
    reason = f"no live worker in pool {pool!r} has capabilities ['cuda']"
    tenant.start_worker("route-plain", pool)  # alive, but cannot run it
    run_id = await tenant.job(task="fault.hold", pool=pool, requires=["cuda"])

    async def waiting() -> Json | None:
        run = await tenant.run(run_id)
        return run if run["wait_reason"] else None

    run = await tenant.until("the wait reason", waiting, timeout=30)
    assert (run["state"], run["wait_reason"]) == ("DISPATCHED", reason)

    alerts = (await tenant.api.get("/v1/alerts")).json()["items"]
    assert [(a["kind"], a["pool"], a["requires"], a["runs"]) for a in alerts] == [
        ("unroutable_runs", pool, ["cuda"], 1)
    ]
    assert alerts[0]["message"] == f"1 run waiting: {reason}"

    def gauge_is(value: float) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            admin = {"Authorization": f"Bearer {tenant.cluster.admin_key}"}
            return _gauge((await tenant.api.get("/metrics", headers=admin)).text, pool) == value

        return check

    await tenant.until("the gauge at 1", gauge_is(1.0), timeout=30)

    (tenant.marks / f"{run_id}.go").touch()  # its first attempt may finish at once
    tenant.start_worker("route-cuda", pool, capabilities=["cuda"])
    done = await tenant.run_in(run_id, "SUCCESS")
    assert done["wait_reason"] is None
    assert (await tenant.api.get("/v1/alerts")).json()["items"] == []
    await tenant.until("the gauge back at 0", gauge_is(0.0), timeout=30)
    waits = [e for e in done["events"] if e["kind"] == "run.waiting"]
    assert [e["reason"] for e in waits] == [reason]  # recorded once, not every check
