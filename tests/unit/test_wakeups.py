"""The lease long-polls woken together by one notice are a cohort: each claims the same
share of what woke them, the last to claim none (it takes what is left); a long-poll
whose wait ended before the notice is not of it."""

from __future__ import annotations

import asyncio

from cronwheel.api.notifier import Ticket, Wakeups


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


async def test_long_polls_woken_together_share_and_the_last_takes_the_rest() -> None:
    keys = _Keys(store=None)  # type: ignore[arg-type]
    ticket = keys.ticket("pool")
    early = asyncio.create_task(keys.wait(ticket, 0.01))  # ends before the notice
    await early
    waits = [asyncio.create_task(keys.wait(ticket, 10)) for _ in range(3)]
    while keys.waiting < 3:
        await asyncio.sleep(0)
    assert ticket.waiting == 3
    keys.wake("pool")
    await asyncio.gather(*waits)
    first, second, last = ticket.claim(), ticket.claim(), ticket.claim()
    assert first is not None and first is second and first.among == 3
    assert last is None
    assert keys.ticket("pool") is not ticket  # the next wait is on a new ticket


async def test_a_long_poll_woken_alone_takes_all() -> None:
    keys = _Keys(store=None)  # type: ignore[arg-type]
    ticket = keys.ticket("pool")
    wait = asyncio.create_task(keys.wait(ticket, 10))
    while keys.waiting < 1:
        await asyncio.sleep(0)
    keys.wake("pool")
    await wait
    assert ticket.claim() is None
