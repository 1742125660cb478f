"""What a webhook request carries: its signature and headers; and what a webhook job
is made of (its implicit requirement, its validated headers)."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from cronwheel.domain.spec import WEBHOOK_CAPABILITY, JobSpec
from cronwheel.worker.protocol import Lease
from cronwheel.worker.webhook import WebhookCaller, WebhookFailure, sign


def _lease(headers: dict[str, str] | None = None, secret: str | None = "s3cret") -> Lease:
    now = datetime.now(UTC)
    return Lease(
        attempt_id="att-1",
        run_id="run-1",
        job_id="job-1",
        attempt=3,
        task=None,
        webhook={"url": "https://example.com/hook", "headers": headers or {}},
        payload={"a": 1},
        fencing_token=42,
        lease_expires_at=now + timedelta(seconds=30),
        deadline=now + timedelta(seconds=60),
        due_at=now,
        heartbeat_timeout=30.0,
        signing_secret=secret,
    )


def test_the_signature_is_the_documented_hmac() -> None:
    body = b'{"amount":3,"note":"\xc3\xa9"}'
    expected = hmac.new(b"s3cret", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign("s3cret", 1700000000, body) == expected
    assert sign("s3cret", "1700000000", body) == expected
    assert sign("other", 1700000000, body) != expected
    assert sign("s3cret", 1700000001, body) != expected


def test_the_headers_of_a_request() -> None:
    caller = WebhookCaller()
    body = b'{"a":1}'
    headers = caller.headers(
        _lease({"X-Team": "billing", "Authorization": "Bearer t"}), body, timestamp=1700000000
    )
    assert headers["X-Team"] == "billing" and headers["Authorization"] == "Bearer t"
    assert headers["Content-Type"] == "application/json"
    assert headers["Cronwheel-Run-Id"] == "run-1"
    assert headers["Cronwheel-Job-Id"] == "job-1"
    assert headers["Cronwheel-Attempt"] == "3"
    assert headers["Cronwheel-Fencing-Token"] == "42"
    assert headers["Idempotency-Key"] == "run-1:3"
    assert headers["Cronwheel-Timestamp"] == "1700000000"
    assert headers["Cronwheel-Signature"] == "v1=" + sign("s3cret", 1700000000, body)
    # A job may choose its own JSON media type; cronwheel's own headers always win.
    own = caller.headers(_lease({"content-type": "application/vnd.x+json"}), body)
    assert own.get_list("Content-Type") == ["application/vnd.x+json"]
    forged = _lease({"Cronwheel-Attempt": "99"})  # a job stored before validation refused it
    assert caller.headers(forged, body).get_list("Cronwheel-Attempt") == ["3"]


def test_a_lease_without_a_secret_cannot_be_signed() -> None:
    with pytest.raises(WebhookFailure, match="no signing secret") as failed:
        WebhookCaller().headers(_lease(secret=None), b"{}")
    assert failed.value.retryable is False


def _job(**fields: Any) -> JobSpec:
    body: dict[str, Any] = {"name": "j", "schedule": {"asap": True}}
    body.update(fields)
    return JobSpec.model_validate(body)


def test_a_webhook_job_requires_the_webhook_capability() -> None:
    hook = {"url": "https://example.com/h"}
    assert _job(webhook=hook).requires == [WEBHOOK_CAPABILITY]
    assert _job(webhook=hook, requires=["eu"]).requires == ["eu", WEBHOOK_CAPABILITY]
    assert _job(webhook=hook, requires=["webhook", "eu"]).requires == ["webhook", "eu"]
    assert _job(task="t", requires=["eu"]).requires == ["eu"]
    assert _job(task="t").requires == []
    # built from Python objects too
    spec = JobSpec(name="j", schedule={"asap": True}, webhook={"url": "https://e.com"})
    assert spec.requires == [WEBHOOK_CAPABILITY]


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"Host": "evil"}, "set by the webhook worker"),
        ({"content-length": "5"}, "set by the webhook worker"),
        ({"Idempotency-Key": "x"}, "set by the webhook worker"),
        ({"Cronwheel-Signature": "v1=00"}, "set by the webhook worker"),
        ({"Bad Name": "x"}, "not a valid header name"),
        ({"X-A": "one\r\nX-B: two"}, "control character"),
        ({"X-A": "x" * 9000}, "longer than 8192"),
        ({"X-A": "café"}, "not ASCII text"),
    ],
)
def test_webhook_headers_are_checked(headers: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _job(webhook={"url": "https://example.com/h", "headers": headers})
