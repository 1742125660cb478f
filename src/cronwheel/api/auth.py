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

Key look-ups are cached for a few seconds: a worker heartbeating every few seconds
must not cost a database round trip per request. A revoked key therefore keeps working
for at most :data:`KEY_CACHE_TTL` seconds on each API node.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from cronwheel.api.errors import TenantRequiredError
from cronwheel.domain.errors import AuthError, NotFoundError, PermissionDeniedError
from cronwheel.domain.model import ApiKey
from cronwheel.settings import Settings
from cronwheel.store.base import Store

__all__ = [
    "KEY_CACHE_TTL",
    "KEY_PREFIX",
    "MAX_KEY_LENGTH",
    "TENANT_HEADER",
    "KeyCache",
    "Principal",
    "TenantScope",
    "authenticate",
    "bearer_token",
    "generate_key",
    "hash_key",
    "may_read_metrics",
    "require_admin",
    "require_metrics_reader",
    "require_worker",
    "tenant_or_every_reader",
    "tenant_reader",
    "tenant_writer",
]

KEY_PREFIX = "cw_"
KEY_CACHE_TTL = 5.0
TENANT_HEADER = "Cronwheel-Tenant"
_NEGATIVE_TTL = 1.0
MAX_KEY_LENGTH = 256


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
        """What the audit trail records as having done something."""
        return "admin" if self.key_id is None else str(self.key_id)


@dataclass(frozen=True, slots=True)
class TenantScope:
    """A principal acting on one tenant's resources."""

    principal: Principal
    tenant_id: uuid.UUID


class KeyCache:
    """Key records by hash, each kept for ``ttl`` seconds (unknown hashes for less, so a
    freshly created key works at once while a flood of wrong keys stays cheap)."""

    def __init__(self, store: Store, *, ttl: float = KEY_CACHE_TTL, max_entries: int = 10_000):
        self._store = store
        self._ttl = ttl
        self._max_entries = max_entries
        self._entries: dict[str, tuple[float, ApiKey | None]] = {}

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
        key = await self._store.api_keys_get_by_hash(key_hash=key_hash)
        if len(self._entries) >= self._max_entries:
            self._evict(now)
        self._entries[key_hash] = (now + (self._ttl if key else _NEGATIVE_TTL), key)
        return key

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
    await authenticate(request, credentials)  # 401 unless it is some tenant's key
    raise PermissionDeniedError("metrics need the metrics token or the admin key")


async def require_admin(principal: Principal = Depends(authenticate)) -> Principal:
    if not principal.is_admin:
        raise PermissionDeniedError("this operation needs the admin key")
    return principal


async def require_worker(principal: Principal = Depends(authenticate)) -> Principal:
    if principal.role not in ("worker", "admin"):
        raise PermissionDeniedError("the worker protocol needs a worker key")
    return principal


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
    return TenantScope(principal=principal, tenant_id=principal.tenant_id)


async def tenant_reader(
    request: Request,
    principal: Principal = Depends(authenticate),
    cronwheel_tenant: str | None = Header(
        default=None,
        alias=TENANT_HEADER,
        description="The tenant id; required with the admin key, ignored otherwise.",
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
        description="The tenant id; required with the admin key, ignored otherwise.",
    ),
) -> TenantScope:
    """Admin (naming a tenant) or operator."""
    scope = await _scope(request, principal, cronwheel_tenant)
    if principal.role not in ("admin", "operator"):
        raise PermissionDeniedError(f"a {principal.role} key may only read")
    return scope


async def tenant_or_every_reader(
    request: Request,
    principal: Principal = Depends(authenticate),
    cronwheel_tenant: str | None = Header(
        default=None,
        alias=TENANT_HEADER,
        description="With the admin key: only this tenant's (default: every tenant's). "
        "Ignored for tenant keys.",
    ),
) -> uuid.UUID | None:
    """The tenant whose resources to read, for reads that may span tenants (alerts,
    workers); None: every tenant's, for the admin key naming none. Otherwise as
    :func:`tenant_reader`: an operator or viewer key reads its own tenant's."""
    if principal.is_admin and not cronwheel_tenant:
        return None
    scope = await _scope(request, principal, cronwheel_tenant)
    return scope.tenant_id
