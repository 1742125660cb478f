"""Which addresses webhooks may call: the classification, the allow-list, and the
refusal the caller makes before any connection."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpcore
import pytest
from pydantic import ValidationError

from cronwheel.settings import Settings
from cronwheel.worker.protocol import Lease
from cronwheel.worker.webhook import (
    AllowList,
    WebhookCaller,
    WebhookFailure,
    WebhookRefused,
    address_problem,
)

LOOPBACK = ("127.0.0.1", "::1")


@pytest.fixture(autouse=True)
def only_loopback_traffic(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A tripwire under the caller's guard: whatever these tests do, no connection
    leaves this machine. A broken guard fails the test instead of sending a packet."""
    attempted: list[str] = []
    real = httpcore.AnyIOBackend.connect_tcp

    async def connect_tcp(self: Any, host: str, port: int, **kwargs: Any) -> Any:
        attempted.append(host)
        if host not in LOOPBACK:
            raise AssertionError(f"tripwire: a connection to {host} was attempted")
        return await real(self, host, port, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", connect_tcp)
    yield attempted


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("127.0.0.1", "loopback"),
        ("127.10.0.5", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "shared (carrier-grade NAT)"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fd12:3456::1", "private"),
        ("ff02::1", "multicast"),
        ("fec0::1", "site-local"),
        # IPv6 addresses that carry an IPv4 one are judged by it
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:169.254.169.254", "link-local"),
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ],
)
def test_non_public_addresses_are_named(address: str, problem: str) -> None:
    assert address_problem(ipaddress.ip_address(address)) == problem


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8"]
)
def test_public_addresses_pass(address: str) -> None:
    assert address_problem(ipaddress.ip_address(address)) is None


def test_allow_list_admits_networks_and_host_names() -> None:
    allow = AllowList.parse(
        ["10.0.0.0/8", " 127.0.0.1 ", "fd00::/8", "Hooks.Internal.", "*.svc.local", ""]
    )
    admitted = ["10.9.8.7", "127.0.0.1", "::ffff:10.1.1.1", "fd00::5"]
    for address in admitted:
        assert allow.admits_address(ipaddress.ip_address(address)), address
    for address in ("127.0.0.2", "192.168.0.1", "fe80::1", "169.254.169.254"):
        assert not allow.admits_address(ipaddress.ip_address(address)), address
    assert allow.admits_host("hooks.internal") and allow.admits_host("HOOKS.internal.")
    assert allow.admits_host("billing.svc.local") and allow.admits_host("a.b.svc.local")
    assert not allow.admits_host("svc.local") and not allow.admits_host("evil-hooks.internal")
    assert not AllowList().admits_address(ipaddress.ip_address("127.0.0.1"))


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "10.0.0.256", "not a host", "http://x", "a..b"])
def test_allow_list_rejects_what_it_cannot_read(entry: str) -> None:
    with pytest.raises(ValueError, match="neither a network"):
        AllowList.parse(["127.0.0.1", entry])


def test_settings_read_the_allow_list_and_pools_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRONWHEEL_WEBHOOK_ALLOW", "127.0.0.1/32, hooks.internal")
    monkeypatch.setenv("CRONWHEEL_WEBHOOK_POOLS", "default,billing")
    settings = Settings()
    assert settings.webhook_allow == ["127.0.0.1/32", "hooks.internal"]
    assert settings.webhook_pools == ["default", "billing"]
    monkeypatch.setenv("CRONWHEEL_WEBHOOK_POOLS", "")
    assert Settings().webhook_pools == []
    monkeypatch.delenv("CRONWHEEL_WEBHOOK_POOLS")
    assert Settings().webhook_pools == ["default"]
    monkeypatch.setenv("CRONWHEEL_WEBHOOK_ALLOW", "10.0.0.0/8,nope nope")
    with pytest.raises(ValidationError, match="'nope nope' is neither a network"):
        Settings()


def _lease(url: str, *, seconds: float = 30.0) -> Lease:
    now = datetime.now(UTC)
    return Lease(
        attempt_id="a1",
        run_id="r1",
        job_id="j1",
        attempt=1,
        task=None,
        webhook={"url": url, "method": "POST", "headers": {}},
        payload={},
        fencing_token=7,
        lease_expires_at=now + timedelta(seconds=30),
        deadline=now + timedelta(seconds=seconds),
        due_at=now,
        heartbeat_timeout=30.0,
        signing_secret="s3cret",
    )


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254: a link-local address"),
        ("http://10.0.0.1:8080/hook", "10.0.0.1: a private address"),
        ("http://[::ffff:169.254.169.254]/", "a link-local address"),
        ("http://[fe80::1]/", "fe80::1: a link-local address"),
        ("http://0.0.0.0:9/", "an unspecified address"),
        ("http://127.0.0.1:9/", "127.0.0.1: a loopback address"),
        ("http://localhost:9/", "localhost ("),
    ],
)
async def test_the_caller_refuses_before_connecting(
    url: str, words: str, only_loopback_traffic: list[str]
) -> None:
    caller = WebhookCaller(allow=["192.168.0.0/16"])
    try:
        with pytest.raises(WebhookRefused) as refused:
            await caller.call(_lease(url), {})
    finally:
        await caller.aclose()
    assert words in str(refused.value) and "webhook_allow" in str(refused.value)
    assert refused.value.retryable is False
    assert only_loopback_traffic == []  # refused before any connection


async def test_an_admitted_loopback_address_is_connected_to(
    only_loopback_traffic: list[str],
) -> None:
    caller = WebhookCaller(allow=["127.0.0.0/8"], timeout=5)
    # A port bound but not listening refuses connections: the guard lets the connection
    # through, and it fails as a network error, to be retried.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        try:
            with pytest.raises(WebhookFailure) as failed:
                await caller.call(_lease(f"http://127.0.0.1:{port}/hook"), {})
        finally:
            await caller.aclose()
    assert not isinstance(failed.value, WebhookRefused)
    assert failed.value.retryable is True and "network error" in str(failed.value)
    assert only_loopback_traffic == ["127.0.0.1"]


async def test_no_time_left_before_the_deadline_is_a_retryable_failure() -> None:
    caller = WebhookCaller(allow=["127.0.0.0/8"])
    with pytest.raises(WebhookFailure, match="no time left") as failed:
        await caller.call(_lease("http://127.0.0.1:9/", seconds=-1), {})
    assert failed.value.retryable is True
