"""Long-polls woken together by one notice share a large batch of ready runs: a batch
made ready at once (a 1,000-node fan-out) reaches several waiting workers, a part each,
leased side by side instead of all by the first one to wake; a small batch goes to one."""

from __future__ import annotations

import asyncio
from typing import Any

from cronwheel.store.values import SHARE_MIN
from cronwheel.testing import wait_until_async


async def _waiting_workers(api: Any, count: int) -> tuple[list[asyncio.Task[Any]], Any]:
    t = await api.tenant()
    worker = await api.key(t, "worker")
    # Only the notice wakes them: a long-poll re-polling on its timer as the runs are
    # fired would lease alone, outside the cohort (taking all it can).
    api.app.state.api.lease_poll_interval = 60.0
    polls = []
    for _ in range(count):
        r = await api.client.post("/v1/workers", json={"pool": "default"}, headers=worker)
        worker_id = r.json()["worker_id"]
        polls.append(
            asyncio.create_task(
                api.client.post(
                    f"/v1/workers/{worker_id}/lease",
                    json={"max": 1000, "wait": 10},
                    headers=worker,
                )
            )
        )
    notifier = api.app.state.api.notifier
    await wait_until_async(lambda: notifier.waiting == count)
    return polls, t


async def _make_ready(api: Any, t: Any, count: int) -> None:
    for start in range(0, count, 1000):
        jobs = [
            {"name": f"j{i}", "schedule": {"asap": True}, "task": "t.run"}
            for i in range(start, min(count, start + 1000))
        ]
        r = await api.client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=t.headers)
        assert r.status_code == 201, r.text
    assert len(await api.fire()) == count  # one notice for them all


async def test_workers_woken_together_each_lease_a_share_of_a_large_batch(api) -> None:
    polls, t = await _waiting_workers(api, 3)
    await _make_ready(api, t, 3 * SHARE_MIN)
    answers = await asyncio.wait_for(asyncio.gather(*polls), 20)
    # The batch each can take (1,000, its most) in parts of SHARE_MIN: all three.
    taken = [[a["run_id"] for a in r.json()["attempts"]] for r in answers]
    assert sorted(len(ids) for ids in taken) == [SHARE_MIN] * 3
    every = [run_id for ids in taken for run_id in ids]
    assert len(set(every)) == 3 * SHARE_MIN


async def test_a_small_batch_goes_to_one_of_the_woken_workers(api) -> None:
    polls, t = await _waiting_workers(api, 3)
    await _make_ready(api, t, SHARE_MIN)
    # The first to lease takes it all; the others find nothing and wait on.
    done, pending = await asyncio.wait(polls, timeout=20, return_when=asyncio.FIRST_COMPLETED)
    [first] = done
    assert len(first.result().json()["attempts"]) == SHARE_MIN
    for poll in pending:
        poll.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def test_leases_woken_together_that_admission_holds_back_do_not_wake_each_other(
    api,
) -> None:
    """Workers whose free slots are all kept for P0, and only P2 runs ready: the
    cohort one notice wakes takes nothing, and looks again at its poll, not in a loop
    of rounds waking each other."""
    r = await api.client.put(
        "/v1/pools/default", json={"p0_reserved_share": 0.5}, headers=api.admin
    )
    assert r.status_code == 200, r.text
    t = await api.tenant()
    worker = await api.key(t, "worker")
    state = api.app.state.api
    rounds = 0
    lease = state.store.attempts_lease_admitted

    async def counted(**kwargs: Any) -> Any:
        nonlocal rounds
        rounds += 1
        return await lease(**kwargs)

    state.store.attempts_lease_admitted = counted
    polls = []
    for _ in range(3):
        r = await api.client.post(
            "/v1/workers", json={"pool": "default", "capacity": 2}, headers=worker
        )
        worker_id = r.json()["worker_id"]
        polls.append(
            asyncio.create_task(
                api.client.post(
                    f"/v1/workers/{worker_id}/lease", json={"max": 1, "wait": 10}, headers=worker
                )
            )
        )
    await wait_until_async(lambda: state.notifier.waiting == 3)
    before = rounds
    await _make_ready(api, t, 10)
    await asyncio.sleep(0.8)
    # Each long-poll reads once on the notice, then at its poll (a second): three, give
    # or take a wake-up. Waking each other, they made 9 on PostgreSQL, 57 on SQLite.
    assert rounds - before <= 6
    assert not any(poll.done() for poll in polls)
    for poll in polls:
        poll.cancel()
    await asyncio.gather(*polls, return_exceptions=True)
