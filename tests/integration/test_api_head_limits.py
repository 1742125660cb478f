"""Limits on a request's head: too many headers, or too many bytes of them, answer 431
with the JSON error body — from the real server (uvicorn), which cuts an oversized head
off as it arrives, and from the app itself under any server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cronwheel.api import create_app
from cronwheel.runtime import serving
from cronwheel.settings import Settings
from cronwheel.store import Store, create_store

CODE = "request_headers_too_large"


@contextlib.asynccontextmanager
async def running(settings: Settings, sqlite_url: str) -> AsyncIterator[tuple[str, int]]:
    store = create_store(sqlite_url)
    await store.open()
    try:
        async with serving(create_app(settings, store), settings=settings) as url:
            yield "127.0.0.1", int(url.rsplit(":", 1)[1])
    finally:
        await store.close()


@pytest.fixture
async def server(settings: Settings, sqlite_url: str) -> AsyncIterator[tuple[str, int]]:
    async with running(settings, sqlite_url) as address:
        yield address


def exchange(address: tuple[str, int], data: bytes) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it (or 3 s)."""
    with socket.create_connection(address, timeout=3) as sock:
        sock.sendall(data)
        return read_all(sock)


def exchange_one(address: tuple[str, int], data: bytes) -> bytes:
    """Send ``data`` on a new connection and read one whole answer (head and the body its
    Content-Length gives): a served request's connection stays open."""
    with socket.create_connection(address, timeout=3) as sock:
        sock.sendall(data)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536) or b"\r\n\r\n"  # closed: the head is all there is
        head, _, body = answer.partition(b"\r\n\r\n")
        fields = [line.partition(b":") for line in head.split(b"\r\n")[1:]]
        lengths = [v for k, _, v in fields if k.strip().lower() == b"content-length"]
        length = int(lengths[0]) if lengths else 0
        while len(body) < length and (chunk := sock.recv(65536)):
            body += chunk
        return head + b"\r\n\r\n" + body


def read_all(sock: socket.socket) -> bytes:
    answer = b""
    with contextlib.suppress(TimeoutError, ConnectionResetError):
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def refused(answer: bytes) -> dict[str, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"content-type: application/json" in head.lower()
    error: dict[str, Any] = json.loads(body)["error"]
    assert error["code"] == CODE
    return error


def get(path: str, *headers: bytes) -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: t\r\n" + b"".join(headers) + b"\r\n"


async def test_a_20_mb_header_is_cut_off_as_it_arrives(server: tuple[str, int]) -> None:
    """The server answers 431 and closes long before the client could send it all."""

    def send_big() -> tuple[int, bytes]:
        with socket.create_connection(server, timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: ")
            sock.setblocking(False)
            chunk, sent, answer = b"a" * 65536, 0, b""
            deadline = time.monotonic() + 10
            # Until the answer is in: how much got out before the server answered.
            while sent < 20_000_000 and b"}}" not in answer and time.monotonic() < deadline:
                with contextlib.suppress(BlockingIOError):
                    sent += sock.send(chunk)
                with contextlib.suppress(BlockingIOError):
                    answer += sock.recv(65536)
            sock.setblocking(True)
            sock.settimeout(3)
            return sent, answer + read_all(sock)

    sent, answer = await asyncio.to_thread(send_big)
    error = refused(answer)
    assert "32768 bytes" in error["message"]
    # Refused while the client was still sending: what it got out by then was mostly
    # in the sockets' buffers, never parsed by the server.
    assert sent < 8 * 1024 * 1024


async def test_too_many_headers(server: tuple[str, int]) -> None:
    many = [b"X-%d: 1\r\n" % i for i in range(100_000)]
    answer = await asyncio.to_thread(exchange, server, get("/healthz", *many))
    refused(answer)
    # 101 small headers: under the byte limit, over the count.
    answer = await asyncio.to_thread(exchange, server, get("/healthz", *many[:100]))
    assert "more than 100 request headers" in refused(answer)["message"]
    # 99 of them and Host: fine.
    answer = await asyncio.to_thread(exchange_one, server, get("/healthz", *many[:99]))
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


async def test_a_head_just_over_the_limit_in_small_pieces(server: tuple[str, int]) -> None:
    def trickle() -> bytes:
        with socket.create_connection(server, timeout=3) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
            for i in range(40):
                sock.sendall(b"X-Pad-%02d: %s\r\n" % (i, b"p" * 1000))
            sock.sendall(b"\r\n")
            return read_all(sock)

    refused(await asyncio.to_thread(trickle))


async def test_ordinary_requests_are_untouched(server: tuple[str, int], settings: Settings) -> None:
    """A head and a large body in one write, requests pipelined in one write, and a
    connection kept alive across requests: all served; only the oversized head of a
    later request on the same connection is refused."""
    assert settings.admin_key is not None
    body = json.dumps({"name": "x" * 150, "limits": {}, "pad": "p" * 200_000}).encode()
    post = (
        b"POST /v1/tenants HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + settings.admin_key.encode() + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
    )
    answer = await asyncio.to_thread(exchange, server, post)
    # Read in full and judged by the app (an unknown field), not refused as a head.
    assert answer.startswith(b"HTTP/1.1 422 "), answer[:300]

    padded = get("/healthz", b"X-Pad: " + b"p" * 300 + b"\r\n")
    answer = await asyncio.to_thread(
        exchange, server, padded * 150 + get("/nope", b"Connection: close\r\n")
    )
    assert answer.count(b"HTTP/1.1 200 ") == 150 and b"HTTP/1.1 404 " in answer
    assert b" 431 " not in answer

    def keep_alive() -> tuple[bytes, bytes]:
        with socket.create_connection(server, timeout=3) as sock:
            sock.sendall(get("/healthz"))
            first = b""
            while not first.endswith(b'{"status":"ok"}'):
                first += sock.recv(65536)
            sock.sendall(get("/healthz", b"X-Big: " + b"b" * 40_000 + b"\r\n"))
            return first, read_all(sock)

    first, second = await asyncio.to_thread(keep_alive)
    assert first.startswith(b"HTTP/1.1 200 ")
    refused(second)


async def test_the_limits_are_settings(tmp_path: Path, sqlite_url: str) -> None:
    settings = Settings(data_dir=tmp_path, max_header_count=20, max_header_bytes=8192)
    async with running(settings, sqlite_url) as address:
        answer = await asyncio.to_thread(
            exchange, address, get("/healthz", *(b"X-%d: 1\r\n" % i for i in range(20)))
        )
        assert "more than 20 request headers" in refused(answer)["message"]
        answer = await asyncio.to_thread(
            exchange, address, get("/healthz", b"X-Big: " + b"b" * 9000 + b"\r\n")
        )
        assert "8192 bytes" in refused(answer)["message"]
    with pytest.raises(ValueError, match="max_header_bytes"):
        Settings(max_header_bytes=100)


async def test_the_app_refuses_them_under_any_server(api, store: Store) -> None:
    """In process (no uvicorn): the app's own check answers the same 431."""
    r = await api.client.get("/healthz", headers={f"X-{i}": "1" for i in range(101)})
    assert r.status_code == 431, r.text
    assert r.json() == {"error": {"code": CODE, "message": "more than 100 request headers"}}
    r = await api.client.get("/healthz", headers={"X-Big": "b" * 40_000})
    assert r.status_code == 431 and r.json()["error"]["code"] == CODE
    r = await api.client.get("/healthz", headers={f"X-{i}": "1" for i in range(90)})
    assert r.status_code == 200
    t = await api.tenant()
    r = await api.client.get("/v1/jobs", headers={**t.headers, "X-Pad": "p" * 20_000})
    assert r.status_code == 200, r.text
