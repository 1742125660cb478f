"""What a handler sees: the task registry, the context of one attempt, and the error
that fails a run without retries."""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from cronwheel.worker.progress import UnsentProgress

if TYPE_CHECKING:
    from cronwheel.worker.protocol import Lease

__all__ = [
    "TASK_LOGGER",
    "Handler",
    "NonRetryableError",
    "RunLogAdapter",
    "TaskContext",
    "TaskRegistry",
    "registry",
    "task",
]

# A handler is ``(ctx, payload) -> result``, a plain function (run in a thread pool) or
# a coroutine function (run on the worker's event loop). The result must be JSON.
Handler = Callable[["TaskContext", dict[str, Any]], Any | Awaitable[Any]]
H = TypeVar("H", bound=Handler)

TASK_LOGGER = "cronwheel.task"


class NonRetryableError(Exception):
    """Raise it from a handler to fail the run at once: no further attempts."""


class RunLogAdapter(logging.LoggerAdapter[logging.Logger]):
    """Prefixes each line with the run and attempt, and keeps them as ``extra`` fields
    so structured formatters can index them."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return f"[run {extra['run_id']} attempt {extra['attempt']}] {msg}", kwargs


@dataclass(slots=True, eq=False)
class TaskContext:
    """The attempt a handler is executing.

    ``fencing_token`` and ``idempotency_key`` are meant for downstream systems: pass
    them along so a write made by an attempt whose lease was lost can be rejected.
    """

    run_id: str
    attempt_id: str
    job_id: str
    attempt: int
    fencing_token: int
    task: str
    deadline: datetime
    due_at: datetime | None
    log: logging.LoggerAdapter[logging.Logger]
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    lease_lost: bool = False
    # Seconds the handler may go without reporting progress (:meth:`heartbeat`);
    # None: the job sets no bound.
    progress_timeout: float | None = None
    # The worker's: the report the next heartbeat carries.
    unsent_progress: UnsentProgress = field(default_factory=UnsentProgress, repr=False)

    @classmethod
    def of(cls, lease: Lease, log: logging.LoggerAdapter[logging.Logger]) -> TaskContext:
        """The context of the attempt ``lease`` hands the worker, logging to ``log``."""
        return cls(
            run_id=lease.run_id,
            attempt_id=lease.attempt_id,
            job_id=lease.job_id,
            attempt=lease.attempt,
            fencing_token=lease.fencing_token,
            task=lease.task or "",
            deadline=lease.deadline,
            due_at=lease.due_at,
            log=log,
            progress_timeout=lease.progress_timeout,
        )

    @property
    def idempotency_key(self) -> str:
        """``run_id:attempt`` — the same for a redelivery of the same attempt."""
        return f"{self.run_id}:{self.attempt}"

    @property
    def cancel_requested(self) -> bool:
        """True once the handler should stop: the run was cancelled (learned as soon as
        it is asked, or at the latest on the next heartbeat), its lease was lost, or the
        worker is shutting down past its grace period. Async handlers are also
        cancelled; sync ones should check this (or wait with :meth:`wait_cancelled`)."""
        return self._cancel.is_set()

    def request_cancel(self) -> None:
        self._cancel.set()

    def heartbeat(self, details: Any = None) -> None:
        """Report progress, from a sync or an async handler alike (it never blocks).

        Under the job's ``progress_timeout`` the handler must report within that many
        seconds of the attempt's start and of each report, or the server ends the
        attempt TIMED_OUT and the run is retried. ``details`` — any JSON up to 4 KiB —
        are kept on the attempt (``GET /v1/runs/{id}``), the last report's winning.
        Reports travel with the worker's batched heartbeats, which come at least every
        quarter of ``progress_timeout``: report at least every half of it to be safe.
        Details that are not JSON or are too large raise TypeError / ValueError here."""
        self.unsent_progress.put(details)

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """For sync handlers: sleep up to ``timeout`` seconds, waking at once when a
        cancel is requested. Returns whether it was."""
        return self._cancel.wait(timeout)


class TaskRegistry:
    """Task names and their handlers."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def task(self, name: str) -> Callable[[H], H]:
        """Decorator: ``@registry.task("billing.charge")``."""

        def register(handler: H) -> H:
            self.add(name, handler)
            return handler

        return register

    def add(self, name: str, handler: Handler) -> None:
        if not name or not name.strip():
            raise ValueError("a task name cannot be empty")
        if not callable(handler):
            raise TypeError(f"the handler of task {name!r} is not callable")
        current = self._handlers.get(name)
        if current is not None and current is not handler:
            raise ValueError(f"task {name!r} already has a handler ({_describe(current)})")
        self._handlers[name] = handler

    def remove(self, name: str) -> None:
        """Forget a task's handler (no error when it has none)."""
        self._handlers.pop(name, None)

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def include(self, other: TaskRegistry) -> None:
        for name, handler in other._handlers.items():
            self.add(name, handler)

    def __len__(self) -> int:
        return len(self._handlers)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers


def _describe(handler: Handler) -> str:
    module = getattr(handler, "__module__", "?")
    return f"{module}.{getattr(handler, '__qualname__', repr(handler))}"


registry = TaskRegistry()
"""The global registry: modules loaded by ``cronwheel worker --import`` put their
handlers here with :func:`task`."""


def task(name: str) -> Callable[[H], H]:
    """Register a handler on the global registry: ``@cronwheel.worker.task("hello")``."""
    return registry.task(name)
