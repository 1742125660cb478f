"""Shipping what handlers write with ``ctx.log`` to the server, where
``GET /v1/runs/{id}/logs`` (and ``cronwheel runs logs``) shows it.

::

    handler (task or thread) ──ctx.log.info(…)──▶ its attempt's buffer   (never waits)
                                                        │ flusher: every flush_interval;
                                                        │ at once for a full batch or an
                                                        ▼ outcome waiting
                                     POST /v1/attempts/{id}/logs   (a few requests at once)
    session: outcome ready ──then(attempt, report)──▶ report() runs once the attempt's
                                                      lines are sent (or given up on)

The server keeps an attempt's lines only while the attempt is live, so the session
hands each outcome through :meth:`LogShipper.then`: the attempt's last lines go first.

- 409 or 404 (the lease was lost, the attempt ended or is unknown): the attempt's
  buffer is dropped and its later lines are discarded.
- A network error, 429 or 5xx: the batch is kept and tried again with backoff; handlers
  never wait. Memory stays bounded: past ``max_buffered_lines`` (or
  ``max_buffered_bytes``) the oldest line of all
  is dropped, and that attempt's next batch starts with a line saying how many were.
- An outcome waits at most ``hold_max`` seconds for its attempt's lines.

Records are shipped whatever the local logging configuration: a handler's INFO lines
reach the server even where the ``cronwheel.task`` logger shows only warnings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from cronwheel.client import ApiError
from cronwheel.worker.outbox import Backoff, log_event, wait_event
from cronwheel.worker.protocol import WorkerProtocol
from cronwheel.worker.tasks import RunLogAdapter

__all__ = ["LogShipConfig", "LogShipper", "ShippingLogAdapter"]

log = logging.getLogger("cronwheel.worker")

# The server takes at most 16,384 characters a line and 1,000 lines a request; the
# request body must stay under its 1 MiB limit.
_MESSAGE_MAX = 16_000
_LINE_OVERHEAD = 80  # bytes of JSON around a message
_FINAL_FLUSH_SECONDS = 10.0
_FORMATTER = logging.Formatter()


@dataclass(frozen=True, slots=True)
class LogShipConfig:
    """How ``ctx.log`` lines reach the server.

    ``level``: records at this level and above are shipped (None: none is).
    ``flush_interval``: seconds between sends; an attempt with ``batch_lines`` lines
    waiting, or whose outcome is ready, is sent at once. A request carries at most
    ``batch_lines`` lines and about ``batch_bytes`` bytes. ``max_buffered_lines`` and
    ``max_buffered_bytes``
    bounds the memory of every attempt's lines together while the server is out of
    reach. An outcome waits at most ``hold_max`` seconds for its attempt's lines.
    """

    level: int | None = logging.INFO
    flush_interval: float = 0.5
    batch_lines: int = 500
    batch_bytes: int = 256 * 1024  # escaping can double JSON: well under the 1 MiB limit
    max_buffered_lines: int = 10_000
    max_buffered_bytes: int = 16 << 20
    hold_max: float = 10.0
    concurrency: int = 4
    backoff_max: float = 10.0

    def __post_init__(self) -> None:
        if self.flush_interval <= 0 or self.hold_max < 0 or self.backoff_max <= 0:
            raise ValueError("flush_interval and backoff_max must be positive, hold_max >= 0")
        if not 1 <= self.batch_lines <= 1000:
            raise ValueError("batch_lines must be between 1 and 1000 (the server's limit)")
        if (
            self.batch_bytes < 1024
            or self.max_buffered_lines < 1
            or self.max_buffered_bytes < self.batch_bytes
            or self.concurrency < 1
        ):
            raise ValueError(
                "batch_bytes, max_buffered_lines, max_buffered_bytes (at least batch_bytes) "
                "and concurrency are too small"
            )


@dataclass(slots=True)
class _Line:
    seq: int
    ts: float
    level: str
    message: str
    size: int


@dataclass(slots=True, eq=False, weakref_slot=True)
class _Buffer:
    """One attempt's lines not yet sent."""

    attempt_id: str
    fencing_token: int
    lines: deque[_Line] = field(default_factory=deque)
    dropped: int = 0  # lines dropped to bound memory, not yet told to the server
    sending: bool = False
    closed: bool = False  # later lines are discarded: refused, or the outcome went out
    # Not sent yet: its attempt (begun at its gate) has no record on the server until
    # its start is answered, and would refuse them.
    held: bool = False
    report: Callable[[], None] | None = None  # the outcome waiting for these lines
    deadline: float = 0.0


class ShippingLogAdapter(RunLogAdapter):
    """``ctx.log``: logs locally like :class:`RunLogAdapter` and hands every record at
    the shipper's level or above to the shipper."""

    def __init__(
        self,
        logger: logging.Logger,
        extra: dict[str, Any],
        *,
        shipper: LogShipper,
        buffer: _Buffer,
        level: int,
    ) -> None:
        super().__init__(logger, extra)
        self._shipper = shipper
        self._buffer = buffer
        self._level = level

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level >= self._level:
            self._shipper.add(self._buffer, level, _render(msg, args, kwargs.get("exc_info")))
        elif not self.logger.isEnabledFor(level):
            return  # neither shipped nor logged here: a debug line per run costs nothing
        # Skip this frame when logging finds the caller (funcName, lineno).
        kwargs["stacklevel"] = int(kwargs.get("stacklevel", 1)) + 1
        super().log(level, msg, *args, **kwargs)


class LogShipper:
    """Buffers the lines of every attempt a worker holds and sends them in batches.

    :meth:`add` is called from handlers (event loop or threads); everything else runs on
    the event loop of :meth:`start`.
    """

    def __init__(self, protocol: WorkerProtocol, config: LogShipConfig | None = None) -> None:
        self.protocol = protocol
        self.config = config or LogShipConfig()
        self.shipped = 0  # lines the server kept
        self.dropped = 0  # lines lost: memory bound, refused, past the cap, given up
        self._lock = threading.Lock()
        self._next_seq = 0
        self._buffered = 0
        self._buffered_bytes = 0
        # Buffers with lines, a request out or an outcome waiting.
        self._active: dict[str, _Buffer] = {}
        # Every attempt's buffer, for as long as its ctx.log lives.
        self._buffers: weakref.WeakValueDictionary[str, _Buffer] = weakref.WeakValueDictionary()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._closed = False

    # -- handlers' side (any thread) -------------------------------------------------

    def adapter(
        self, logger: logging.Logger, extra: dict[str, Any], *, fencing_token: int
    ) -> RunLogAdapter:
        """The ``ctx.log`` of one attempt (``extra`` names its ``attempt_id``)."""
        level = self.config.level
        if level is None:
            return RunLogAdapter(logger, extra)
        buffer = _Buffer(str(extra["attempt_id"]), fencing_token)
        self._buffers[buffer.attempt_id] = buffer
        return ShippingLogAdapter(logger, extra, shipper=self, buffer=buffer, level=level)

    def add(self, buffer: _Buffer, level: int, message: str) -> None:
        if len(message) > _MESSAGE_MAX:
            message = message[:_MESSAGE_MAX] + " … (truncated)"
        # Its size on the wire, escaped as JSON (control characters grow sixfold).
        size = len(json.dumps(message)) + _LINE_OVERHEAD
        with self._lock:
            if buffer.closed or self._closed:
                self.dropped += 1
                return
            self._next_seq += 1
            buffer.lines.append(
                _Line(self._next_seq, time.time(), _level_name(level), message, size)
            )
            self._buffered += 1
            self._buffered_bytes += size
            self._active[buffer.attempt_id] = buffer
            self._bound()
            full = len(buffer.lines) == self.config.batch_lines
        if full:
            self._wake_soon()

    def _bound(self) -> None:
        """Drop the oldest lines of all while over the memory bounds (lock held)."""
        while self._buffered > 0 and (
            self._buffered > self.config.max_buffered_lines
            or self._buffered_bytes > self.config.max_buffered_bytes
        ):
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        """Drop the oldest line of all (lock held)."""
        oldest = min((b for b in self._active.values() if b.lines), key=lambda b: b.lines[0].seq)
        line = oldest.lines.popleft()
        oldest.dropped += 1
        self._buffered -= 1
        self._buffered_bytes -= line.size
        self.dropped += 1

    def _wake_soon(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            self._wake.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(self._wake.set)

    # -- the session's side (event loop) ---------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._task = asyncio.create_task(self._run(), name="cronwheel-logs")

    def hold(self, attempt_id: str, held: bool) -> None:
        """Keep the attempt's lines back (``held``) until its start is answered, or let
        them go; a start refused discards them (:meth:`discard`)."""
        buffer = self._buffers.get(attempt_id)
        if buffer is None:
            return
        with self._lock:
            buffer.held = held
        if not held:
            self._wake_soon()

    def discard(self, attempt_id: str) -> None:
        """Drop the attempt's lines, now and later: it is not this worker's to log."""
        buffer = self._buffers.get(attempt_id)
        if buffer is None:
            return
        with self._lock:
            self._close(buffer)
            self._active.pop(attempt_id, None)

    def then(self, attempt_id: str, report: Callable[[], None]) -> None:
        """Call ``report`` (which reports the attempt's outcome) once the attempt's
        lines are sent — at once when none is waiting. Later lines are discarded."""
        buffer = self._buffers.get(attempt_id)
        with self._lock:
            waiting = (
                buffer is not None
                and self._task is not None
                and not (buffer.closed or self._stopping)
                and bool(buffer.lines or buffer.dropped or buffer.sending)
            )
            if buffer is not None and waiting:
                buffer.report = report
                buffer.deadline = time.monotonic() + self.config.hold_max
                self._active[attempt_id] = buffer
            elif buffer is not None:
                self._close(buffer)
                self._active.pop(attempt_id, None)
        if waiting:
            self._wake.set()
        else:
            report()

    async def close(self) -> None:
        """Send what is left, trying for a while when the server is out of reach; then
        report every outcome still waiting. Lines written later are discarded."""
        self._stopping = True
        deadline = time.monotonic() + _FINAL_FLUSH_SECONDS
        task, self._task = self._task, None
        if task is not None:
            self._wake.set()
            done, _ = await asyncio.wait({task}, timeout=_FINAL_FLUSH_SECONDS)
            if not done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        backoff = Backoff(2.0)
        while self._pending() and time.monotonic() < deadline:
            if not await self._flush_round(everything=True):
                left = deadline - time.monotonic()
                await asyncio.sleep(max(0.0, min(backoff.next_delay(), left)))
            self._settle()
        with self._lock:
            self._closed = True
        self._settle(final=True)

    # -- flushing --------------------------------------------------------------------

    async def _run(self) -> None:
        interval = self.config.flush_interval
        backoff = Backoff(self.config.backoff_max)
        retry_at = 0.0  # after a failed send: nothing goes out before this
        last_full = time.monotonic()
        while not self._stopping:
            # Never longer than an interval: outcomes waiting past their deadline are
            # reported even while sends back off.
            wait = max(retry_at, last_full + interval) - time.monotonic()
            await wait_event(self._wake, min(wait, interval))
            self._wake.clear()
            now = time.monotonic()
            if now >= retry_at and not self._stopping:
                everything = now >= last_full + interval
                if everything:
                    last_full = now
                try:
                    ok = await self._flush_round(everything=everything)
                except Exception:  # a bug must not silence every later line
                    log.exception("worker.logs_error", extra={"event": "worker.logs_error"})
                    ok = False
                if ok:
                    backoff.reset()
                    retry_at = 0.0
                else:
                    retry_at = time.monotonic() + backoff.next_delay()
            self._settle()
            if retry_at == 0.0 and self._urgent():
                self._wake.set()

    def _urgent(self) -> bool:
        with self._lock:
            return any(self._wants_send(b, everything=False) for b in self._active.values())

    def _pending(self) -> bool:
        with self._lock:
            return any(
                (b.lines or b.dropped) and not (b.closed or b.held) for b in self._active.values()
            )

    def _wants_send(self, buffer: _Buffer, *, everything: bool) -> bool:
        if buffer.sending or buffer.closed or buffer.held or not (buffer.lines or buffer.dropped):
            return False
        return (
            everything
            or buffer.report is not None
            or (len(buffer.lines) >= self.config.batch_lines)
        )

    async def _flush_round(self, *, everything: bool) -> bool:
        """One batch of each buffer that should go now (``everything``: each one with
        lines). False when some must be tried again later."""
        with self._lock:
            picked = [
                (buffer, *self._take(buffer))
                for buffer in list(self._active.values())
                if self._wants_send(buffer, everything=everything)
            ]
        if not picked:
            return True
        gate = asyncio.Semaphore(self.config.concurrency)
        sent = await asyncio.gather(
            *(self._send(buffer, lines, dropped, gate) for buffer, lines, dropped in picked)
        )
        return all(sent)

    def _take(self, buffer: _Buffer) -> tuple[list[_Line], int]:
        """The buffer's next batch (lock held)."""
        lines: list[_Line] = []
        size = 0
        while buffer.lines and len(lines) < self.config.batch_lines:
            line = buffer.lines[0]
            if lines and size + line.size > self.config.batch_bytes:
                break
            lines.append(buffer.lines.popleft())
            size += line.size
        dropped, buffer.dropped = buffer.dropped, 0
        self._buffered -= len(lines)
        self._buffered_bytes -= size
        buffer.sending = True
        return lines, dropped

    async def _send(
        self, buffer: _Buffer, lines: list[_Line], dropped: int, gate: asyncio.Semaphore
    ) -> bool:
        body = [
            {"ts": _iso(line.ts), "level": line.level, "message": line.message} for line in lines
        ]
        if dropped:
            first = lines[0].ts if lines else time.time()
            body.insert(
                0,
                {
                    "ts": _iso(first),
                    "level": "WARNING",
                    "message": f"{dropped} log line{'s' if dropped != 1 else ''} dropped by "
                    "the worker: its buffer was full while the server was out of reach",
                },
            )
        try:
            async with gate:
                out = await self.protocol.append_logs(
                    buffer.attempt_id, fencing_token=buffer.fencing_token, lines=body
                )
        except ApiError as exc:
            return self._refused(buffer, lines, dropped, exc)
        finally:
            with self._lock:
                buffer.sending = False
        with self._lock:
            self.shipped += out.accepted
            self.dropped += out.dropped
        return True

    def _refused(self, buffer: _Buffer, lines: list[_Line], dropped: int, exc: ApiError) -> bool:
        transient = exc.status == 0 or exc.status == 429 or exc.status >= 500
        with self._lock:
            if transient and not buffer.closed:
                buffer.lines.extendleft(reversed(lines))
                buffer.dropped += dropped
                self._buffered += len(lines)
                self._buffered_bytes += sum(line.size for line in lines)
                self._bound()
                retry = True
            else:
                retry = False
                self.dropped += len(lines)
                if exc.status in (404, 409):
                    self._close(buffer)
        if retry:
            log_event(
                logging.WARNING,
                "worker.logs_failed",
                attempt_id=buffer.attempt_id,
                error=str(exc),
                buffered=self._buffered,
            )
            return False
        log_event(
            logging.DEBUG if exc.status in (404, 409) else logging.WARNING,
            "worker.logs_refused",
            attempt_id=buffer.attempt_id,
            error=str(exc),
            lines=len(lines),
        )
        return True

    def _close(self, buffer: _Buffer) -> None:
        """Discard the buffer's lines, now and later (lock held)."""
        buffer.closed = True
        self.dropped += len(buffer.lines)
        self._buffered -= len(buffer.lines)
        self._buffered_bytes -= sum(line.size for line in buffer.lines)
        buffer.lines.clear()
        buffer.dropped = 0

    def _settle(self, *, final: bool = False) -> None:
        """Report the outcomes whose lines are sent, refused or waited for long enough
        (``final``: every one), and forget buffers with nothing left to do."""
        now = time.monotonic()
        ready: list[tuple[Callable[[], None], str, int]] = []
        with self._lock:
            for attempt_id, buffer in list(self._active.items()):
                idle = not (buffer.lines or buffer.dropped or buffer.sending)
                if buffer.report is None:
                    if idle or buffer.closed:
                        del self._active[attempt_id]
                    continue
                if not (idle or buffer.closed or final or now >= buffer.deadline):
                    continue
                left = len(buffer.lines)
                ready.append((buffer.report, attempt_id, left))
                buffer.report = None
                self._close(buffer)
                del self._active[attempt_id]
        for report, attempt_id, left in ready:
            if left:
                log_event(
                    logging.WARNING,
                    "worker.logs_abandoned",
                    attempt_id=attempt_id,
                    lines=left,
                    note="the outcome could not wait longer for them",
                )
            try:
                report()
            except Exception:  # reporting must go on for the others
                log.exception("worker.logs_error", extra={"event": "worker.logs_error"})


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _level_name(level: int) -> str:
    for threshold, name in (
        (logging.CRITICAL, "CRITICAL"),
        (logging.ERROR, "ERROR"),
        (logging.WARNING, "WARNING"),
        (logging.INFO, "INFO"),
    ):
        if level >= threshold:
            return name
    return "DEBUG"


_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def _render(msg: object, args: tuple[object, ...], exc_info: object) -> str:
    """The record's message as logging would print it, with its traceback."""
    try:
        text = logging.LogRecord("", 0, "", 0, msg, args, None).getMessage()
    except Exception:  # a bad format string must not break the handler
        text = f"{msg} {args!r}"
    info: object = None
    if isinstance(exc_info, BaseException):
        info = (type(exc_info), exc_info, exc_info.__traceback__)
    elif isinstance(exc_info, tuple):
        info = exc_info
    elif exc_info:
        info = sys.exc_info()
    if isinstance(info, tuple) and len(info) == 3 and info[0] is not None:
        exc: _ExcInfo = info
        text = f"{text}\n{_FORMATTER.formatException(exc)}"
    return text
