"""The lease long-polls woken together by one notice are a cohort: each claims the same
share of what woke them; a long-poll whose wait ended before the notice is not of it,
and one woken alone shares with none."""

from __future__ import annotations

import asyncio

from cronwheel.api.notifier import Ticket, Wakeups
from cronwheel.testing import wait_until_async


class _Keys(Wakeups[str]):
    channel = "test"
    name = "test"

    def _start(self) -> None:  # no subscription: woken by hand
        pass

    async def _on_notices(self, payloads: list[str]) -> None:
        raise AssertionError("no notices here")

    def ticket(self, key: str) -> Ticket:
        return self._ticket(key)

    def wake(self, key: str) -> None:
        self._wake_keys([key])


async def test_long_polls_woken_together_share_one_batch() -> None:
    keys = _Keys(store=None)  # type: ignore[arg-type]
    ticket = keys.ticket("pool")
    early = asyncio.create_task(keys.wait(ticket, 0.01))  # ends before the notice
    await early
    waits = [asyncio.create_task(keys.wait(ticket, 10)) for _ in range(3)]
    await wait_until_async(lambda: keys.waiting == 3)
    assert ticket.waiting == 3
    keys.wake("pool")
    await asyncio.gather(*waits)
    first, second, third = ticket.claim(), ticket.claim(), ticket.claim()
    assert first is not None and first is second is third and first.among == 3
    assert keys.ticket("pool") is not ticket  # the next wait is on a new ticket


async def test_a_long_poll_cancelled_as_it_is_woken_is_not_of_the_cohort() -> None:
    keys = _Keys(store=None)  # type: ignore[arg-type]
    ticket = keys.ticket("pool")
    waits = [asyncio.create_task(keys.wait(ticket, 10)) for _ in range(3)]
    await wait_until_async(lambda: keys.waiting == 3)
    keys.wake("pool")
    waits[0].cancel()  # before it runs again: woken, then cancelled
    await asyncio.gather(*waits, return_exceptions=True)
    assert waits[0].cancelled()
    share = ticket.claim()
    assert share is not None and share.among == 2


async def test_a_long_poll_woken_alone_takes_all_and_so_does_one_joining_after() -> None:
    keys = _Keys(store=None)  # type: ignore[arg-type]
    ticket = keys.ticket("pool")
    wait = asyncio.create_task(keys.wait(ticket, 10))
    await wait_until_async(lambda: keys.waiting == 1)
    keys.wake("pool")
    await wait
    assert ticket.claim() is None
    await keys.wait(ticket, 10)  # already set: returns at once, counted
    assert ticket.waiting == 2
    assert ticket.claim() is None
