"""The built-in webhook worker: for each webhook run it leases, it calls the job's URL.

::

    lease: a webhook run and its tenant's signing secret
      │
      ▼  resolve the URL's host
    every address public, or admitted by webhook_allow? ──no──▶ FAILED, no retry (refused)
      │ yes
      ▼  connect to exactly the addresses checked: no second look-up that a DNS answer
      │  could change in between; TLS still verifies (and SNI names) the URL's host
    METHOD url, the payload as JSON, signed headers; a timeout within the deadline
      │
      ├─ 2xx ────────────────────────────────────▶ SUCCESS: {status, body (truncated)}
      ├─ 408, 429, 5xx, network error, timeout ──▶ retried, never before Retry-After
      └─ any other status ───────────────────────▶ FAILED, no retry

Each request carries ``Cronwheel-Timestamp`` and
``Cronwheel-Signature: v1=<hex HMAC-SHA256(secret, timestamp + "." + body)>`` (the
tenant's webhook secret, the raw body bytes), besides the run id, attempt, fencing
token and ``Idempotency-Key: run_id:attempt``. docs/webhooks.md is the receiver's side.

:func:`~cronwheel.worker.webhook_worker` builds a :class:`~cronwheel.worker.Worker` that
does nothing else; ``Worker(…, webhook=WebhookCaller(…))`` adds webhook runs to a worker
that also has task handlers.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import re
import socket
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpcore
import httpx

from cronwheel.domain.spec import MAX_RETRY_AFTER
from cronwheel.worker.protocol import Lease
from cronwheel.worker.tasks import Handler, TaskContext

__all__ = [
    "DEFAULT_BODY_LIMIT",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "AllowList",
    "WebhookCaller",
    "WebhookFailure",
    "WebhookRefused",
    "address_problem",
    "parse_retry_after",
    "sign",
]

SIGNATURE_HEADER = "Cronwheel-Signature"
TIMESTAMP_HEADER = "Cronwheel-Timestamp"
DEFAULT_BODY_LIMIT = 1024  # bytes of the receiver's answer kept in the run's result
_ERROR_BODY = 300  # characters of an error answer quoted in the run's error
_USER_AGENT = "cronwheel-webhook/1"

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # the IPv4 address is the low 32 bits
_HOST_NAME = re.compile(
    r"^(\*\.)?([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9])?\.)*[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9])?$"
)


# -- outcomes -------------------------------------------------------------------------


class WebhookFailure(Exception):
    """A webhook call that did not succeed. ``retryable`` says whether the run is tried
    again; ``retry_after`` (seconds), when set, that the next try waits at least that
    long."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


class WebhookRefused(WebhookFailure):
    """The URL leads to an address webhooks may not call (SSRF protection): never
    retried, as another try would be refused alike."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


def sign(secret: str, timestamp: str | int, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``f"{timestamp}.".encode() + body`` under ``secret``: the
    value after ``v1=`` in ``Cronwheel-Signature``."""
    message = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def parse_retry_after(
    value: str | None, *, date: str | None = None, now: datetime | None = None
) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delay-seconds, or an HTTP date
    measured from the answer's own ``Date`` header when it has one (both are the
    receiver's clock), else from ``now`` (default: this machine's clock). None when
    absent or malformed; a date in the past is 0; at most :data:`MAX_RETRY_AFTER`."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        # More digits than any sane delay (and than int() accepts past 4,300): the cap.
        return MAX_RETRY_AFTER if len(text) > 9 else min(float(int(text)), MAX_RETRY_AFTER)
    when = _http_date(text)
    if when is None:
        return None
    reference = (_http_date(date) if date else None) or now or datetime.now(UTC)
    return min(max(0.0, (when - reference).total_seconds()), MAX_RETRY_AFTER)


def _http_date(text: str) -> datetime | None:
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


# -- which addresses may be called -----------------------------------------------------


def address_problem(address: _Address) -> str | None:
    """What makes ``address`` off-limits to webhooks — ``"loopback"``, ``"private"``,
    ``"link-local"``, ``"multicast"``, ``"reserved"``, ``"unspecified"``, … — or None
    for a public address. An IPv6 address carrying an IPv4 one (IPv4-mapped, NAT64,
    6to4) is judged by the IPv4 address as well."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address_problem(address.ipv4_mapped)
        inner = address.sixtofour
        if inner is None and address in _NAT64:
            inner = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if inner is not None and (problem := address_problem(inner)) is not None:
            return problem
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_reserved:
        return "reserved"
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return "shared (carrier-grade NAT)"
    if address.is_private:
        return "private"
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return "site-local"
    if not address.is_global:
        return "non-public"
    return None


@dataclass(frozen=True, slots=True)
class AllowList:
    """The exceptions to the refusal of non-public addresses (the setting
    ``webhook_allow``). A network (``10.0.0.0/8``, ``127.0.0.1``, ``fd00::/8``) admits
    the addresses in it; a host name (``hooks.internal``) admits whatever it resolves
    to, and ``*.example.internal`` every name under ``example.internal``."""

    networks: tuple[_Network, ...] = ()
    hosts: frozenset[str] = frozenset()
    domains: tuple[str, ...] = ()  # ".example.internal" for "*.example.internal"

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        """Raises ValueError naming the first entry that is neither a network nor a
        host name."""
        networks: list[_Network] = []
        hosts: set[str] = set()
        domains: list[str] = []
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            name = entry.lower().rstrip(".")
            if not _HOST_NAME.match(name) or name.rsplit(".", 1)[-1].isdigit():
                raise ValueError(
                    f"webhook_allow: {entry!r} is neither a network (an address or a CIDR "
                    "such as 10.0.0.0/8) nor a host name"
                )
            if name.startswith("*."):
                domains.append(name[1:])
            else:
                hosts.add(name)
        return cls(tuple(networks), frozenset(hosts), tuple(domains))

    def admits_host(self, host: str) -> bool:
        name = host.lower().rstrip(".")
        return name in self.hosts or any(name.endswith(d) for d in self.domains)

    def admits_address(self, address: _Address) -> bool:
        candidates: list[_Address] = [address]
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            candidates.append(address.ipv4_mapped)
        return any(a in n for a in candidates for n in self.networks)


class _Guard:
    """Resolves a host and lets through only addresses webhooks may call."""

    def __init__(self, allow: AllowList) -> None:
        self.allow = allow

    async def resolve(self, host: str, port: int) -> list[_Address]:
        try:
            addresses: list[_Address] = [ipaddress.ip_address(host)]
        except ValueError:
            addresses = await self._look_up(host, port)
        if self.allow.admits_host(host):
            return addresses
        for address in addresses:
            problem = address_problem(address)
            if problem is not None and not self.allow.admits_address(address):
                article = "an" if problem[0] in "aeiou" else "a"
                where = str(address) if str(address) == host else f"{host} ({address})"
                raise WebhookRefused(
                    f"refused to call {where}: {article} {problem} address; webhooks reach "
                    "such addresses only when the setting webhook_allow admits them"
                )
        return addresses

    @staticmethod
    async def _look_up(host: str, port: int) -> list[_Address]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from exc
        addresses: list[_Address] = []
        for info in infos:
            try:
                address = ipaddress.ip_address(str(info[4][0]))
            except ValueError:
                raise WebhookRefused(
                    f"refused to call {host}: it resolves to {info[4][0]!r}, not an address"
                ) from None
            if address not in addresses:
                addresses.append(address)
        if not addresses:
            raise httpcore.ConnectError(f"cannot resolve {host!r}: no address")
        return addresses


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network layer, connecting only to addresses the guard let through —
    the very ones it checked. The URL keeps its host name, so the Host header, SNI and
    certificate check are the host's, and pooled connections are kept per host."""

    def __init__(self, guard: _Guard) -> None:
        self._guard = guard
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        failure: Exception | None = None
        for address in await self._guard.resolve(host, port):
            try:
                return await self._inner.connect_tcp(
                    str(address),
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc  # the next address may answer
        assert failure is not None  # resolve() returns at least one address
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise WebhookRefused("refused: webhooks do not call Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a connection pool with the guarded network backend. httpx
    offers no parameter for the backend, so the pool it built (still unused) is replaced
    by one configured alike."""

    def __init__(self, guard: _Guard, *, verify: ssl.SSLContext | bool, limits: httpx.Limits):
        context = (
            verify
            if isinstance(verify, ssl.SSLContext)
            else httpx.create_ssl_context(verify=verify, trust_env=False)
        )
        super().__init__(verify=context, trust_env=False, limits=limits)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_GuardedBackend(guard),
        )


# -- the caller -----------------------------------------------------------------------


class WebhookCaller:
    """Makes the request of each webhook run (see the module's docstring).

    ``allow``: the allow-list (an :class:`AllowList` or its entries). ``timeout``: the
    longest a request may take, connection included; it is also kept within the
    attempt's deadline. ``body_limit``: bytes of a successful answer kept in the run's
    result. ``verify``: TLS verification (an ``ssl.SSLContext`` to trust other CAs).
    One HTTP connection pool serves every call until :meth:`aclose`.
    """

    def __init__(
        self,
        *,
        allow: AllowList | Iterable[str] = (),
        timeout: float = 30.0,
        body_limit: int = DEFAULT_BODY_LIMIT,
        verify: ssl.SSLContext | bool = True,
        max_connections: int = 100,
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        if body_limit < 0:
            raise ValueError("body_limit cannot be negative")
        self.allow = allow if isinstance(allow, AllowList) else AllowList.parse(allow)
        self.timeout = timeout
        self.body_limit = body_limit
        self._verify = verify
        self._max_connections = max_connections
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(
                max_connections=self._max_connections,
                max_keepalive_connections=self._max_connections,
                keepalive_expiry=30.0,
            )
            transport = _GuardedTransport(_Guard(self.allow), verify=self._verify, limits=limits)
            # No proxy from the environment: it would connect where the guard never looked.
            self._client = httpx.AsyncClient(
                transport=transport,
                trust_env=False,
                follow_redirects=False,
                headers={"User-Agent": _USER_AGENT},
            )
        return self._client

    async def aclose(self) -> None:
        """Close the connection pool (a later call opens a new one)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def bind(self, lease: Lease) -> Handler:
        """The handler of one webhook lease, for the worker's session."""

        async def handler(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
            return await self.call(lease, payload)

        return handler

    def headers(self, lease: Lease, body: bytes, *, timestamp: int | None = None) -> httpx.Headers:
        """The request's headers: the job's, then cronwheel's (which win)."""
        if not lease.signing_secret:
            raise WebhookFailure(
                "the lease carries no signing secret: the server does not sign webhooks",
                retryable=False,
            )
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        headers = httpx.Headers({"Content-Type": "application/json"})
        headers.update((lease.webhook or {}).get("headers") or {})
        headers.update(
            {
                "Cronwheel-Run-Id": lease.run_id,
                "Cronwheel-Job-Id": lease.job_id,
                "Cronwheel-Attempt": str(lease.attempt),
                "Cronwheel-Fencing-Token": str(lease.fencing_token),
                "Idempotency-Key": f"{lease.run_id}:{lease.attempt}",
                TIMESTAMP_HEADER: stamp,
                SIGNATURE_HEADER: f"v1={sign(lease.signing_secret, stamp, body)}",
                # Only a few bytes of the answer are kept: never inflate a compressed
                # one (a small gzip body can expand to gigabytes).
                "Accept-Encoding": "identity",
            }
        )
        return headers

    async def call(self, lease: Lease, payload: dict[str, Any]) -> dict[str, Any]:
        """Make the run's request. Returns the result of a 2xx answer; raises
        :class:`WebhookFailure` otherwise."""
        spec = lease.webhook or {}
        if not spec.get("url"):
            raise WebhookFailure("the run has no webhook URL to call", retryable=False)
        url, method = str(spec["url"]), str(spec.get("method") or "POST")
        what = f"{method} {url}"
        budget = min(self.timeout, lease.run_seconds_left)
        if budget <= 0:
            raise WebhookFailure(
                f"{what}: no time left before the attempt's deadline", retryable=True
            )
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        try:
            headers = self.headers(lease, body)
        except UnicodeError as exc:  # a job stored before header values were checked
            raise WebhookFailure(
                f"{what}: a header is not ASCII text: {exc}", retryable=False
            ) from None
        try:
            async with (
                asyncio.timeout(budget),
                self._http().stream(
                    method, url, content=body, headers=headers, timeout=budget
                ) as response,
            ):
                text, truncated = await _read_some(response, self.body_limit)
        except WebhookFailure:
            raise
        except (TimeoutError, httpx.TimeoutException):
            raise WebhookFailure(f"{what}: no answer within {budget:g} s", retryable=True) from None
        except (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.InvalidURL) as exc:
            raise WebhookFailure(f"{what}: {exc}", retryable=False) from None
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise WebhookFailure(f"{what}: network error: {reason}", retryable=True) from None
        return _outcome(what, response, text, truncated)


async def _read_some(response: httpx.Response, limit: int) -> tuple[str, bool]:
    """At most ``limit`` bytes of the answer's body, as text, and whether there was more."""
    if response.headers.get("Content-Encoding", "identity").lower() not in ("", "identity"):
        # Asked for identity and got something else anyway: not inflated, not kept.
        return f"(a {response.headers['Content-Encoding']}-encoded body, not read)", False
    data = bytearray()
    async for chunk in response.aiter_raw():
        data += chunk
        if len(data) > limit:
            break
    truncated = len(data) > limit
    return bytes(data[:limit]).decode(response.encoding or "utf-8", "replace"), truncated


def _outcome(what: str, response: httpx.Response, text: str, truncated: bool) -> dict[str, Any]:
    status = response.status_code
    if 200 <= status < 300:
        return {"status": status, "body": text, "truncated": truncated}
    detail = f"{what} answered HTTP {status} {response.reason_phrase}".rstrip()
    if 300 <= status < 400:
        location = response.headers.get("location")
        detail += " (redirects are not followed" + (f"; Location: {location})" if location else ")")
    elif text.strip():
        detail += f": {text[:_ERROR_BODY].strip()}"
    if status in (408, 429) or status >= 500:
        retry_after = parse_retry_after(
            response.headers.get("retry-after"), date=response.headers.get("date")
        )
        if retry_after is not None:
            detail += f" (Retry-After: {retry_after:g} s)"
        raise WebhookFailure(detail, retryable=True, retry_after=retry_after)
    raise WebhookFailure(detail, retryable=False)
