"""Worker logs: where the lines a handler writes with ``ctx.log`` are kept.

Logs never go to the transactional tables: a run row is about 1 KB, while one chatty
attempt writes megabytes. They go to a :class:`LogStore` — files under the data
directory (:class:`FileLogStore`, the default on SQLite), a table of their own shared by
every API process (``cronwheel.logstore_db.DatabaseLogStore``, the default on
PostgreSQL), or anything that can append bytes and read them back, such as an object
store.

What every store keeps, per attempt of a run, in order::

    {"ts": "2031-03-04T12:00:00.123456Z", "level": "INFO", "message": "...", "attempt": 1}

and the cap: an attempt keeps at most ``max_bytes_per_attempt`` bytes of lines. The
first line that does not fit ends the attempt's log — it and every later line are
dropped — and one *marker* line takes its place, saying how many lines (and bytes)
were dropped so far. Each append answers how many of its lines were accepted and how
many dropped.

A read walks a run's attempts in order (or one attempt, with ``attempt=``) and pages
with an opaque cursor. ``next_cursor`` is set while more lines are there right now;
``end_cursor`` always says where the page ended, so that a reader following a live
run asks for only what was appended since.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import shutil
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cronwheel.domain.errors import ValidationError

__all__ = [
    "LOG_LEVELS",
    "MARKER_BYTES",
    "AppendResult",
    "FileLogStore",
    "LogEntry",
    "LogLine",
    "LogPage",
    "LogStore",
    "bad_cursor",
    "decode_cursor",
    "decode_line",
    "encode_cursor",
    "encode_line",
    "marker_counts",
    "plan_append",
]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# The marker line has this fixed length (newline included), so that it can be
# rewritten in place with a new count while the file keeps its size.
MARKER_BYTES = 320
_MARKER_HEAD = b'{"marker":true,'
_READ_CHUNK = 64 * 1024
_ATTEMPT_FILE = re.compile(r"^(\d{1,9})\.jsonl$")


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One line as a worker sends it."""

    ts: datetime
    level: str
    message: str


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line as a reader gets it back."""

    ts: datetime
    level: str
    message: str
    attempt: int


@dataclass(frozen=True, slots=True)
class AppendResult:
    accepted: int
    dropped: int
    size: int  # bytes the attempt's log takes now


@dataclass(frozen=True, slots=True)
class LogPage:
    lines: list[LogLine]
    next_cursor: str | None  # more lines are there now: pass it to read them
    end_cursor: str  # where this page ended: later, it reads only newer lines


def encode_cursor(attempt: int, offset: int) -> str:
    return f"{attempt}:{offset}"


def decode_cursor(cursor: str | None) -> tuple[int, int]:
    """``(attempt, offset)`` of a cursor; None is the start of the run's log."""
    if cursor is None or cursor == "":
        return 0, 0
    head, sep, tail = cursor.partition(":")
    digits = head.isascii() and tail.isascii() and head.isdigit() and tail.isdigit()
    if not (sep and digits and len(head) <= 9 and len(tail) <= 18):
        raise ValidationError(
            f"cursor: {cursor[:40]!r} is not a cursor of this log", field="cursor"
        )
    return int(head), int(tail)


def bad_cursor(offset: int) -> ValidationError:
    """The refusal of a cursor whose offset is no line's start in its log (one this
    store did not make: read from there, a line's middle would pass for a line)."""
    return ValidationError(f"cursor: offset {offset} is not a cursor of this log", field="cursor")


class LogStore(ABC):
    """Where worker logs live. Tenant-scoped like the store: ``tenant_id`` comes first
    and a run's lines are only found under its own tenant.

    Implementations must be safe with several API processes appending to the same
    attempt at once: no line is torn, interleaved or lost, and the cap holds.
    """

    max_bytes_per_attempt: int

    @abstractmethod
    async def append(
        self,
        tenant_id: uuid.UUID,
        *,
        run_id: uuid.UUID,
        attempt: int,
        lines: Sequence[LogEntry],
    ) -> AppendResult:
        """Append ``lines`` to the attempt's log, in order, as far as the cap allows
        (see the module docstring for the cap and its marker line)."""

    @abstractmethod
    async def read(
        self,
        tenant_id: uuid.UUID,
        *,
        run_id: uuid.UUID,
        attempt: int | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> LogPage:
        """Up to ``limit`` lines of the run, attempt by attempt, oldest first, from
        ``cursor`` (a cursor this store made; another raises :class:`ValidationError`).
        An unknown run simply has no lines."""

    @abstractmethod
    async def size(self, tenant_id: uuid.UUID, *, run_id: uuid.UUID, attempt: int) -> int:
        """Bytes the attempt's log takes (0 when it has none)."""

    @abstractmethod
    async def delete(
        self, tenant_id: uuid.UUID, *, run_ids: Sequence[uuid.UUID] | None = None
    ) -> None:
        """Delete the lines of ``run_ids`` (None: every line of the tenant), as their
        job or tenant is deleted. Runs without lines are no error."""


# -- lines as stored ------------------------------------------------------------------


def _instant(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def encode_line(entry: LogEntry, attempt: int) -> bytes:
    """One line as every store keeps it: JSON, then a newline."""
    body = {
        "ts": _instant(entry.ts),
        "level": entry.level,
        "message": entry.message,
        "attempt": attempt,
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _marker(*, ts: datetime, attempt: int, cap: int, lines: int, size: int) -> bytes:
    """The marker line, padded to exactly :data:`MARKER_BYTES`."""
    message = (
        f"log cap of {cap} bytes per attempt reached: {lines} later "
        f"line{'s' if lines != 1 else ''} ({size} bytes) dropped"
    )
    body = json.dumps(
        {
            "ts": _instant(ts),
            "level": "WARNING",
            "message": message,
            "attempt": attempt,
            "dropped_lines": lines,
            "dropped_bytes": size,
        },
        separators=(",", ":"),
    ).encode()
    head = _MARKER_HEAD + body[1:-1] + b',"pad":"'
    tail = b'"}\n'
    pad = MARKER_BYTES - len(head) - len(tail)
    assert pad >= 0, "the marker line outgrew its fixed size"
    return head + b" " * pad + tail


def marker_counts(line: bytes) -> tuple[datetime, int, int] | None:
    """``(ts, dropped lines, dropped bytes)`` of a marker line, or None when ``line`` is
    not one. Only a marker line starts with ``{"marker":true,``: every other line
    starts with ``{"ts":``."""
    if len(line) != MARKER_BYTES or not line.startswith(_MARKER_HEAD):
        return None
    try:
        body = json.loads(line)
        ts = datetime.fromisoformat(str(body["ts"]).replace("Z", "+00:00"))
        return ts, int(body["dropped_lines"]), int(body["dropped_bytes"])
    except (ValueError, KeyError, TypeError):
        return None


def plan_append(
    *,
    size: int,
    marker: tuple[datetime, int, int] | None,
    encoded: Sequence[bytes],
    stamps: Sequence[datetime],
    attempt: int,
    cap: int,
) -> tuple[bytes, bytes | None, AppendResult]:
    """The cap, for every store: what appending the ``encoded`` lines (sent at
    ``stamps``) does to an attempt's log of ``size`` bytes, ended by ``marker``
    (:func:`marker_counts`) once capped. Returns the bytes to append, the marker line
    to write — after them when the log had none, else over the old one, in place — and
    the append's result."""
    if marker is None:
        take, used = 0, size
        for line in encoded:
            if used + len(line) > cap:
                break
            used += len(line)
            take += 1
        out = b"".join(encoded[:take])
        rest = encoded[take:]
        if not rest:
            return out, None, AppendResult(take, 0, size + len(out))
        new = _marker(
            ts=stamps[take],
            attempt=attempt,
            cap=cap,
            lines=len(rest),
            size=sum(len(r) for r in rest),
        )
        return out, new, AppendResult(take, len(rest), size + len(out) + len(new))
    if not encoded:
        return b"", None, AppendResult(0, 0, size)
    ts, lines, dropped_bytes = marker
    new = _marker(
        ts=ts,
        attempt=attempt,
        cap=cap,
        lines=lines + len(encoded),
        size=dropped_bytes + sum(len(r) for r in encoded),
    )
    return b"", new, AppendResult(0, len(encoded), size)


def decode_line(raw: bytes, attempt: int) -> LogLine:
    """A stored line; one that cannot be read (a crash mid-write) says so instead."""
    try:
        body = json.loads(raw)
        ts = datetime.fromisoformat(str(body["ts"]).replace("Z", "+00:00"))
        return LogLine(
            ts=ts,
            level=str(body["level"]),
            message=str(body["message"]),
            attempt=int(body.get("attempt", attempt)),
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        return LogLine(
            ts=datetime.fromtimestamp(0, UTC),
            level="WARNING",
            message=f"(an unreadable log line of {len(raw)} bytes)",
            attempt=attempt,
        )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


@contextlib.contextmanager
def _locked(path: Path, flags: int, lock: int) -> Iterator[int]:
    """``path`` opened with ``flags`` under an advisory ``flock`` (shared or
    exclusive). flock locks belong to the open file, so threads of one process and
    other processes alike wait for each other."""
    fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, lock)
        yield fd
    finally:
        os.close(fd)  # releases the lock


# -- files ---------------------------------------------------------------------------


class FileLogStore(LogStore):
    """One file per attempt: ``<root>/<tenant>/<run id[:2]>/<run id>/<attempt>.jsonl``
    (the two-character level keeps directories small).

    Appends take an exclusive ``flock`` on the attempt's file, check the cap against its
    size and write the accepted lines with one ``O_APPEND`` write: several API
    processes (on one machine, or sharing a file system with working ``flock``) can
    append at once. Readers take a shared lock, so they never see half a write. Once
    the cap is reached the marker is the file's last line for good; later appends only
    rewrite its counts in place. The file holds at most the cap plus the marker.

    File I/O runs in worker threads, never on the event loop.
    """

    def __init__(self, root: Path, *, max_bytes_per_attempt: int = 1 << 20) -> None:
        if max_bytes_per_attempt < 1:
            raise ValueError("max_bytes_per_attempt must be positive")
        self.root = Path(root)
        self.max_bytes_per_attempt = max_bytes_per_attempt

    def run_dir(self, tenant_id: uuid.UUID, run_id: uuid.UUID) -> Path:
        run = str(run_id)
        return self.root / str(tenant_id) / run[:2] / run

    def path(self, tenant_id: uuid.UUID, run_id: uuid.UUID, attempt: int) -> Path:
        return self.run_dir(tenant_id, run_id) / f"{attempt}.jsonl"

    async def append(
        self,
        tenant_id: uuid.UUID,
        *,
        run_id: uuid.UUID,
        attempt: int,
        lines: Sequence[LogEntry],
    ) -> AppendResult:
        if attempt < 1:
            raise ValueError("attempt numbers start at 1")
        encoded = [encode_line(line, attempt) for line in lines]
        stamps = [line.ts for line in lines]
        path = self.path(tenant_id, run_id, attempt)
        return await asyncio.to_thread(self._append, path, attempt, encoded, stamps)

    def _append(
        self, path: Path, attempt: int, encoded: list[bytes], stamps: list[datetime]
    ) -> AppendResult:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, fcntl.LOCK_EX) as fd:
            size = os.fstat(fd).st_size
            marker = _marker_counts(fd, size)
            out, new_marker, result = plan_append(
                size=size,
                marker=marker,
                encoded=encoded,
                stamps=stamps,
                attempt=attempt,
                cap=self.max_bytes_per_attempt,
            )
            if marker is None:
                out += new_marker or b""
                if out:
                    _write_all(fd, out)
            elif new_marker is not None:
                # pwrite on an O_APPEND descriptor appends on Linux: rewrite through
                # a second one, still under the lock.
                inplace = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.pwrite(inplace, new_marker, size - MARKER_BYTES)
                finally:
                    os.close(inplace)
            return result

    async def read(
        self,
        tenant_id: uuid.UUID,
        *,
        run_id: uuid.UUID,
        attempt: int | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> LogPage:
        if limit < 1:
            raise ValidationError("limit: at least 1", field="limit")
        start = decode_cursor(cursor)
        run_dir = self.run_dir(tenant_id, run_id)
        return await asyncio.to_thread(self._read, run_dir, attempt, start, limit)

    def _read(self, run_dir: Path, only: int | None, start: tuple[int, int], limit: int) -> LogPage:
        start_attempt, start_offset = start
        numbers = [n for n in _attempt_files(run_dir) if n >= start_attempt]
        if only is not None:
            numbers = [n for n in numbers if n == only]
        lines: list[LogLine] = []
        end = start
        more = False
        for index, number in enumerate(numbers):
            offset = start_offset if number == start_attempt else 0
            got, offset, left = _read_file(
                run_dir / f"{number}.jsonl", number, offset, limit - len(lines)
            )
            lines.extend(got)
            end = (number, offset)
            if len(lines) >= limit:
                more = left or index + 1 < len(numbers)
                break
        end_cursor = encode_cursor(*end)
        return LogPage(lines, end_cursor if more else None, end_cursor)

    async def size(self, tenant_id: uuid.UUID, *, run_id: uuid.UUID, attempt: int) -> int:
        path = self.path(tenant_id, run_id, attempt)

        def stat() -> int:
            try:
                return path.stat().st_size
            except FileNotFoundError:
                return 0

        return await asyncio.to_thread(stat)

    async def delete(
        self, tenant_id: uuid.UUID, *, run_ids: Sequence[uuid.UUID] | None = None
    ) -> None:
        if run_ids is None:
            doomed = [self.root / str(tenant_id)]
        else:
            doomed = [self.run_dir(tenant_id, r) for r in run_ids]

        def remove() -> None:
            for path in doomed:
                shutil.rmtree(path, ignore_errors=True)

        await asyncio.to_thread(remove)


def _attempt_files(run_dir: Path) -> list[int]:
    try:
        names = os.listdir(run_dir)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for name in names if (m := _ATTEMPT_FILE.match(name)))


def _marker_counts(fd: int, size: int) -> tuple[datetime, int, int] | None:
    """The marker that ends the file (:func:`marker_counts`), or None when the attempt
    is still under its cap."""
    if size < MARKER_BYTES:
        return None
    start = size - MARKER_BYTES
    at_line_start = start == 0 or os.pread(fd, 1, start - 1) == b"\n"
    return marker_counts(os.pread(fd, MARKER_BYTES, start)) if at_line_start else None


def _read_file(
    path: Path, attempt: int, offset: int, limit: int
) -> tuple[list[LogLine], int, bool]:
    """Up to ``limit`` whole lines from ``offset``: the lines, the offset after them and
    whether more bytes follow."""
    try:
        with _locked(path, os.O_RDONLY, fcntl.LOCK_SH) as fd:
            return _scan(fd, attempt, offset, limit)
    except FileNotFoundError:
        return [], offset, False


def _scan(fd: int, attempt: int, offset: int, limit: int) -> tuple[list[LogLine], int, bool]:
    lines: list[LogLine] = []
    size = os.fstat(fd).st_size
    if offset > size or (offset > 0 and os.pread(fd, 1, offset - 1) != b"\n"):
        raise bad_cursor(offset)
    pending = b""
    position = offset
    while len(lines) < limit and position < size:
        chunk = os.pread(fd, _READ_CHUNK, position)
        if not chunk:
            break
        position += len(chunk)
        parts = (pending + chunk).split(b"\n")
        pending = parts.pop()  # no newline yet: not a whole line
        for index, raw in enumerate(parts):
            if len(lines) == limit:
                # Give back what was read past the page.
                position -= len(b"\n".join(parts[index:])) + 1
                break
            if raw:
                lines.append(decode_line(raw, attempt))
    position -= len(pending)
    return lines, position, position < size
