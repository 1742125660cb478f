"""What routes check of their inputs beyond the request models: a path id, and the size
of a JSON value against its limit."""

from __future__ import annotations

import json
import uuid
from typing import Any

from cronwheel.domain.errors import NotFoundError, PayloadTooLargeError

__all__ = ["check_json_size", "parse_id"]


def parse_id(value: str, what: str) -> uuid.UUID:
    """A path id; anything that is not a UUID is simply not found (never a 500)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFoundError(f"no {what} {value!r}") from None


def check_json_size(value: Any, *, limit: int, field: str) -> None:
    """Reject ``value`` when its compact JSON form exceeds ``limit`` bytes."""
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    if size > limit:
        raise PayloadTooLargeError(
            f"{field} is {size} bytes of JSON; the limit is {limit}", field=field
        )
