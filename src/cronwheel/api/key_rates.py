"""A tenant's API request rate (``api_rate``, ``api_burst``), per key and shared by
every API node: the key's bucket is its ``rate_buckets`` row (``api:<key id>``), and
the database is the one authority on what is left in it.

No node asks the database per request. A node claims tokens from the row in blocks
(one transaction per block, ``store.rate_buckets_take``) and spends them on the key's
requests locally::

    request ─▶ tokens held here? ──yes──▶ spend one, serve
                  │ no
                  ▼
               refused here until T? ──yes──▶ 429 (the bucket cannot hold one before T)
                  │ no
                  ▼
               claim a block (one claim per key at a time on this node)
                  │ granted n ≥ 1 ──▶ hold n - 1, serve
                  │ granted 0     ──▶ refused until now + the bucket's wait, 429

What a node holds the bucket has given it and no longer holds: across all nodes a key
is never served more than ``api_burst`` + ``api_rate`` x the time elapsed. The price
is the other way round: tokens held by one node are not there for another, so a key
spread over several nodes may be refused a little early — by at most one block per
node, :func:`block_of` (a twentieth of a second at the rate, at most a quarter of the
burst, at least 1). Held tokens not spent within :data:`HOLD_SECONDS` are dropped
(never handed back), so a node that stops seeing the key stops keeping them.

A tenant's limits are read from the store and kept for :data:`LIMITS_TTL` seconds: a
change by ``PATCH /v1/tenants/{id}`` applies at once on the node that served it and
within that many seconds on every other node; tokens held under the old limits are
dropped when a node learns the new ones. Keys of a tenant without ``api_rate``, and keys
of no tenant, keep the per-process limits of ``api.rate_limits``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from cronwheel.domain.errors import NotFoundError
from cronwheel.store.base import Store

__all__ = [
    "BLOCK_SECONDS",
    "HOLD_SECONDS",
    "LIMITS_TTL",
    "MAX_WAIT",
    "KeyRate",
    "SharedKeyRates",
    "block_of",
    "rate_of",
]

log = logging.getLogger("cronwheel.api")

BLOCK_SECONDS = 0.05
HOLD_SECONDS = 1.0
LIMITS_TTL = 5.0
# The longest a refusal says to wait: a rate the limits allow (any above 0) can make
# the bucket's own wait astronomically long, or infinite.
MAX_WAIT = 86_400.0

# The clock of holds and cached limits (tests put their own in).
_clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True, slots=True)
class KeyRate:
    per_second: float  # > 0
    burst: int  # >= 1


def block_of(rate: KeyRate) -> int:
    """Tokens a node claims at once for a key of ``rate``."""
    cap = max(1, rate.burst // 4)
    return max(1, min(cap, math.ceil(rate.per_second * BLOCK_SECONDS)))


def rate_of(limits: dict[str, object]) -> KeyRate | None:
    """A tenant's per-key API rate from its stored limits; None: it has none. The
    burst defaults to twice the rate, at least 1 (``TenantLimits.api_burst``)."""
    rate = limits.get("api_rate")
    if not isinstance(rate, int | float) or rate <= 0:
        return None
    burst = limits.get("api_burst")
    if not isinstance(burst, int) or burst < 1:
        burst = max(1, math.ceil(2 * rate))
    return KeyRate(float(rate), burst)


class _Hold:
    __slots__ = ("expires", "lock", "rate", "refused_until", "throttled", "tokens")

    def __init__(self, rate: KeyRate) -> None:
        self.rate = rate
        self.tokens = 0
        self.expires = 0.0
        self.refused_until = 0.0
        self.throttled = False  # refused since it last let a request through
        self.lock = asyncio.Lock()


class SharedKeyRates:
    """The buckets of the module docstring, as one API node sees them."""

    def __init__(self, store: Store, *, max_entries: int = 100_000) -> None:
        self._store = store
        self._max = max_entries
        self._holds: OrderedDict[uuid.UUID, _Hold] = OrderedDict()
        self._limits: OrderedDict[uuid.UUID, tuple[float, KeyRate | None]] = OrderedDict()

    async def rate_for(self, tenant_id: uuid.UUID) -> KeyRate | None:
        """The tenant's per-key rate (None: none), at most :data:`LIMITS_TTL` old."""
        now = _clock()
        hit = self._limits.get(tenant_id)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            rate = rate_of((await self._store.tenants_get(tenant_id)).limits)
        except NotFoundError:
            rate = None
        except Exception:  # the store is down: the per-process limit, till it answers
            log.warning(
                "could not read a tenant's limits",
                exc_info=True,
                extra={"event": "api.tenant_limits_failed", "tenant_id": str(tenant_id)},
            )
            return None
        self._limits[tenant_id] = (now + LIMITS_TTL, rate)
        self._limits.move_to_end(tenant_id)
        while len(self._limits) > self._max:
            self._limits.popitem(last=False)
        return rate

    def forget_tenant(self, tenant_id: uuid.UUID) -> None:
        """Read the tenant's limits afresh on its next request (they changed here)."""
        self._limits.pop(tenant_id, None)

    async def take(self, key_id: uuid.UUID, rate: KeyRate) -> float:
        """Take a token for the key: 0 when there was one, else the seconds until the
        bucket can hold one."""
        hold = self._hold(key_id, rate)
        wait = self._spend(hold)
        if wait is not None:
            return wait
        async with hold.lock:  # one claim per key at a time; the others then spend it
            wait = self._spend(hold)
            if wait is not None:
                return wait
            try:
                taken = await self._store.rate_buckets_take(
                    name=f"api:{key_id}",
                    rate=rate.per_second,
                    burst=rate.burst,
                    wanted=block_of(rate),
                )
            except Exception:  # the store is down: the request finds out next
                log.warning(
                    "could not draw on a key's shared rate bucket",
                    exc_info=True,
                    extra={"event": "api.rate_bucket_failed", "key_id": str(key_id)},
                )
                return 0.0
            now = _clock()
            if taken.granted == 0:
                wait = min(MAX_WAIT, max(taken.wait, 1e-3))
                hold.refused_until = now + wait
                return wait
            hold.tokens = taken.granted - 1
            hold.expires = now + HOLD_SECONDS
            hold.throttled = False
            return 0.0

    def first_refusal(self, key_id: uuid.UUID) -> bool:
        """Whether this refusal of the key is the first since a request went through."""
        hold = self._holds.get(key_id)
        if hold is None or hold.throttled:
            return False
        hold.throttled = True
        return True

    def _hold(self, key_id: uuid.UUID, rate: KeyRate) -> _Hold:
        hold = self._holds.get(key_id)
        if hold is None or hold.rate != rate:  # new, or its tenant's limits changed
            hold = self._holds[key_id] = _Hold(rate)
            while len(self._holds) > self._max:
                self._holds.popitem(last=False)  # its tokens are dropped, never reused
        self._holds.move_to_end(key_id)
        return hold

    @staticmethod
    def _spend(hold: _Hold) -> float | None:
        """0 having spent a held token; the wait while refused here; None: claim."""
        now = _clock()
        if hold.tokens > 0 and hold.expires > now:
            hold.tokens -= 1
            hold.throttled = False
            return 0.0
        hold.tokens = 0
        if hold.refused_until > now:
            return hold.refused_until - now
        return None
