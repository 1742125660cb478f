"""API keys and who may do what.

A request carries ``Authorization: Bearer <key>``. Keys are ``cw_`` followed by 32
random bytes (URL-safe base64); the store keeps only their SHA-256 and a short prefix
for people to recognise them by. The admin key comes from the settings and is compared
in constant time; it belongs to no tenant, so on tenant resources (jobs, runs) it must
name one with the ``Cronwheel-Tenant`` header.

=========  ==================================================================
role       may
=========  ==================================================================
admin      everything; tenants and keys; the worker protocol for every tenant
operator   read and write its own tenant's jobs and runs
viewer     read its own tenant's jobs and runs
worker     the worker protocol only (its own tenant's runs, or every tenant's
           when the key has no tenant)
=========  ==================================================================

The admin key is ``CRONWHEEL_ADMIN_KEY`` (from the settings), or the deployment's
bootstrap admin key, which lives hashed in the database like any other key: every API
node knows it.

Key look-ups are cached (``key_cache_ttl``, :data:`KEY_CACHE_TTL` seconds by default):
a worker heartbeating every few seconds must not cost a database round trip per
request. A revocation does not wait for the cache: its notice (LISTEN/NOTIFY on
PostgreSQL, in process on SQLite) makes every API node drop the key at once
(:meth:`KeyCache.follow_revocations`). The database stays the truth; should a notice be
lost (a dropped LISTEN connection), the TTL bounds how long the key keeps working. A
deleted tenant's keys go the same way (and from the deleting node's cache before its
answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
import uuid
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any, cast

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from cronwheel.api.errors import TenantRequiredError
from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import AuthError, NotFoundError, PermissionDeniedError
from cronwheel.domain.model import ApiKey
from cronwheel.settings import Settings
from cronwheel.store.base import Store, Subscription
from cronwheel.store.notices import CHANNEL_KEYS_REVOKED, parse_key_revoked

__all__ = [
    "KEY_CACHE_TTL",
    "KEY_PREFIX",
    "MAX_KEY_LENGTH",
    "REQUEST_ID_HEADER",
    "TENANT_HEADER",
    "KeyCache",
    "Principal",
    "TenantScope",
    "actor_of",
    "authenticate",
    "bearer_token",
    "generate_key",
    "hash_key",
    "may_read_metrics",
    "request_id_of",
    "require_admin",
    "require_metrics_reader",
    "require_worker",
    "tenant_or_every_reader",
    "tenant_reader",
    "tenant_writer",
    "tenant_writer_of",
]

log = logging.getLogger("cronwheel.api")

KEY_PREFIX = "cw_"
KEY_CACHE_TTL = 5.0
TENANT_HEADER = "Cronwheel-Tenant"
_NEGATIVE_TTL = 1.0
MAX_KEY_LENGTH = 256
# Names a request in the audit trail: the client's own (``X-Request-Id``), or one the
# API makes; the answer carries it back either way.
REQUEST_ID_HEADER = "X-Request-Id"
_REQUEST_ID_MAX = 200
_REQUEST_ID_SCOPE = "cronwheel.request_id"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> tuple[str, str, str]:
    """A new key: ``(key, sha256 hex, prefix)``. Only the hash and prefix are stored."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_key(key), key[:10]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling."""

    role: str
    tenant_id: uuid.UUID | None
    key_id: uuid.UUID | None  # None: the admin key of the settings

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def actor(self) -> str:
        """What the audit trail records as having done something: ``admin`` for the
        admin key, else the key's id."""
        return "admin" if self.key_id is None or self.is_admin else str(self.key_id)


@dataclass(frozen=True, slots=True)
class TenantScope:
    """A principal acting on one tenant's resources."""

    principal: Principal
    tenant_id: uuid.UUID


def request_id_of(scope: MutableMapping[str, Any]) -> str | None:
    """The request's id, made once per request (``X-Request-Id`` when the client sent
    a usable one); None when the client sent one that is not: at most 200 printable
    ASCII characters."""
    found = scope.get(_REQUEST_ID_SCOPE)
    if found is not None:
        return str(found)
    given: str
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            given = value.decode("latin-1")
            if not 0 < len(given) <= _REQUEST_ID_MAX or not (
                given.isascii() and given.isprintable()
            ):
                return None
            break
    else:
        given = uuid.uuid4().hex
    scope[_REQUEST_ID_SCOPE] = given
    return given


def actor_of(request: Request, principal: Principal) -> Actor:
    """Who is changing something, as the history and the audit trail record it."""
    return Actor(
        name=principal.actor,
        role=principal.role,
        key_id=principal.key_id,
        request_id=request_id_of(request.scope),
    )


class KeyCache:
    """Key records by hash, each kept for ``ttl`` seconds (unknown hashes for less, so a
    freshly created key works at once while a flood of wrong keys stays cheap), and
    forgotten at once when revoked (:meth:`forget`, :meth:`follow_revocations`)."""

    def __init__(self, store: Store, *, ttl: float = KEY_CACHE_TTL, max_entries: int = 10_000):
        self._store = store
        self._ttl = ttl
        self._max_entries = max_entries
        self._entries: dict[str, tuple[float, ApiKey | None]] = {}
        # Bumped by every revocation heard of: a look-up that began before one does not
        # cache what it read, which may predate the revocation.
        self._generation = 0

    def forget(self, key_id: uuid.UUID) -> None:
        """Drop the key ``key_id`` (revoked): its next request reads the store."""
        self._generation += 1
        self._entries = {
            h: e for h, e in self._entries.items() if e[1] is None or e[1].id != key_id
        }

    def clear(self) -> None:
        self._generation += 1
        self._entries = {}

    async def follow_revocations(self, ready: asyncio.Event | None = None) -> None:
        """Forget every key revoked anywhere as its notice arrives, until cancelled
        (the app runs it for its lifetime); ``ready`` is set once subscribed."""
        subscription: Subscription | None = None
        try:
            while True:
                try:
                    if subscription is None:
                        subscription = self._store.subscribe(CHANNEL_KEYS_REVOKED)
                        # Whatever was revoked while no one listened is forgotten too.
                        self.clear()
                        if ready is not None:
                            ready.set()
                    for payload in await subscription.wait(5.0):
                        try:
                            self.forget(parse_key_revoked(payload))
                        except ValueError:
                            self.clear()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.warning(
                        "key revocation subscription failed",
                        exc_info=True,
                        extra={"event": "api.key_subscription_failed"},
                    )
                    with contextlib.suppress(Exception):
                        if subscription is not None:
                            subscription.close()
                    subscription = None
                    await asyncio.sleep(1.0)
        finally:
            if subscription is not None:
                subscription.close()

    def peek(self, key_hash: str, *, stale_for: float = 0.0) -> tuple[bool, ApiKey | None]:
        """``(known, record)`` from the cache alone, never the store: ``known`` is False
        when the hash is not cached or its entry expired — except that a key found
        valid stays known for ``stale_for`` seconds past its expiry (for rate limits,
        which only need to tell a client that had a key from one that never did;
        :meth:`lookup`, which authentication uses, never answers stale)."""
        hit = self._entries.get(key_hash)
        if hit is None:
            return False, None
        expires, record = hit
        now = time.monotonic()
        if expires > now or (record is not None and expires + stale_for > now):
            return True, record
        return False, None

    async def lookup(self, key_hash: str) -> ApiKey | None:
        now = time.monotonic()
        hit = self._entries.get(key_hash)
        if hit is not None and hit[0] > now:
            return hit[1]
        generation = self._generation
        key = await self._store.api_keys_get_by_hash(key_hash=key_hash)
        if generation != self._generation:
            return key  # a revocation was heard meanwhile: do not keep what predates it
        if len(self._entries) >= self._max_entries:
            self._evict(now)
        ttl = self._ttl if key else min(self._ttl, _NEGATIVE_TTL)
        self._entries[key_hash] = (now + ttl, key)
        return key

    def forget_tenant(self, tenant_id: uuid.UUID) -> None:
        """Drop the cached keys of a deleted tenant before the deletion is answered (its
        keys' notices make every node, this one too, forget them as they arrive)."""
        self._generation += 1
        self._entries = {
            h: e for h, e in self._entries.items() if e[1] is None or e[1].tenant_id != tenant_id
        }

    def _evict(self, now: float) -> None:
        self._entries = {h: e for h, e in self._entries.items() if e[0] > now}
        while len(self._entries) >= self._max_entries:  # all live: drop the oldest
            del self._entries[next(iter(self._entries))]


_bearer = HTTPBearer(
    auto_error=False,
    description="`Authorization: Bearer <key>`: the admin key or a tenant key.",
)


def _settings(request: Request) -> Settings:
    return cast(Settings, request.app.state.settings)


def _store(request: Request) -> Store:
    return cast(Store, request.app.state.store)


def _key_cache(request: Request) -> KeyCache:
    return cast(KeyCache, request.app.state.key_cache)


async def authenticate(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
) -> Principal:
    if credentials is None or not credentials.credentials:
        raise AuthError("missing API key: send 'Authorization: Bearer <key>'")
    key = credentials.credentials.strip()
    admin_key = _settings(request).admin_key
    if admin_key and hmac.compare_digest(key.encode(), admin_key.encode()):
        return Principal(role="admin", tenant_id=None, key_id=None)
    if not key.startswith(KEY_PREFIX) or len(key) > MAX_KEY_LENGTH:
        raise AuthError("invalid API key")
    record = await _key_cache(request).lookup(hash_key(key))
    if record is None or record.revoked_at is not None:
        raise AuthError("invalid API key")
    return Principal(role=record.role, tenant_id=record.tenant_id, key_id=record.id)


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header among raw ASGI ``headers``
    (for the code in front of FastAPI's own parsing: middleware, bare ASGI apps)."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            key = key.strip()
            return key if scheme.lower() == "bearer" and key else None
    return None


def may_read_metrics(key: str, settings: Settings) -> bool:
    """``key`` is the metrics token or the admin key (compared in constant time)."""
    presented = key.strip().encode()
    return any(
        secret is not None and hmac.compare_digest(presented, secret.encode())
        for secret in (settings.metrics_token, settings.admin_key)
    )


async def require_metrics_reader(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
) -> None:
    """The metrics token or the admin key: metrics describe every tenant at once. A
    tenant's own key is refused (403), anything else is 401."""
    if credentials is None or not credentials.credentials:
        raise AuthError(
            "missing credentials: send 'Authorization: Bearer <metrics token or admin key>'"
        )
    if may_read_metrics(credentials.credentials, _settings(request)):
        return
    principal = await authenticate(request, credentials)  # 401 unless it is some key
    if principal.is_admin:  # the bootstrap admin key, kept in the database
        return
    raise PermissionDeniedError("metrics need the metrics token or the admin key")


async def require_admin(principal: Principal = Depends(authenticate)) -> Principal:
    if not principal.is_admin:
        raise PermissionDeniedError("this operation needs the admin key")
    return principal


async def require_worker(
    principal: Principal = Depends(authenticate),
    cronwheel_tenant: str | None = Header(
        default=None,
        alias=TENANT_HEADER,
        description="Not taken by the worker protocol: a worker key acts for its own "
        "tenant (naming it is allowed), the admin key's workers are shared.",
    ),
) -> Principal:
    if principal.role not in ("worker", "admin"):
        raise PermissionDeniedError("the worker protocol needs a worker key")
    # The admin key's workers are shared: it names no tenant here.
    _own_tenant_only(principal, cronwheel_tenant)
    return principal


def _own_tenant_only(principal: Principal, tenant_header: str | None) -> None:
    """A key that acts for its own tenant (a tenant's key; the admin key on the worker
    protocol, for none) may name only that tenant: taken and ignored, the header would
    have the request act elsewhere than its sender meant (403)."""
    if tenant_header and tenant_header.strip() != str(principal.tenant_id):
        raise PermissionDeniedError(
            f"{TENANT_HEADER} names {tenant_header.strip()!r}, not this key's tenant: it "
            "acts for its own only (a tenant's work needs that tenant's key, or the "
            "admin key on the tenant routes)",
            field=TENANT_HEADER,
        )


async def _scope(request: Request, principal: Principal, tenant_header: str | None) -> TenantScope:
    if principal.is_admin:
        if not tenant_header:
            raise TenantRequiredError(
                f"the admin key acts on a tenant's jobs and runs only when the request names "
                f"the tenant: send the header '{TENANT_HEADER}: <tenant id>'",
                field=TENANT_HEADER,
            )
        try:
            tenant_id = uuid.UUID(tenant_header.strip())
        except ValueError:
            raise NotFoundError(f"no tenant {tenant_header!r}", field=TENANT_HEADER) from None
        try:
            await _store(request).tenants_get(tenant_id)
        except NotFoundError:
            raise NotFoundError(f"no tenant {tenant_id}", field=TENANT_HEADER) from None
        return TenantScope(principal=principal, tenant_id=tenant_id)
    if principal.role == "worker":
        raise PermissionDeniedError("worker keys may use only the worker protocol")
    if principal.tenant_id is None:
        raise PermissionDeniedError("this key belongs to no tenant")
    _own_tenant_only(principal, tenant_header)
    return TenantScope(principal=principal, tenant_id=principal.tenant_id)


async def tenant_reader(
    request: Request,
    principal: Principal = Depends(authenticate),
    cronwheel_tenant: str | None = Header(
        default=None,
        alias=TENANT_HEADER,
        description="The tenant id: required with the admin key; another key may name its own.",
    ),
) -> TenantScope:
    """Admin (naming a tenant), operator or viewer."""
    return await _scope(request, principal, cronwheel_tenant)


async def tenant_writer(
    request: Request,
    principal: Principal = Depends(authenticate),
    cronwheel_tenant: str | None = Header(
        default=None,
        alias=TENANT_HEADER,
        description="The tenant id: required with the admin key; another key may name its own.",
    ),
) -> TenantScope:
    """Admin (naming a tenant) or operator."""
    scope = await _scope(request, principal, cronwheel_tenant)
    if principal.role not in ("admin", "operator"):
        raise PermissionDeniedError(f"a {principal.role} key may only read")
    return scope


async def tenant_writer_of(request: Request) -> TenantScope:
    """:func:`tenant_writer` with its dependencies solved by hand (for ``solved_by``)."""
    principal = await authenticate(request, await _bearer(request))
    return await tenant_writer(request, principal, request.headers.get(TENANT_HEADER))


async def tenant_or_every_reader(
    request: Request,
    principal: Principal = Depends(authenticate),
    cronwheel_tenant: str | None = Header(
        default=None,
        alias=TENANT_HEADER,
        description="With the admin key: only this tenant's (default: every tenant's). "
        "Another key may name its own tenant only.",
    ),
) -> uuid.UUID | None:
    """The tenant whose resources to read, for reads that may span tenants (alerts,
    workers); None: every tenant's, for the admin key naming none. Otherwise as
    :func:`tenant_reader`: an operator or viewer key reads its own tenant's."""
    if principal.is_admin and not cronwheel_tenant:
        return None
    scope = await _scope(request, principal, cronwheel_tenant)
    return scope.tenant_id
