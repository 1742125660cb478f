"""The bootstrap admin key lives in the database: made once by the first process that
finds none, known by every API process (each with a data directory of its own), kept
in the data directory as well on SQLite only — and CRONWHEEL_ADMIN_KEY as before."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager

from cronwheel.api import create_app
from cronwheel.api.auth import hash_key
from cronwheel.runtime import ADMIN_KEY_FILE, AdminKey, ensure_admin_key
from cronwheel.settings import Settings
from cronwheel.store import Store


def node(tmp_path: Path, name: str, **fields: object) -> Settings:
    """The settings of an API process with a data directory of its own."""
    return Settings(**{"data_dir": tmp_path / name, "admin_key": None, **fields})  # type: ignore[arg-type]


async def test_made_once_and_known_to_every_node(store: Store, tmp_path: Path) -> None:
    first = await ensure_admin_key(node(tmp_path, "a"), store)
    assert first.created and first.key is not None and first.key.startswith("cw_")
    found = await store.api_keys_get_by_hash(key_hash=hash_key(first.key))
    assert found is not None and (found.role, found.tenant_id) == ("admin", None)
    file = tmp_path / "a" / ADMIN_KEY_FILE
    if store.dialect == "sqlite":  # one machine: kept beside the database, as before
        assert first.path == file
        assert file.read_text().strip() == first.key
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
        assert await ensure_admin_key(node(tmp_path, "a"), store) == AdminKey(
            first.key, created=False, path=file
        )
    else:  # shown once, kept nowhere but hashed in the database
        assert first.path is None and not file.exists()
    # Another node (another data directory) makes none and does not know its text.
    assert await ensure_admin_key(node(tmp_path, "b"), store) == AdminKey(
        None, created=False, path=None
    )
    assert not (tmp_path / "b" / ADMIN_KEY_FILE).exists()

    # That node's API accepts the key all the same: it is in the database.
    app = create_app(node(tmp_path, "b"), store)
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://b.test") as client:
            admin = {"Authorization": f"Bearer {first.key}"}
            assert (await client.get("/v1/tenants", headers=admin)).status_code == 200
            assert (await client.get("/metrics", headers=admin)).status_code == 200
            r = await client.post("/v1/tenants", json={"name": "made-on-b"}, headers=admin)
            assert r.status_code == 201, r.text


async def test_the_environments_key_makes_none(store: Store, tmp_path: Path) -> None:
    settings = node(tmp_path, "a", admin_key="from-the-environment")
    assert await ensure_admin_key(settings, store) == AdminKey(
        "from-the-environment", created=False, path=None
    )
    assert not (tmp_path / "a" / ADMIN_KEY_FILE).exists()
    made = await ensure_admin_key(node(tmp_path, "a"), store)
    assert made.created  # nothing was made before


async def test_a_key_file_from_before_becomes_the_databases(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An upgrade keeps the admin key people have: the first data directory's key file
    becomes the database's key; another node's different file no longer counts."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ADMIN_KEY_FILE).write_text("cw_kept-from-before\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / ADMIN_KEY_FILE).write_text("cw_another-nodes-own\n")

    kept = await ensure_admin_key(node(tmp_path, "a"), store)
    assert kept == AdminKey("cw_kept-from-before", created=False, path=tmp_path / "a" / "admin.key")
    found = await store.api_keys_get_by_hash(key_hash=hash_key("cw_kept-from-before"))
    assert found is not None and found.role == "admin"

    with caplog.at_level(logging.WARNING, logger="cronwheel.runtime"):
        other = await ensure_admin_key(node(tmp_path, "b"), store)
    assert other == AdminKey(None, created=False, path=None)
    assert "is not this database's admin key" in caplog.text
    assert await store.api_keys_get_by_hash(key_hash=hash_key("cw_another-nodes-own")) is None
