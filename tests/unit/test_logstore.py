"""The log stores' contract, held by the file store and the database store alike (on
PostgreSQL): lines kept in order per attempt, the cap and its marker, reading across
attempts with a cursor, and appends from many threads and processes at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cronwheel.domain.errors import ValidationError
from cronwheel.logstore import MARKER_BYTES, FileLogStore, LogEntry, LogLine, LogStore
from cronwheel.logstore_db import DatabaseLogStore
from cronwheel.store import create_store

T0 = datetime(2031, 3, 4, 12, 0, tzinfo=UTC)
TENANT = uuid.UUID("00000000-0000-0000-0000-00000000000a")


def entries(*messages: str, level: str = "INFO") -> list[LogEntry]:
    return [LogEntry(T0 + timedelta(seconds=i), level, m) for i, m in enumerate(messages)]


def messages(lines: list[LogLine]) -> list[str]:
    return [line.message for line in lines]


async def read_all(store: LogStore, run_id: uuid.UUID, **kwargs: object) -> list[LogLine]:
    page = await store.read(TENANT, run_id=run_id, limit=1000, **kwargs)  # type: ignore[arg-type]
    assert page.next_cursor is None
    return page.lines


@pytest.fixture(params=["files", "database"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(kind: str, request: pytest.FixtureRequest) -> str | None:
    """A fresh PostgreSQL database for the database store."""
    return str(request.getfixturevalue("pg_url")) if kind == "database" else None


@contextlib.asynccontextmanager
async def log_store(
    kind: str, tmp_path: Path, db_url: str | None, cap: int
) -> AsyncIterator[LogStore]:
    if db_url is None:
        yield FileLogStore(tmp_path / "logs", max_bytes_per_attempt=cap)
        return
    db = create_store(db_url)
    await db.open()
    try:
        yield DatabaseLogStore(db, max_bytes_per_attempt=cap)
    finally:
        await db.close()


@pytest.fixture
async def store(kind: str, tmp_path: Path, db_url: str | None) -> AsyncIterator[LogStore]:
    async with log_store(kind, tmp_path, db_url, 4096) as made:
        yield made


async def test_lines_come_back_as_written(store: LogStore) -> None:
    run = uuid.uuid4()
    result = await store.append(
        TENANT,
        run_id=run,
        attempt=1,
        lines=[
            LogEntry(T0, "INFO", "starting"),
            LogEntry(T0 + timedelta(milliseconds=1), "ERROR", 'ünïcode, "quotes"\nand a newline'),
        ],
    )
    assert (result.accepted, result.dropped) == (2, 0)
    assert result.size == await store.size(TENANT, run_id=run, attempt=1) > 0
    assert await read_all(store, run) == [
        LogLine(T0, "INFO", "starting", 1),
        LogLine(T0 + timedelta(milliseconds=1), "ERROR", 'ünïcode, "quotes"\nand a newline', 1),
    ]
    if not isinstance(store, FileLogStore):
        return
    # One file per attempt, one JSON object a line.
    path = store.path(TENANT, run, 1)
    assert path.is_relative_to(store.root / str(TENANT))
    rows = [json.loads(raw) for raw in path.read_text().splitlines()]
    assert [set(r) for r in rows] == [{"ts", "level", "message", "attempt"}] * 2
    assert rows[0]["ts"] == "2031-03-04T12:00:00Z"


async def test_unknown_runs_and_other_tenants_have_no_lines(store: LogStore) -> None:
    run = uuid.uuid4()
    await store.append(TENANT, run_id=run, attempt=1, lines=entries("mine"))
    assert await read_all(store, uuid.uuid4()) == []
    page = await store.read(uuid.uuid4(), run_id=run)
    assert page.lines == [] and page.next_cursor is None
    assert await store.size(TENANT, run_id=run, attempt=2) == 0


async def test_attempts_in_order_and_one_at_a_time(store: LogStore) -> None:
    run = uuid.uuid4()
    # Numeric order, not the files' names: attempt 10 comes after attempt 2.
    for attempt in (10, 2, 1):
        await store.append(
            TENANT, run_id=run, attempt=attempt, lines=entries(f"a{attempt}-x", f"a{attempt}-y")
        )
    lines = await read_all(store, run)
    assert messages(lines) == ["a1-x", "a1-y", "a2-x", "a2-y", "a10-x", "a10-y"]
    assert [line.attempt for line in lines] == [1, 1, 2, 2, 10, 10]
    assert messages(await read_all(store, run, attempt=2)) == ["a2-x", "a2-y"]
    assert await read_all(store, run, attempt=3) == []


async def test_pages_and_following_with_cursors(store: LogStore) -> None:
    run = uuid.uuid4()
    await store.append(TENANT, run_id=run, attempt=1, lines=entries("1", "2", "3"))
    await store.append(TENANT, run_id=run, attempt=2, lines=entries("4", "5"))

    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = await store.read(TENANT, run_id=run, cursor=cursor, limit=2)
        pages += 1
        seen += messages(page.lines)
        if page.next_cursor is None:
            break
        assert page.next_cursor == page.end_cursor
        cursor = page.next_cursor
    assert seen == ["1", "2", "3", "4", "5"] and pages == 3

    # Following: from the end, only what was appended since.
    end = page.end_cursor
    assert (await store.read(TENANT, run_id=run, cursor=end)).lines == []
    await store.append(TENANT, run_id=run, attempt=2, lines=entries("6"))
    await store.append(TENANT, run_id=run, attempt=3, lines=entries("7"))
    later = await store.read(TENANT, run_id=run, cursor=end)
    assert messages(later.lines) == ["6", "7"] and later.next_cursor is None

    # With an attempt filter, a cursor pages within that attempt.
    first = await store.read(TENANT, run_id=run, attempt=1, limit=2)
    assert messages(first.lines) == ["1", "2"] and first.next_cursor is not None
    rest = await store.read(TENANT, run_id=run, attempt=1, cursor=first.next_cursor)
    assert messages(rest.lines) == ["3"] and rest.next_cursor is None


@pytest.mark.parametrize("cursor", ["x", "1", "1:", ":5", "-1:0", "1:2:3", "9" * 30 + ":0"])
async def test_a_bad_cursor_is_refused(store: LogStore, cursor: str) -> None:
    with pytest.raises(ValidationError) as refused:
        await store.read(TENANT, run_id=uuid.uuid4(), cursor=cursor)
    assert refused.value.field == "cursor"


async def test_a_cursor_into_a_line_or_past_the_log_is_refused(store: LogStore) -> None:
    # Read from a line's middle, a message of brackets was parsed as JSON (a 500), and
    # any other passed for an unreadable line of its own.
    run = uuid.uuid4()
    await store.append(TENANT, run_id=run, attempt=1, lines=entries("[" * 2000, "b"))
    whole = await store.read(TENANT, run_id=run, limit=1)
    assert messages(whole.lines) == ["[" * 2000] and whole.next_cursor is not None
    attempt, offset = whole.next_cursor.split(":")
    assert messages((await store.read(TENANT, run_id=run, cursor=whole.next_cursor)).lines) == ["b"]
    for forged in (f"{attempt}:40", f"{attempt}:{int(offset) - 1}", f"{attempt}:99999999"):
        with pytest.raises(ValidationError) as refused:
            await store.read(TENANT, run_id=run, cursor=forged)
        assert refused.value.field == "cursor"
        assert "is not a cursor of this log" in refused.value.message


async def test_the_cap_drops_later_lines_behind_one_marker(store: LogStore) -> None:
    run = uuid.uuid4()
    line = "x" * 900  # about 980 bytes a line: four fit under 4096
    result = await store.append(TENANT, run_id=run, attempt=1, lines=entries(*[line] * 6))
    assert (result.accepted, result.dropped) == (4, 2)
    size = result.size
    assert size <= store.max_bytes_per_attempt + MARKER_BYTES

    # Everything later is dropped, even a line that would fit: the marker ends the log.
    again = await store.append(TENANT, run_id=run, attempt=1, lines=entries("small", "tiny"))
    assert (again.accepted, again.dropped, again.size) == (0, 2, size)
    assert await store.size(TENANT, run_id=run, attempt=1) == size

    lines = await read_all(store, run)
    assert messages(lines[:4]) == [line] * 4
    [marker] = lines[4:]
    assert marker.level == "WARNING" and marker.attempt == 1
    assert marker.ts == T0 + timedelta(seconds=4)  # when the first line was dropped
    assert "log cap of 4096 bytes" in marker.message
    assert "4 later lines" in marker.message  # 2 + 2, counted in place

    # Other attempts have caps of their own.
    other = await store.append(TENANT, run_id=run, attempt=2, lines=entries("fresh"))
    assert (other.accepted, other.dropped) == (1, 0)


async def test_a_first_line_over_the_cap(store: LogStore) -> None:
    run = uuid.uuid4()
    result = await store.append(TENANT, run_id=run, attempt=1, lines=entries("y" * 5000))
    assert (result.accepted, result.dropped, result.size) == (0, 1, MARKER_BYTES)
    [marker] = await read_all(store, run)
    assert "1 later line (" in marker.message


async def test_a_torn_or_broken_line_is_never_fatal(tmp_path: Path) -> None:
    store = FileLogStore(tmp_path / "logs", max_bytes_per_attempt=4096)
    run = uuid.uuid4()
    await store.append(TENANT, run_id=run, attempt=1, lines=entries("whole"))
    path = store.path(TENANT, run, 1)
    with path.open("ab") as f:
        f.write(b"not json\n")
        f.write(b'{"ts":"2031-03-04T12:00:00Z","level":"INFO","mess')  # a crash mid-write
    page = await store.read(TENANT, run_id=run)
    assert messages(page.lines)[0] == "whole"
    assert page.lines[1].message.startswith("(an unreadable log line")
    assert len(page.lines) == 2  # the half line is not a line
    # A later complete line is read once the torn tail has its end.
    with path.open("ab") as f:
        f.write(b'age":"late"}\n')
    later = await store.read(TENANT, run_id=run, cursor=page.end_cursor)
    assert messages(later.lines) == ["late"]


async def test_concurrent_appends_from_threads(
    kind: str, tmp_path: Path, db_url: str | None
) -> None:
    async with log_store(kind, tmp_path, db_url, 1 << 20) as store:
        await _appends_from_threads(store)


async def _appends_from_threads(store: LogStore) -> None:
    run = uuid.uuid4()
    loop = asyncio.get_running_loop()

    def writer(name: str) -> None:
        for batch in range(30):
            lines = entries(*[f"{name}:{batch}:{i}" for i in range(5)])
            asyncio.run_coroutine_threadsafe(
                store.append(TENANT, run_id=run, attempt=1, lines=lines), loop
            ).result()

    threads = [threading.Thread(target=writer, args=(f"t{n}",)) for n in range(6)]
    for t in threads:
        t.start()
    await asyncio.to_thread(lambda: [t.join() for t in threads])

    got = messages(await read_all(store, run))
    assert sorted(got) == sorted(
        f"t{n}:{b}:{i}" for n in range(6) for b in range(30) for i in range(5)
    )
    for n in range(6):  # each writer's lines in its own order, batches never split
        mine = [m for m in got if m.startswith(f"t{n}:")]
        assert mine == [f"t{n}:{b}:{i}" for b in range(30) for i in range(5)]


_WRITER = """
import asyncio, sys, uuid
from datetime import UTC, datetime
from pathlib import Path
from cronwheel.logstore import FileLogStore, LogEntry
from cronwheel.logstore_db import DatabaseLogStore
from cronwheel.store import create_store

target, tenant, run, name, cap = sys.argv[1:]

async def main() -> None:
    db = None
    if target.startswith("postgresql"):
        db = create_store(target)
        await db.open()
        store = DatabaseLogStore(db, max_bytes_per_attempt=int(cap))
    else:
        store = FileLogStore(Path(target), max_bytes_per_attempt=int(cap))
    accepted = dropped = 0
    for batch in range(40):
        lines = [LogEntry(datetime.now(UTC), "INFO", f"{name}:{batch}:{i}") for i in range(5)]
        result = await store.append(
            uuid.UUID(tenant), run_id=uuid.UUID(run), attempt=1, lines=lines
        )
        accepted += result.accepted
        dropped += result.dropped
    if db is not None:
        await db.close()
    print(accepted, dropped)

asyncio.run(main())
"""


@pytest.mark.parametrize("cap", [1 << 20, 20_000])
async def test_concurrent_appends_from_processes(
    kind: str, tmp_path: Path, db_url: str | None, cap: int
) -> None:
    root = tmp_path / "logs"
    run = uuid.uuid4()
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _WRITER,
            db_url or str(root),
            str(TENANT),
            str(run),
            f"p{n}",
            str(cap),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for n in range(4)
    ]
    async with asyncio.timeout(120):
        outputs = [await p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _out, err in outputs]
    counts = [tuple(map(int, out.split())) for out, _err in outputs]
    accepted = sum(a for a, _d in counts)
    dropped = sum(d for _a, d in counts)
    assert accepted + dropped == 4 * 40 * 5

    async with log_store(kind, tmp_path, db_url, cap) as store:
        await _check_process_appends(store, run, cap, accepted, dropped)


async def _check_process_appends(
    store: LogStore, run: uuid.UUID, cap: int, accepted: int, dropped: int
) -> None:
    lines = await read_all(store, run)
    kept = [line for line in lines if "log cap" not in line.message]
    assert len(kept) == accepted
    assert len(set(messages(kept))) == accepted  # nothing torn, nothing twice
    assert all(line.message.count(":") == 2 for line in kept)
    size = await store.size(TENANT, run_id=run, attempt=1)
    if dropped:
        assert size <= cap + MARKER_BYTES
        assert messages(lines[len(kept) :]) == [lines[-1].message]  # exactly one marker
        assert f"{dropped} later lines" in lines[-1].message
    else:
        assert len(lines) == 800 and size <= cap


async def test_delete_takes_the_named_runs_then_the_whole_tenant(store: LogStore) -> None:
    kept, doomed, other_tenant = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for run in (kept, doomed):
        await store.append(TENANT, run_id=run, attempt=1, lines=entries("one"))
        await store.append(TENANT, run_id=run, attempt=2, lines=entries("two"))
    await store.append(other_tenant, run_id=other_tenant, attempt=1, lines=entries("theirs"))

    await store.delete(TENANT, run_ids=[doomed, uuid.uuid4()])  # an unknown run is no error
    assert await read_all(store, doomed) == []
    assert await store.size(TENANT, run_id=doomed, attempt=2) == 0
    assert messages(await read_all(store, kept)) == ["one", "two"]

    await store.delete(TENANT)
    assert await read_all(store, kept) == []
    page = await store.read(other_tenant, run_id=other_tenant)
    assert messages(page.lines) == ["theirs"]
    # A deleted run's log starts afresh if lines come for it again.
    await store.append(TENANT, run_id=doomed, attempt=1, lines=entries("again"))
    assert messages(await read_all(store, doomed)) == ["again"]
