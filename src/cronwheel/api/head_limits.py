"""Limits on a request's head — the request line and the headers: how many headers, and
how many bytes in all. Over either, the answer is 431 with the JSON error body, code
``request_headers_too_large``, and the connection is closed.

Two places enforce them:

- :func:`uvicorn_options` gives uvicorn an HTTP protocol that counts while it parses
  (a subclass of uvicorn's httptools protocol). A head that grows past the byte limit
  is cut off as the bytes arrive, before the parser has buffered more than the limit:
  a client sending a 20 MB header costs the server 32 KiB, not 20 MB. The normal path
  pays an addition and a comparison per chunk received, and a counter per header.
- :class:`HeadLimitMiddleware` checks the head the ASGI server hands over, so the app
  keeps its limits under any server (and in-process tests).

The byte count of the exact checks is the target, query string, and each header's
name and value plus four bytes (``": "`` and the line end): what the request line and
header lines weigh as sent, give or take the method and version.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from starlette.types import ASGIApp, Receive, Scope, Send

from cronwheel.api.errors import error_response
from cronwheel.settings import Settings

__all__ = ["HEAD_TOO_LARGE", "HeadLimitMiddleware", "HeadLimits", "uvicorn_options"]

log = logging.getLogger("cronwheel.api")

HEAD_TOO_LARGE = "request_headers_too_large"
_HEADER_OVERHEAD = 4  # ": " and CRLF
_LINGER_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class HeadLimits:
    max_count: int
    max_bytes: int

    @classmethod
    def of(cls, settings: Settings) -> HeadLimits:
        return cls(max_count=settings.max_header_count, max_bytes=settings.max_header_bytes)

    def refusal(self, *, count: int, size: int) -> str | None:
        """Why a head of ``count`` headers and ``size`` bytes is refused (None: it is not)."""
        if count > self.max_count:
            return f"more than {self.max_count} request headers"
        if size > self.max_bytes:
            return f"the request line and headers exceed {self.max_bytes} bytes"
        return None


def _json_431(message: str) -> bytes:
    body = json.dumps({"error": {"code": HEAD_TOO_LARGE, "message": message}}).encode()
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n"
        b"connection: close\r\n\r\n" + body
    )


class HeadLimitMiddleware:
    """The limits on what the server handed over (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, limits: HeadLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
            size += sum(len(n) + len(v) + _HEADER_OVERHEAD for n, v in headers)
            reason = self.limits.refusal(count=len(headers), size=size)
            if reason is not None:
                log.warning(
                    "request head refused: %s",
                    reason,
                    extra={"event": "api.request_head_refused", "reason": reason},
                )
                response = error_response(
                    431, HEAD_TOO_LARGE, reason, headers={"Connection": "close"}
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop the parser; the reason is on the protocol."""


def _limited_protocol(limits: HeadLimits) -> type[Any]:
    """uvicorn's httptools protocol, counting the head while it is parsed. The per-header
    callbacks are on every request's path: plain comparisons against the limits bound
    here, and the base class's method called directly."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    max_count, max_bytes = limits.max_count, limits.max_bytes
    base = HttpToolsProtocol

    class HeadLimitedProtocol(HttpToolsProtocol):
        head_limits: ClassVar[HeadLimits] = limits

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_head = True  # between a message's start and its headers' end
            self._heads_done = 0  # heads parsed on this connection
            self._head_seen = 0  # raw bytes received of the current head
            self._head_count = 0
            self._head_size = 0  # the exact count (see the module docstring)
            self._refusal: str | None = None
            self._refusal_sent = False

        def data_received(self, data: bytes) -> None:
            if self._refusal_sent:
                return  # lingering after a refusal: read and dropped, never parsed
            if not self._in_head:
                base.data_received(self, data)
                return
            room = max_bytes - self._head_seen
            if len(data) <= room:
                self._head_seen += len(data)
                base.data_received(self, data)
                return
            # The head must end within ``room`` more bytes: feed those; what follows
            # is the body (or the next request) once it has, and refused if not.
            done = self._heads_done
            super().data_received(data[:room])
            if self._refusal_sent or self.transport.is_closing():
                return
            if self._heads_done == done:  # the head under way did not end in time
                self._refuse(f"the request line and headers exceed {max_bytes} bytes")
                return
            super().data_received(data[room:])

        def on_message_begin(self) -> None:
            base.on_message_begin(self)
            self._in_head = True
            self._head_count = self._head_size = 0

        def on_url(self, url: bytes) -> None:
            self._head_size += len(url)
            if self._head_size > max_bytes:
                self._stop()
            base.on_url(self, url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_count += 1
            self._head_size += len(name) + len(value) + _HEADER_OVERHEAD
            if self._head_count > max_count or self._head_size > max_bytes:
                self._stop()
            base.on_header(self, name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._heads_done += 1
            base.on_headers_complete(self)

        def on_message_complete(self) -> None:
            base.on_message_complete(self)
            # Bytes of the next head that came in the same chunk are not counted: at most
            # one chunk's worth, which the exact checks above still bound.
            self._in_head = True
            self._head_seen = 0

        def _stop(self) -> None:
            """Stop the parser: uvicorn then answers through send_400_response."""
            self._refusal = self.head_limits.refusal(count=self._head_count, size=self._head_size)
            raise _HeadTooLarge(self._refusal)

        def send_400_response(self, msg: str) -> None:
            if self._refusal is None:
                super().send_400_response(msg)
            else:
                self._refuse(self._refusal)

        def _refuse(self, reason: str) -> None:
            log.warning(
                "request head refused: %s",
                reason,
                extra={"event": "api.request_head_refused", "reason": reason},
            )
            self.transport.write(_json_431(reason))
            # Closing with the client's bytes still arriving would reset the connection,
            # and the client could lose the answer before reading it: stop sending, drop
            # what still comes (no parsing, no buffering) for a moment, then close.
            self._refusal_sent = True
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(_LINGER_SECONDS, self.transport.close)

    return HeadLimitedProtocol


def uvicorn_options(limits: HeadLimits) -> dict[str, Any]:
    """The ``uvicorn.Config`` options that enforce ``limits`` while parsing."""
    try:
        return {"http": _limited_protocol(limits)}
    except ImportError:  # no httptools: h11 bounds the head, answering a plain 400
        return {"http": "h11", "h11_max_incomplete_event_size": limits.max_bytes}
