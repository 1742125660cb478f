"""Reading the API's answers in tests: the error envelope, and instants as it writes
them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = ["error_of", "parse"]


def error_of(r: Any) -> dict[str, Any]:
    """The error of a refused request: the body is ``{"error": {...}}`` and nothing
    else, and its message says something."""
    body = r.json()
    assert set(body) == {"error"}, body
    err: dict[str, Any] = body["error"]
    assert isinstance(err["message"], str) and err["message"], err
    return err


def parse(value: str) -> datetime:
    """An instant the API wrote: always UTC, always with ``Z``."""
    assert value.endswith("Z"), value
    return datetime.fromisoformat(value)
