"""``cronwheel dlq list|show|redrive`` and ``cronwheel runs retry`` against a real server."""

from __future__ import annotations

import uuid

from tests.integration.test_cli_resources import Server, server

from cronwheel.store import FailItem, create_store

__all__ = ["server"]


async def _dead_letter(server: Server, store_url: str) -> str:
    job = server.json(
        "jobs",
        "create",
        "--name",
        "flaky",
        "--task",
        "t",
        "--delay",
        "3600",
        "--max-attempts",
        "1",
    )
    run_id = job["first_run_id"]
    store = create_store(store_url)
    await store.open()
    try:
        tenant = uuid.UUID(server.tenant_id)
        await store.runs_cancel(tenant, uuid.UUID(run_id))  # then retried through the CLI
        retried = server.json("runs", "retry", run_id)
        assert retried["state"] == "SCHEDULED"
        # Make it a dead letter the way a worker would: lease it and fail its only try.
        await store.shard_leases_acquire(node_id="t", shards=range(256), ttl=60)
        await store.runs_fire(run_ids=[uuid.UUID(run_id)], node_id="t")
        worker = await store.workers_register(
            tenant, pool="default", capabilities=[], tags=[], capacity=1
        )
        leased = await store.attempts_lease(worker=worker, max=10)
        [attempt] = [a for a in leased if str(a.run_id) == run_id]
        await store.attempts_fail_many(
            items=[FailItem(attempt.attempt_id, attempt.fencing_token, "disk full")]
        )
    finally:
        await store.close()
    return run_id


async def test_dlq_list_show_redrive(server: Server, store_url: str) -> None:
    run_id = await _dead_letter(server, store_url)
    listed = server.cli("dlq", "list")
    assert listed.exit_code == 0, listed.output
    assert run_id in listed.output and "disk full" in listed.output
    shown = server.cli("dlq", "show", run_id)
    assert shown.exit_code == 0 and "DEAD_LETTER" in shown.output
    redriven = server.json("dlq", "redrive", run_id)
    assert redriven["state"] == "SCHEDULED"
    assert server.json("dlq", "list")["items"] == []
    again = server.cli("dlq", "redrive", run_id)
    assert again.exit_code == 1 and "illegal_transition" in (again.output + again.stderr)
