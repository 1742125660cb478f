"""An attempt a worker holds, from its lease until the server has acknowledged its
outcome: how its handler is called (an async one under the run's deadline, a sync one
on the session's threads) and what the handler's end becomes — the
:class:`~cronwheel.worker.protocol.Completion` or
:class:`~cronwheel.worker.protocol.Failure` sent back."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from pydantic_core import PydanticSerializationError, to_jsonable_python

from cronwheel.domain.bounds import RESULT_DEPTH_MAX, check_json_tree
from cronwheel.domain.errors import ValidationError
from cronwheel.worker.protocol import Completion, Failure, Lease, TokenRef
from cronwheel.worker.tasks import Handler, TaskContext

__all__ = ["CancelReason", "DeadlineExceeded", "Held", "format_error", "handler_is_async"]

# The most of an error (its traceback's end) a failure carries.
_ERROR_LIMIT = 8000

CancelReason = Literal["cancel_requested", "lease_lost", "shutdown"]


class DeadlineExceeded(TimeoutError):
    """An async handler ran past its run's deadline (``timeout``)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"deadline exceeded after {seconds:.1f} s")
        self.seconds = seconds


@dataclass(slots=True, eq=False)
class Held:
    lease: Lease
    ctx: TaskContext
    task: asyncio.Task[None] | None = None
    is_async: bool = False
    finished: bool = False  # the handler returned, raised or was cancelled
    reported: bool = False  # an outcome (or release) is queued or sent
    cancel_reason: CancelReason | None = None
    reserved: bool = False  # started from a reservation ahead of its instant
    # Begun at its gate's opening, before its start was recorded: whether the server
    # started it (None: not answered yet). Until then it is not heartbeaten and its
    # outcome waits; refused, the handler is stopped and nothing is reported.
    start: asyncio.Future[bool] | None = None

    def begin_at(self, lease: Lease) -> None:
        """Take ``lease``, the attempt its gate's opening made of this reservation (its
        payload, its lease and deadline from the opening)."""
        self.lease = lease
        self.ctx.deadline = lease.deadline
        self.ctx.due_at = lease.due_at

    @property
    def unstarted(self) -> bool:
        """Begun at its gate, its start not recorded yet (or refused)."""
        return self.start is not None and not (self.start.done() and self.start.result())

    @property
    def ref(self) -> TokenRef:
        return TokenRef(self.lease.attempt_id, self.lease.fencing_token)

    @property
    def urgent(self) -> bool:
        """A workflow's node: its outcome makes the nodes after it ready, so it is
        reported at once rather than held back behind a burst's starts."""
        return self.lease.workflow_run_id is not None

    async def call(self, handler: Handler, executor: ThreadPoolExecutor) -> Any:
        """The handler's result for this attempt's payload."""
        ctx, payload = self.ctx, self.lease.payload
        if self.is_async:
            return await _under_deadline(handler(ctx, payload), self.lease.run_seconds_left)
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, handler, ctx, payload)
        result = await loop.run_in_executor(executor, call)
        if inspect.isawaitable(result):
            result = await result
        return result

    def completion(self, result: Any) -> Completion | Failure:
        """A completion with ``result``, or the failure saying why it cannot be stored."""
        if result is None:  # most handlers return nothing: no conversion to check
            return Completion(
                self.lease.attempt_id, self.lease.fencing_token, None, urgent=self.urgent
            )
        try:
            value = to_jsonable_python(result)
        except PydanticSerializationError as exc:
            return self.failure(
                f"the handler's result is not JSON-serialisable: {exc}", retryable=False
            )
        try:
            # As the server would refuse it (NaN, a NUL, nesting), but with the reason
            # on the run rather than a refused request.
            check_json_tree(value, max_depth=RESULT_DEPTH_MAX, prefix="result")
        except ValidationError as exc:
            return self.failure(
                f"the handler's result cannot be stored: {exc.message}", retryable=False
            )
        return Completion(
            self.lease.attempt_id, self.lease.fencing_token, value, urgent=self.urgent
        )

    def failure(
        self, error: str, *, retryable: bool = True, retry_after: float | None = None
    ) -> Failure:
        return Failure(
            self.lease.attempt_id,
            self.lease.fencing_token,
            error[-_ERROR_LIMIT:],
            retryable,
            retry_after,
            urgent=self.urgent,
        )


async def _under_deadline(call: Awaitable[Any], budget: float) -> Any:
    """``call`` awaited, and cancelled once ``budget`` seconds have passed, which raises
    :class:`DeadlineExceeded`. What ``asyncio.timeout`` does, with a bare timer and a
    flag: a burst's thousand handlers each begin under one, and it cost five times as
    much (2.5 ms against 0.5 per 500 handlers)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    before = task.cancelling()
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = loop.call_later(budget, expire) if budget > 0 else loop.call_soon(expire)
    try:
        result = await call
    except BaseException as exc:
        timer.cancel()
        if not expired:
            raise
        # Our cancel is taken back whatever came of it. It is the deadline when nothing
        # else cancelled the task meanwhile (a cancel of the session's — asked for, a
        # lost lease, a shutdown — is left to it), or when the handler turned it into a
        # TimeoutError of its own.
        ours = task.uncancel() <= before
        if isinstance(exc, TimeoutError) or (ours and isinstance(exc, asyncio.CancelledError)):
            raise DeadlineExceeded(budget) from None
        raise
    timer.cancel()
    if expired:  # the handler kept going past its cancel: taken back all the same
        task.uncancel()
    return result


def handler_is_async(handler: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with async __call__
    )


def format_error(exc: BaseException) -> str:
    head = f"{type(exc).__name__}: {exc}"
    tb = "".join(traceback.format_exception(exc))
    return f"{head}\n\n{tb}"
