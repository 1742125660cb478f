"""Routing on real processes, both backends: two ``cronwheel worker`` processes share a
pool with different handlers (each declares its tasks when it registers) and one carries
the tag ``red``. Every run goes to the worker that has its handler and, when the job has
route tags, carries them; none fails for want of a handler; a run no worker can take
waits with a reason and an alert."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from cronwheel.testing import Cluster

pytestmark = [pytest.mark.e2e]

HERE = Path(__file__).resolve().parent
POOL = "mixed"


async def test_each_run_goes_to_a_worker_that_can_run_it(store_url: str, tmp_path: Path) -> None:
    cluster = Cluster(
        database_url=store_url,
        workdir=tmp_path,
        python_path=[HERE],
        # The routing check runs often, so that the test does not wait for it.
        extra_env={"CRONWHEEL_ROUTE_CHECK_INTERVAL": "0.25", "CRONWHEEL_ROUTE_WAIT": "1"},
    )
    try:
        cluster.start_server(schedulers=1)
        await cluster.wait_ready()
        _tenant, operator_key, worker_key = await cluster.tenant("routing")
        cluster.start_worker("echoer", worker_key, pool=POOL, module="e2e_tasks", concurrency=5)
        cluster.start_worker(
            "shouter", worker_key, pool=POOL, module="routing_tasks", concurrency=5, tags=["red"]
        )
        headers = {"Authorization": f"Bearer {operator_key}"}
        async with httpx.AsyncClient(base_url=cluster.url, headers=headers) as client:

            async def job(task: str, **fields: Any) -> str:
                body = {"name": task, "schedule": {"asap": True}, "task": task, "pool": POOL}
                r = await client.post("/v1/jobs", json={**body, **fields})
                assert r.status_code == 201, r.text
                return str(r.json()["id"])

            async def run_of(job_id: str) -> dict[str, Any]:
                page = (await client.get("/v1/runs", params={"job_id": job_id})).json()
                [run] = page["items"]
                detail: dict[str, Any] = (await client.get(f"/v1/runs/{run['id']}")).json()
                return detail

            echo = [await job("e2e.echo", payload={"n": n}) for n in range(4)]
            shout = [await job("e2e.shout", payload={"word": "hi"}) for _ in range(4)]
            shout.append(await job("e2e.shout", route_tags=["red"], payload={"word": "red"}))
            # The echoer runs e2e.echo but lacks the tag; the shouter has it but not the task.
            red_echo = await job("e2e.echo", route_tags=["red"])
            nobodys = await job("e2e.nobody")

            async def all_succeeded() -> bool:
                states = [(await run_of(j))["state"] for j in echo + shout]
                return states == ["SUCCESS"] * len(states)

            await cluster.wait_until(all_succeeded, 60, what="every runnable run to succeed")
            names = {w["id"]: w["name"] for w in (await client.get("/v1/workers")).json()["items"]}
            for job_ids, name in ((echo, "echoer"), (shout, "shouter")):
                for job_id in job_ids:
                    run = await run_of(job_id)
                    assert [names[a["worker_id"]] for a in run["attempts"]] == [name], run

            async def both_wait_with_reasons() -> bool:
                reasons = [(await run_of(j))["wait_reason"] for j in (red_echo, nobodys)]
                return all(reasons)

            await cluster.wait_until(both_wait_with_reasons, 30, what="wait reasons to be set")
            red = await run_of(red_echo)
            assert (red["state"], red["attempts"]) == ("DISPATCHED", [])
            assert "'e2e.echo'" in red["wait_reason"] and "['red']" in red["wait_reason"]
            nobody = await run_of(nobodys)
            assert (nobody["state"], nobody["attempts"]) == ("DISPATCHED", [])
            assert "handles task 'e2e.nobody'" in nobody["wait_reason"]
            alerts = (await client.get("/v1/alerts")).json()["items"]
            messages = [a["message"] for a in alerts if a["kind"] == "unroutable_runs"]
            assert any(red["wait_reason"] in m for m in messages), messages
            assert any(nobody["wait_reason"] in m for m in messages), messages
            for state in ("FAILED", "DEAD_LETTER"):
                failed = (await client.get("/v1/runs", params={"state": state})).json()
                assert failed["items"] == [], failed
    finally:
        cluster.stop()
