"""The signature check a webhook receiver makes, as the webhook tests make it."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

__all__ = ["verify"]


def verify(secret: str, headers: Mapping[str, str], body: bytes, tolerance: float = 300) -> bool:
    """What a receiver does, exactly as docs/webhooks.md shows it."""
    timestamp = headers["cronwheel-timestamp"]
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    signature = headers["cronwheel-signature"].removeprefix("v1=")
    fresh = abs(time.time() - int(timestamp)) <= tolerance
    return fresh and hmac.compare_digest(expected.hexdigest(), signature)
