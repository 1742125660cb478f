"""Shared token buckets (``rate_buckets``): what a take grants, the refill, a clock
that goes back, and takers racing on one bucket never getting more than it holds."""

from __future__ import annotations

import asyncio

import pytest

from cronwheel.store import Store

from .helpers import at


async def test_a_bucket_starts_full_refills_and_grants_what_it_holds(store: Store) -> None:
    take = store.rate_buckets_take
    first = await take(name="api:a", rate=2.0, burst=5, wanted=3, now=at(0))
    assert (first.granted, first.wait) == (3, 0.0)
    second = await take(name="api:a", rate=2.0, burst=5, wanted=3, now=at(0))
    assert second.granted == 2
    assert second.wait == pytest.approx(0.5)  # empty: one token in 1 / rate
    assert (await take(name="api:a", rate=2.0, burst=5, wanted=1, now=at(0.25))).granted == 0
    # 1.25 s after the last refill-bearing take: 2.5 tokens, 2 whole ones.
    third = await take(name="api:a", rate=2.0, burst=5, wanted=10, now=at(1.25))
    assert third.granted == 2
    # Never above the burst, however long it sat.
    assert (await take(name="api:a", rate=2.0, burst=5, wanted=10, now=at(3600))).granted == 5
    # Another name is another bucket.
    assert (await take(name="api:b", rate=2.0, burst=5, wanted=10, now=at(3600))).granted == 5


async def test_a_clock_that_goes_back_refills_nothing(store: Store) -> None:
    take = store.rate_buckets_take
    assert (await take(name="api:c", rate=1.0, burst=2, wanted=2, now=at(10))).granted == 2
    assert (await take(name="api:c", rate=1.0, burst=2, wanted=1, now=at(5))).granted == 0
    # The stamp stayed at 10: one second later is one token, not six.
    assert (await take(name="api:c", rate=1.0, burst=2, wanted=5, now=at(11))).granted == 1


async def test_racing_takers_share_the_bucket_without_double_grants(store: Store) -> None:
    async def one() -> int:
        taken = await store.rate_buckets_take(
            name="api:race", rate=0.001, burst=7, wanted=2, now=at(0)
        )
        return taken.granted

    granted = await asyncio.gather(*(one() for _ in range(12)))
    assert sum(granted) == 7
    assert sorted(granted, reverse=True)[:4] == [2, 2, 2, 1]
