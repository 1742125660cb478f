"""Request rate limits: a token bucket per API key, and one per client address for
requests without a valid key.

============================  ==============  ========================================
who                           one bucket per  settings (defaults)
============================  ==============  ========================================
operator and viewer keys,     key             ``rate_limit`` (100 a second),
the metrics token                             ``rate_limit_burst`` (200)
worker keys, the admin key    key             ``worker_rate_limit`` (2,000 a second),
                                              ``worker_rate_limit_burst`` (4,000)
no valid key                  client address  ``anonymous_rate_limit`` (20 a second),
                                              ``anonymous_rate_limit_burst`` (100)
============================  ==============  ========================================

A bucket holds up to its burst and refills at its rate; a request takes one token.
With none left the answer is 429 ``rate_limited`` with ``Retry-After`` (whole seconds)
and ``details.retry_after`` (seconds), and nothing is done. A rate of 0 turns its limit
off. ``/healthz`` and ``/readyz`` are never limited.

Worker keys carry the worker protocol of a whole fleet — leases, heartbeats, batch
reports, starts; a benchmark pushes thousands of runs a second through a few worker
keys — so their limit sits above what one API process serves: it keeps one runaway key
from taking a process over, never throttles a healthy fleet. The admin key drives the
built-in webhook workers and counts the same way.

Cheap on every request: the key is recognised through the key cache (a hash and a
dictionary look-up), never by a database round trip of its own; a key found valid stays
recognised here for :data:`RECENT_KEY_SECONDS` after its cache entry expires. A key not
recognised is looked up once here, as authentication would do next anyway (it then
finds it cached) — but first charged to its client address: a flood of made-up keys is
slowed before it costs the database or learns anything, and the charge is refunded when
the key turns out valid. So a flood from one address can hold up only keys this process
has not seen lately, never the clients already at work.

These buckets live in each API process: with N processes a key gets up to N times its
limit. A tenant may instead have a per-key rate shared by every API node
(``api_rate``, ``api_burst`` of its limits; ``api.key_rates``): its keys are then
charged there and not here. Behind a proxy the client address is the proxy's, so
requests without a valid key share its one bucket.

Every refusal counts in ``cronwheel_api_rate_limited_total{tenant}`` (``none`` for
requests without a tenant's key).
"""

from __future__ import annotations

import hmac
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import TypeGuard

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from cronwheel.api.auth import KEY_PREFIX, MAX_KEY_LENGTH, KeyCache, bearer_token, hash_key
from cronwheel.api.key_rates import SharedKeyRates
from cronwheel.domain.errors import RateLimitedError
from cronwheel.domain.model import ApiKey
from cronwheel.metrics import API_RATE_LIMITED
from cronwheel.settings import Settings

__all__ = ["RECENT_KEY_SECONDS", "Buckets", "Rate", "RateLimitMiddleware"]

log = logging.getLogger("cronwheel.api")

_EXEMPT = frozenset({"/healthz", "/readyz"})
RECENT_KEY_SECONDS = 600.0

# The buckets' clock (tests put their own in).
_clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True, slots=True)
class Rate:
    per_second: float  # 0: no limit
    burst: int


@dataclass(frozen=True, slots=True)
class _Charge:
    """What a request was charged to: the limit, the bucket's name, its wait (0: go),
    and who it was (for the refusal's message, log line and metric)."""

    per_second: float
    burst: int
    name: Hashable
    wait: float
    by_address: bool
    tenant: str  # the key's tenant, or "none"
    first_refusal: Callable[[], bool]


class _Bucket:
    __slots__ = ("stamp", "throttled", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp
        self.throttled = False  # refused since it last let a request through


class Buckets:
    """Token buckets of one :class:`Rate`, by name; at most ``max_entries`` of them (the
    least recently used is dropped, which only ever gives its name a full bucket)."""

    def __init__(self, rate: Rate, *, max_entries: int = 100_000) -> None:
        self.rate = rate
        self._max = max_entries
        self._buckets: OrderedDict[Hashable, _Bucket] = OrderedDict()

    def take(self, name: Hashable, now: float) -> float:
        """Take a token for ``name``: 0 when there was one, else the seconds until
        there is."""
        rate = self.rate
        if rate.per_second <= 0:
            return 0.0
        bucket = self._buckets.get(name)
        if bucket is None:
            bucket = self._buckets[name] = _Bucket(float(rate.burst), now)
            if len(self._buckets) > self._max:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(name)
            refill = (now - bucket.stamp) * rate.per_second
            bucket.tokens = min(float(rate.burst), bucket.tokens + refill)
            bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            bucket.throttled = False
            return 0.0
        return (1.0 - bucket.tokens) / rate.per_second

    def refund(self, name: Hashable) -> None:
        bucket = self._buckets.get(name)
        if bucket is not None:
            bucket.tokens = min(float(self.rate.burst), bucket.tokens + 1.0)

    def first_refusal(self, name: Hashable) -> bool:
        """Whether this refusal of ``name`` is the first since a request went through
        (one log line per episode, however long the flood)."""
        bucket = self._buckets.get(name)
        if bucket is None or bucket.throttled:
            return False
        bucket.throttled = True
        return True


def _usable(record: ApiKey | None) -> TypeGuard[ApiKey]:
    return record is not None and record.revoked_at is None


class RateLimitMiddleware:
    """The limits of the module docstring, in front of everything but the probes."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: Settings,
        key_cache: KeyCache,
        shared: SharedKeyRates | None = None,
    ) -> None:
        self.app = app
        self.key_cache = key_cache
        self.shared = shared
        self.admin_key = settings.admin_key.encode() if settings.admin_key else None
        self.metrics_token = settings.metrics_token.encode() if settings.metrics_token else None
        self.keys = Buckets(Rate(settings.rate_limit, settings.rate_limit_burst))
        self.workers = Buckets(Rate(settings.worker_rate_limit, settings.worker_rate_limit_burst))
        self.anonymous = Buckets(
            Rate(settings.anonymous_rate_limit, settings.anonymous_rate_limit_burst)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _EXEMPT:
            await self.app(scope, receive, send)
            return
        charge = await self._charge(scope)
        if charge.wait > 0:
            await self._refuse(scope, receive, send, charge)
            return
        await self.app(scope, receive, send)

    def _local(
        self, buckets: Buckets, name: Hashable, now: float, *, tenant: str = "none"
    ) -> _Charge:
        return _Charge(
            per_second=buckets.rate.per_second,
            burst=buckets.rate.burst,
            name=name,
            wait=buckets.take(name, now),
            by_address=buckets is self.anonymous,
            tenant=tenant,
            first_refusal=lambda: buckets.first_refusal(name),
        )

    async def _charge(self, scope: Scope) -> _Charge:
        """Take a token from the request's bucket."""
        now = _clock()
        client = scope.get("client")
        address = client[0] if client else "unknown"
        key = bearer_token(scope["headers"])
        if key is None:
            return self._local(self.anonymous, address, now)
        if self.admin_key is not None and hmac.compare_digest(key.encode(), self.admin_key):
            return self._local(self.workers, "admin", now)
        if self.metrics_token is not None and hmac.compare_digest(key.encode(), self.metrics_token):
            return self._local(self.keys, "metrics", now)
        if not key.startswith(KEY_PREFIX) or len(key) > MAX_KEY_LENGTH:
            return self._local(self.anonymous, address, now)
        key_hash = hash_key(key)
        known, record = self.key_cache.peek(key_hash, stale_for=RECENT_KEY_SECONDS)
        if known:
            if _usable(record):
                return await self._take_key(record, now)
            return self._local(self.anonymous, address, now)
        # Not cached: charged to the address until the look-up says it is a key.
        charge = self._local(self.anonymous, address, now)
        if charge.wait > 0:
            return charge
        free = replace(charge, wait=0.0)
        try:
            record = await self.key_cache.lookup(key_hash)
        except Exception:  # the store is down: authentication says so next
            return free
        if _usable(record):
            self.anonymous.refund(address)
            return await self._take_key(record, now)
        return free

    async def _take_key(self, record: ApiKey, now: float) -> _Charge:
        tenant = "none" if record.tenant_id is None else str(record.tenant_id)
        if self.shared is not None and record.tenant_id is not None:
            rate = await self.shared.rate_for(record.tenant_id)
            if rate is not None:
                shared = self.shared
                return _Charge(
                    per_second=rate.per_second,
                    burst=rate.burst,
                    name=record.id,
                    wait=await shared.take(record.id, rate),
                    by_address=False,
                    tenant=tenant,
                    first_refusal=lambda: shared.first_refusal(record.id),
                )
        # Worker keys and admin keys (the bootstrap one lives in the database) carry
        # whole fleets' worker protocol.
        buckets = self.workers if record.role in ("worker", "admin") else self.keys
        return self._local(buckets, record.id, now, tenant=tenant)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, charge: _Charge) -> None:
        who = "with this API key"
        if charge.by_address:
            who = "from this address without a valid API key"
        API_RATE_LIMITED.labels(tenant=charge.tenant).inc()
        if charge.first_refusal():
            log.warning(
                "rate limited %s",
                who,
                extra={
                    "event": "api.rate_limited",
                    "bucket": "address" if charge.by_address else "key",
                    "who": str(charge.name),
                    "tenant": charge.tenant,
                    "limit": charge.per_second,
                },
            )
        wait = charge.wait
        error = RateLimitedError(
            f"too many requests {who} (at most {charge.per_second:g} a second, "
            f"{charge.burst} at once): retry in {wait:.2f} s",
            retry_after=round(wait, 3),
        )
        response = JSONResponse(
            error.to_dict(),
            status_code=error.status,
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )
        await response(scope, receive, send)
