"""The binary COPY data of a creation's rows (jobs, runs, events, audit), encoded here
instead of value by value in asyncpg's ``copy_records_to_table``.

asyncpg encodes each value through its type's codec, and for three of the types these
rows are made of that means Python work per value: an aware instant (2 µs: a UTC copy,
a ``timedelta``), a UUID (the ``bytes`` property), a jsonb value (SQLAlchemy's codec, a
Python function). A batch of 1,000 jobs is 4,000 rows and 65,000 values: 31 ms of the
API's CPU, a fifth of the batch's. Yet most of a part's columns hold one value in
every row (the tenant, the instant of creation, the state, the pool and timeouts of
templates alike): here each column is looked at whole (one C-speed ``count``), a
column of one value is encoded once, and only the others value by value; the rows are
then joined at C speed::

    rows ─▶ columns ─┬─ one value in all ─▶ encoded once, repeated
                     └─ values differ ─────▶ each encoded (map)
                                            ─▶ rows joined ─▶ header + rows + trailer

PostgreSQL's binary COPY format: a header, then each row as its field count (int16)
and each field as its length (int32, -1 for NULL) and its value in the type's binary
form (the same bytes asyncpg sends), then a trailer (int16 -1). A jsonb value is its
format version (1) and its text, written by orjson.
"""

from __future__ import annotations

import functools
import json
import struct
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

from cronwheel.store.schema import audit, events, jobs, runs

__all__ = ["copy_data", "json_plain"]

_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, flags, no header extension
_TRAILER = b"\xff\xff"
_NULL = b"\xff\xff\xff\xff"
_LENGTH = struct.Struct(">i").pack
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # PostgreSQL's
_MICRO = timedelta(microseconds=1)

_Encoder = Callable[[Any], bytes]


def json_plain(value: Any) -> Any:
    """What orjson asks about: asyncpg's own UUID type (a tenant id read from the
    database), an instant in ``json``'s fallback."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _fixed(fmt: str) -> _Encoder:
    packed = struct.Struct(">i" + fmt)
    size = packed.size - 4
    pack = packed.pack

    def encode(value: Any) -> bytes:
        return _NULL if value is None else pack(size, value)

    return encode


def _uuid(value: uuid.UUID | None) -> bytes:
    return _NULL if value is None else b"\x00\x00\x00\x10" + value.bytes


def _text(value: str | None) -> bytes:
    if value is None:
        return _NULL
    data = value.encode()
    return _LENGTH(len(data)) + data


_INSTANT = struct.Struct(">iq").pack


def _instant(value: Any) -> bytes:
    # A naive value fails here (no offset to subtract): the store refuses it anyway.
    return _NULL if value is None else _INSTANT(8, (value - _EPOCH) // _MICRO)


_EMPTY_LIST = b"\x00\x00\x00\x03\x01[]"


def _jsonb(value: Any) -> bytes:
    if value is None:
        return _NULL
    if value.__class__ is list and not value:
        return _EMPTY_LIST  # requires, tags, route_tags: most often none
    try:
        text = orjson.dumps(value, default=json_plain)
    except orjson.JSONEncodeError:  # an integer past 64 bits, a key that is not text
        text = json.dumps(value, default=json_plain, separators=(",", ":")).encode()
    return _LENGTH(len(text) + 1) + b"\x01" + text


# By the column's type as PostgreSQL names it (its SQLAlchemy type compiled).
_BY_TYPE: dict[str, _Encoder] = {
    "UUID": _uuid,
    "VARCHAR": _text,
    "TEXT": _text,
    "SMALLINT": _fixed("h"),
    "INTEGER": _fixed("i"),
    "BIGINT": _fixed("q"),
    "FLOAT": _fixed("d"),  # FLOAT without a precision is double precision
    "BOOLEAN": _fixed("?"),
    "TIMESTAMP WITH TIME ZONE": _instant,
    "JSONB": _jsonb,
}


_DIALECT: Dialect = postgresql.dialect()  # type: ignore[no-untyped-call]


def _encoder(column: sa.Column[Any]) -> _Encoder:
    name = column.type.compile(dialect=_DIALECT).split("(", 1)[0]
    return _BY_TYPE[name]


_TABLES = {table.name: table for table in (jobs, runs, events, audit)}


@functools.lru_cache(maxsize=32)
def _encoders(table: str, columns: tuple[str, ...]) -> tuple[tuple[_Encoder, bool], ...]:
    """Each column's encoder, and whether a column of equal values may be encoded
    once: not jsonb (``1`` equals ``1.0`` and ``True`` but is written otherwise)."""
    found = _TABLES[table].c
    return tuple((enc, enc is not _jsonb) for enc in (_encoder(found[name]) for name in columns))


def copy_data(table: str, columns: tuple[str, ...], rows: Sequence[Sequence[Any]]) -> bytes:
    """``rows`` (each a record of ``columns``' values) as binary COPY data."""
    if not rows:
        return _HEADER + _TRAILER
    count = len(rows)
    fields: list[Sequence[bytes]] = [[struct.pack(">h", len(columns))] * count]
    for values, (encode, foldable) in zip(
        zip(*rows, strict=True), _encoders(table, columns), strict=True
    ):
        first = values[0]
        if (
            (first is None or (foldable and not (first.__class__ is float and first == 0)))
            and values[-1] == first  # one comparison tells most columns that vary
            and values.count(first) == count
        ):
            # One value in every row (a float zero aside: -0.0 equals it).
            fields.append([encode(first)] * count)
        elif encode is _text:
            # A few values repeated (an event's kind): each encoded once.
            distinct = set(values)
            if len(distinct) * 4 < count:
                fields.append(list(map({v: _text(v) for v in distinct}.__getitem__, values)))
            else:
                fields.append(list(map(_text, values)))
        else:
            fields.append(list(map(encode, values)))
    return b"".join((_HEADER, *map(b"".join, zip(*fields, strict=True)), _TRAILER))
