"""The worker's outbox gathers outcomes into batches, but sends a workflow node's at
once: it readies the nodes after it, and each moment it waits is a moment they wait.
The network is left out: the protocol's batch call is replaced by one that notes what
it was sent."""

from __future__ import annotations

import asyncio
import contextlib
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
    """Answers every batch as accepted and notes the attempts of each; with
    ``refuse_results``, refuses a batch with results in it, as the server refuses one
    too large to store."""

    def __init__(self, *, refuse_results: bool = False) -> None:
        super().__init__(AsyncClient("http://127.0.0.1:9", api_key="unused"))
        self.refuse_results = refuse_results
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
        if completions and self.refuse_results:
            raise ApiError(422, "validation_error", "result: too large")
        items = [*completions, *failures, *releases]
        self.sent.append([i.attempt_id for i in items])
        self.arrived.set()
        return BatchOutcomes(
            completions=[Outcome(c.attempt_id, True) for c in completions],
            failures=[Outcome(f.attempt_id, True) for f in failures],
            releases=[Outcome(r.attempt_id, True) for r in releases],
        )


@contextlib.asynccontextmanager
async def running(
    protocol: NotingProtocol, *, flush_delay: float = GATHER, defer_to: Any = None
) -> AsyncIterator[Outbox]:
    """An outbox sending through ``protocol``, its loop running."""
    box = Outbox(
        protocol,
        WorkerStats(),
        flush_delay=flush_delay,
        flush_size=100,
        backoff_max=1.0,
        on_settled=lambda _attempt: None,
        defer_to=defer_to,
    )
    runner = asyncio.create_task(box.run())
    try:
        yield box
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


@pytest.fixture
async def outbox() -> AsyncIterator[tuple[Outbox, NotingProtocol]]:
    protocol = NotingProtocol()
    async with running(protocol) as box:
        yield box, protocol


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
    # Nothing gathered: the wait is the deferral's alone; runs are always about to begin.
    async with running(protocol, flush_delay=0.0, defer_to=lambda: True) as box:
        box.add(Completion("a-1", 1, {"ok": True}))
        await asyncio.sleep(0.05)  # the outbox is deferring it now
        assert protocol.sent == []
        box.add(Completion("node-1", 1, {"ok": True}, urgent=True))
        async with asyncio.timeout(1):  # the deferral lasts 2 s: it must end sooner
            await protocol.arrived.wait()
    assert sorted(protocol.sent[0]) == ["a-1", "node-1"]


async def test_a_nodes_refused_result_goes_back_at_once_as_its_failure() -> None:
    protocol = NotingProtocol(refuse_results=True)
    async with running(protocol) as box:
        box.add(Completion("node-1", 1, {"big": "x"}, urgent=True))
        async with asyncio.timeout(1):  # not after GATHER: it still readies nodes
            await protocol.arrived.wait()
    assert protocol.sent == [["node-1"]]
