"""The worker's outbox gathers outcomes into batches, but sends a workflow node's at
once: it readies the nodes after it, and each moment it waits is a moment they wait.
The network is left out: the protocol's batch call is replaced by one that notes what
it was sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from cronwheel.client import ApiError, AsyncClient
from cronwheel.worker.outbox import Outbox, WorkerStats
from cronwheel.worker.protocol import (
    BatchOutcomes,
    Completion,
    Failure,
    Outcome,
    TokenRef,
    WorkerProtocol,
)

GATHER = 3600.0  # the outbox's wait to gather a batch: far longer than any test runs


class NotingProtocol(WorkerProtocol):
    """Answers every batch as accepted and notes the attempts of each."""

    def __init__(self) -> None:
        super().__init__(AsyncClient("http://127.0.0.1:9", api_key="unused"))
        self.sent: list[list[str]] = []
        self.arrived = asyncio.Event()

    async def batch(
        self,
        *,
        heartbeats: Sequence[Any] = (),
        completions: Sequence[Completion] = (),
        failures: Sequence[Failure] = (),
        releases: Sequence[TokenRef] = (),
    ) -> BatchOutcomes:
        items = [*completions, *failures, *releases]
        self.sent.append([i.attempt_id for i in items])
        self.arrived.set()
        return BatchOutcomes(
            completions=[Outcome(c.attempt_id, True) for c in completions],
            failures=[Outcome(f.attempt_id, True) for f in failures],
            releases=[Outcome(r.attempt_id, True) for r in releases],
        )


@pytest.fixture
async def outbox() -> AsyncIterator[tuple[Outbox, NotingProtocol]]:
    protocol = NotingProtocol()
    box = Outbox(
        protocol,
        WorkerStats(),
        flush_delay=GATHER,
        flush_size=100,
        backoff_max=1.0,
        on_settled=lambda _attempt: None,
    )
    runner = asyncio.create_task(box.run())
    try:
        yield box, protocol
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def _settle() -> None:
    """Let the outbox's loop run until it waits on something other than the loop."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_an_ordinary_outcome_waits_to_be_gathered_into_a_batch(
    outbox: tuple[Outbox, NotingProtocol],
) -> None:
    box, protocol = outbox
    box.add(Completion("a-1", 1, {"ok": True}))
    await _settle()
    assert protocol.sent == []
    assert box.pending() == 1


@pytest.mark.parametrize(
    "urgent",
    [
        Completion("node-1", 1, {"ok": True}, urgent=True),
        Failure("node-1", 1, "boom", retryable=False, urgent=True),
    ],
    ids=["completion", "failure"],
)
async def test_a_workflow_nodes_outcome_goes_at_once_with_what_waited(
    outbox: tuple[Outbox, NotingProtocol], urgent: Completion | Failure
) -> None:
    box, protocol = outbox
    box.add(Completion("a-1", 1, {"ok": True}))
    await _settle()
    assert protocol.sent == []  # gathering, GATHER seconds to go
    box.add(urgent)
    async with asyncio.timeout(10):
        await protocol.arrived.wait()
    assert sorted(protocol.sent[0]) == ["a-1", "node-1"]
    assert box.pending() == 0


async def test_a_workflow_nodes_outcome_ends_the_wait_for_runs_about_to_start() -> None:
    """While runs are about to begin, a worker's outcomes wait (up to two seconds): the
    starts go first. A node's outcome queued during that wait ends it."""
    protocol = NotingProtocol()
    box = Outbox(
        protocol,
        WorkerStats(),
        flush_delay=0.0,  # nothing gathered: the wait is the deferral's alone
        flush_size=100,
        backoff_max=1.0,
        on_settled=lambda _attempt: None,
        defer_to=lambda: True,  # runs are always about to begin
    )
    runner = asyncio.create_task(box.run())
    try:
        box.add(Completion("a-1", 1, {"ok": True}))
        await asyncio.sleep(0.05)  # the outbox is deferring it now
        assert protocol.sent == []
        box.add(Completion("node-1", 1, {"ok": True}, urgent=True))
        async with asyncio.timeout(1):  # the deferral lasts 2 s: it must end sooner
            await protocol.arrived.wait()
        assert sorted(protocol.sent[0]) == ["a-1", "node-1"]
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


class RefusingResults(NotingProtocol):
    """Refuses every result (as the server refuses one too large to store)."""

    async def batch(
        self,
        *,
        heartbeats: Sequence[Any] = (),
        completions: Sequence[Completion] = (),
        failures: Sequence[Failure] = (),
        releases: Sequence[TokenRef] = (),
    ) -> BatchOutcomes:
        if completions:
            raise ApiError(422, "validation_error", "result: too large")
        return await super().batch(failures=failures, releases=releases)


async def test_a_nodes_refused_result_goes_back_at_once_as_its_failure() -> None:
    protocol = RefusingResults()
    box = Outbox(
        protocol,
        WorkerStats(),
        flush_delay=GATHER,
        flush_size=100,
        backoff_max=1.0,
        on_settled=lambda _attempt: None,
    )
    runner = asyncio.create_task(box.run())
    try:
        box.add(Completion("node-1", 1, {"big": "x"}, urgent=True))
        async with asyncio.timeout(1):  # not after GATHER: it still readies nodes
            await protocol.arrived.wait()
        assert protocol.sent == [["node-1"]]
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
