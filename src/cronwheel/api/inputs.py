"""What routes check of their inputs beyond the request models: a path id (the size of a
JSON value against its limit is ``domain.new_job.check_json_size``); and the query
parameters several routes share."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import Header, Query

from cronwheel.domain.errors import NotFoundError

__all__ = [
    "FORCE_QUERY",
    "IDEMPOTENCY_KEY_HEADER",
    "IDEMPOTENCY_KEY_MAX",
    "REASON_QUERY",
    "parse_id",
]

# Of a deletion (``DELETE /v1/jobs/{id}``, ``DELETE /v1/tenants/{id}``).
FORCE_QUERY: Any = Query(
    default=False,
    description="also end what is still in progress (otherwise the deletion is refused "
    "with 409 `in_use`, naming it)",
)
REASON_QUERY: Any = Query(
    default=None, max_length=1000, description="recorded in the audit trail with the deletion"
)
# Of a creation (``POST /v1/jobs``, ``POST /v1/workflows``).
IDEMPOTENCY_KEY_MAX = 200
IDEMPOTENCY_KEY_HEADER: Any = Header(
    default=None,
    alias="Idempotency-Key",
    min_length=1,
    max_length=IDEMPOTENCY_KEY_MAX,
    description="Makes a retried request return what the first one created.",
)


def parse_id(value: str, what: str) -> uuid.UUID:
    """A path id; anything that is not a UUID is simply not found (never a 500)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFoundError(f"no {what} {value!r}") from None
