"""Token buckets every node draws on (``rate_buckets``): one row per bucket, its level
and the instant it was last drawn on, the arithmetic in ``domain.bucket``.

A take locks the row, reads the database clock *after* the lock (so stamps only move
forward, whichever node drew last), computes the level, grants whole tokens and writes
what is left, in one transaction: two nodes taking at once take in turn, and together
never get more than the bucket holds. A bucket seen for the first time is full.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from cronwheel.domain.bucket import TokenBucket
from cronwheel.store.schema import rate_buckets
from cronwheel.store.sql.core import SqlCore
from cronwheel.store.values import BucketTake

__all__ = ["RateBucketsMixin"]


class RateBucketsMixin(SqlCore):
    async def rate_buckets_take(
        self,
        *,
        name: str,
        rate: float,
        burst: float,
        wanted: int,
        now: datetime | None = None,
    ) -> BucketTake:
        bucket = TokenBucket(rate=rate, burst=burst)
        locked = sa.select(rate_buckets.c.tokens, rate_buckets.c.stamp).where(
            rate_buckets.c.name == name
        )
        async with self._write() as conn:
            row = (await conn.execute(locked.with_for_update())).first()
            at = await self._now(conn, now)
            if row is None:  # two first takes at once: one inserts, both then lock it
                full = {"name": name, "tokens": float(burst), "stamp": at}
                await conn.execute(self.driver.insert_ignore(rate_buckets, [full]))
                row = (await conn.execute(locked.with_for_update())).one()
            level = bucket.level(row.tokens, row.stamp, at)
            granted = bucket.grant(level, wanted)
            await conn.execute(
                rate_buckets.update()
                .where(rate_buckets.c.name == name)
                .values(tokens=level - granted, stamp=max(at, row.stamp))
            )
        return BucketTake(granted=granted, wait=bucket.wait(level - granted))
