"""The JSON that carries new jobs' rows to PostgreSQL (``postgres_jobs``): the documents
of a small batch and the JSON columns' values of a large one (COPY) — the fast encoder
and its fallback write the same values ``json`` would."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from asyncpg.pgproto.pgproto import UUID as AsyncpgUUID

from cronwheel.store.drivers.postgres_jobs import _document, _json_text

_ID = uuid.UUID("01a23c18-6175-75b5-a43c-82fd1b7220dc")
_AT = datetime(2026, 12, 3, 13, 29, 18, 600311, tzinfo=UTC)


def _slow(rows: list[dict[str, Any]]) -> Any:
    def plain(value: Any) -> Any:
        return value.isoformat() if isinstance(value, datetime) else str(value)

    return json.loads(json.dumps(rows, default=plain))


@pytest.mark.parametrize(
    "row",
    [
        {"id": _ID, "at": _AT, "payload": {"n": 1, "s": "é\u2028", "f": 1e16, "x": None}},
        # A tenant id read back from the database is asyncpg's own UUID type.
        {"tenant_id": AsyncpgUUID(_ID.bytes), "at": _AT},
        {"at": _AT.astimezone(timezone(timedelta(hours=5, minutes=30)))},
        # Past 64 bits: the fast encoder refuses it, the fallback writes it.
        {"payload": {"big": 2**70, "neg": -(2**64)}},
    ],
)
def test_a_document_holds_the_rows_values_as_json_writes_them(row: dict[str, Any]) -> None:
    assert json.loads(_document([row])) == _slow([row])


@pytest.mark.parametrize(
    "value",
    [
        {"n": 1, "s": "é\u2028", "f": 1e16, "x": None, "at": _AT, "id": _ID},
        [AsyncpgUUID(_ID.bytes)],
        {"big": 2**70, "neg": -(2**64)},
    ],
)
def test_a_json_column_value_is_written_as_json_writes_it(value: Any) -> None:
    assert json.loads(_json_text(value)) == _slow([value])[0]
