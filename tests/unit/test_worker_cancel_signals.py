"""What the worker session does with the cancels its long-poll hears (``cancels.py``),
without a server: a cancel heard twice — or by the long-poll and a heartbeat both — is
told to the handler once, and one heard before its lease answer arrived is told when
the attempt does."""

from __future__ import annotations

import asyncio

from test_worker_waiting import Harness, harness, lease

from cronwheel.worker.protocol import Failure, TokenRef

__all__ = ["harness"]


async def test_a_cancel_heard_twice_is_told_once(harness: Harness) -> None:
    session = harness.session
    first, second = lease(0), lease(1)
    session._receive(first)
    await asyncio.sleep(0)  # the handler begins
    session._receive(second)  # waits for the one slot
    ref = TokenRef(first.attempt_id, first.fencing_token)
    session.cancels._hear(ref)
    held = session.held[first.attempt_id]
    assert held.ctx.cancel_requested
    assert session.cancels._known() == [first.fencing_token]  # the next poll says so
    session.cancels._hear(ref)  # heard again, and by a heartbeat
    if not held.ctx.cancel_requested:  # (the heartbeat's own guard)
        session._cancel_requested(held)
    harness.gate.set()
    await harness.until_idle()
    assert harness.started == [0, 1]  # the waiting run started in the freed slot
    [failure] = session.outbox._failures
    assert isinstance(failure, Failure) and failure.attempt_id == first.attempt_id
    assert "cancelled on request" in failure.error and not failure.retryable


async def test_a_cancel_heard_before_its_lease_arrived_is_told_on_arrival(
    harness: Harness,
) -> None:
    session = harness.session
    early = lease(0)
    session.cancels._hear(TokenRef(early.attempt_id, early.fencing_token))
    assert session.cancels._known() == [early.fencing_token]  # not asked again
    session._receive(early)
    harness.gate.set()
    await harness.until_idle()
    assert harness.started == []  # never began
    [failure] = session.outbox._failures
    assert failure.attempt_id == early.attempt_id
    assert "before it started" in failure.error
    assert session.cancels._known() == [early.fencing_token]  # held, its cancel known


async def test_a_cancelled_handler_tells_nothing_of_how_long_handlers_take(
    harness: Harness,
) -> None:
    """Prefetch follows the handlers' mean duration: one stopped by a cancel would make
    long handlers look short, and runs would wait behind busy slots."""
    session = harness.session
    first, second = lease(0), lease(1)
    session._receive(first)
    await asyncio.sleep(0)  # the handler begins
    session.cancels._hear(TokenRef(first.attempt_id, first.fencing_token))
    await harness.until_idle()
    assert session._duration is None and session._prefetch() == 0
    harness.gate.set()
    session._receive(second)
    await harness.until_idle()
    assert session._duration is not None  # one that ran its course counts
