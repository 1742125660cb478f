"""A token bucket's arithmetic, the one place it is written: what a bucket holds now
and how long until it holds enough. Where the bucket is kept (a process's memory, a
``rate_buckets`` row every node draws on) is the caller's business.

A bucket holds up to ``burst`` tokens and refills at ``rate`` a second; taking ``n``
needs ``n`` in it. A bucket seen for the first time is full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

__all__ = ["TokenBucket"]


@dataclass(frozen=True, slots=True)
class TokenBucket:
    rate: float  # tokens a second, > 0
    burst: float  # the most it holds, >= 1

    def level(self, tokens: float | None, stamp: datetime | None, now: datetime) -> float:
        """What the bucket holds at ``now``, having held ``tokens`` at ``stamp``
        (``None``: never drawn on, so full). A clock that went back refills nothing."""
        if tokens is None or stamp is None:
            return self.burst
        elapsed = max(0.0, (now - stamp).total_seconds())
        return min(self.burst, tokens + elapsed * self.rate)

    def grant(self, level: float, wanted: int) -> int:
        """How many whole tokens of ``wanted`` a bucket holding ``level`` gives."""
        return max(0, min(wanted, math.floor(level + 1e-9)))

    def wait(self, level: float, n: float = 1.0) -> float:
        """Seconds until a bucket holding ``level`` holds ``n`` (0: it does now)."""
        return max(0.0, (n - level) / self.rate)
