"""The errors of the client: an error answer of the API, or no answer at all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from cronwheel.domain.errors import CronwheelError

__all__ = ["ApiConnectionError", "ApiError", "PreconditionFailedError", "error_from_response"]

_ERROR_TEXT_LIMIT = 300


class ApiError(CronwheelError):
    """An error answer of the API: its HTTP ``status`` and its stable ``code``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, field=field, **dict(details or {}))
        self.status = status
        self.code = code

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        return f"{self.message}{where} [{self.status} {self.code}]"

    def __repr__(self) -> str:
        return (
            f"ApiError(status={self.status}, code={self.code!r}, "
            f"message={self.message!r}, field={self.field!r})"
        )


class ApiConnectionError(ApiError, ConnectionError):
    """The server could not be reached or did not answer in time (``status`` 0)."""

    def __init__(self, message: str, *, code: str = "connection_error") -> None:
        super().__init__(0, code, message)


class PreconditionFailedError(ApiError):
    """412 ``precondition_failed``: the version named (``if_version``) is no longer the
    resource's; nothing changed. ``current_version`` is the one it is at now."""

    @property
    def current_version(self) -> int | None:
        value = self.details.get("current_version")
        return value if isinstance(value, int) else None


def error_from_response(response: httpx.Response) -> ApiError:
    """The :class:`ApiError` an error response stands for, whatever produced it: the
    API's JSON error, a framework's validation answer, or a proxy's HTML page."""
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            details = error.get("details")
            kind = PreconditionFailedError if status == 412 else ApiError
            return kind(
                status,
                str(error.get("code") or f"http_{status}"),
                str(error["message"]),
                None if error.get("field") is None else str(error["field"]),
                details if isinstance(details, dict) else None,
            )
        detail = body.get("detail")
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            first = detail[0]
            loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
            return ApiError(
                status,
                "invalid_request",
                str(first.get("msg", "invalid request")),
                ".".join(loc) or None,
            )
        if isinstance(detail, str):
            return ApiError(status, f"http_{status}", detail)
    text = " ".join(response.text.split())[:_ERROR_TEXT_LIMIT]
    reason = response.reason_phrase or "error"
    return ApiError(status, f"http_{status}", f"{reason}: {text}" if text else reason)
