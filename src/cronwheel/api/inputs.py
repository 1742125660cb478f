"""What routes check of their inputs beyond the request models: a path id (the size of a
JSON value against its limit is ``domain.new_job.check_json_size``)."""

from __future__ import annotations

import uuid

from cronwheel.domain.errors import NotFoundError

__all__ = ["parse_id"]


def parse_id(value: str, what: str) -> uuid.UUID:
    """A path id; anything that is not a UUID is simply not found (never a 500)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFoundError(f"no {what} {value!r}") from None
