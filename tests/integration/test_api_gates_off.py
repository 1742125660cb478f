"""A server that hands out no reservations (``lease_ahead_max`` 0) hands out no gated
ones either: its registration says so, and a lease asking for them is refused rather
than answered as if they were on."""

from __future__ import annotations

from pathlib import Path

import pytest
from answers import error_of
from test_api_workers import register

from cronwheel.settings import Settings

ADMIN_KEY = "test-admin-key-0123456789"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, admin_key=ADMIN_KEY, lease_ahead_max=0.0)


async def test_no_gated_reservations_without_reservations(api) -> None:
    t = await api.tenant()
    headers = await api.key(t, "worker")
    r = await api.client.post("/v1/workers", json={}, headers=headers)
    assert r.json()["gates_poll"] is False and r.json()["lease_ahead_max"] == 0
    wid = await register(api, headers)
    r = await api.client.post(
        f"/v1/workers/{wid}/lease", json={"max": 1, "gated": 5}, headers=headers
    )
    assert r.status_code == 422
    assert error_of(r)["field"] == "gated"
    r = await api.client.post(f"/v1/workers/{wid}/lease", json={"max": 1}, headers=headers)
    assert r.status_code == 200 and r.json()["attempts"] == []
