"""JSON columns read back as written, on both backends: the stores read them through
``jsontext.loads`` (orjson where it agrees with ``json``), so an integer past 64 bits
must come back an integer, a float a float, and text as it was."""

from __future__ import annotations

from typing import Any

from cronwheel.store import CompleteItem, Store

from .helpers import T0, leased_run, make_tenant

VALUES: dict[str, Any] = {
    "big": 2**70,
    "negative_big": -(10**25),
    "edge": 2**63,
    "float": 1.0,
    "tiny": 5e-324,
    "text": "zürich ✓ 東京",
    "nested": [{"a": [1, 2.5, None, True]}],
}


async def test_payloads_and_results_come_back_as_written(store: Store) -> None:
    tenant = await make_tenant(store)
    run, attempt = await leased_run(store, tenant.id, payload=VALUES)
    assert run.payload == VALUES
    assert isinstance(run.payload["big"], int) and isinstance(run.payload["float"], float)
    [done] = await store.attempts_complete_many(
        items=[CompleteItem(attempt.attempt_id, attempt.fencing_token, VALUES)], now=T0
    )
    assert done.ok
    result = (await store.runs_get(tenant.id, run.id)).result
    assert result == VALUES
    assert type(result["big"]) is int and type(result["edge"]) is int
    assert type(result["float"]) is float
