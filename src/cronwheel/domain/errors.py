"""The errors of cronwheel, each with one HTTP status and one stable ``code``.

::

    CronwheelError
     ├── ValidationError(ValueError)          422  invalid_*
     │    ├── InvalidScheduleError                 invalid_schedule
     │    └── PayloadTooLargeError                 payload_too_large (413)
     ├── AuthError                            401  unauthorized
     ├── PermissionDeniedError(PermissionError) 403 forbidden
     ├── NotFoundError(LookupError)           404  not_found
     ├── WorkerDeregisteredError(LookupError) 410  worker_deregistered
     ├── ConflictError                        409  conflict
     │    ├── IllegalTransitionError               illegal_transition
     │    ├── StaleFencingTokenError               stale_fencing_token
     │    ├── IdempotencyConflictError             idempotency_conflict
     │    └── InUseError                           in_use
     ├── StaleVersionError                    412  precondition_failed
     ├── RateLimitedError                     429  rate_limited
     ├── TenantLimitError                     429  limit_exceeded
     └── StoreUnavailableError(ConnectionError) 503 store_unavailable
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthError",
    "ConflictError",
    "CronwheelError",
    "IdempotencyConflictError",
    "IllegalTransitionError",
    "InUseError",
    "InvalidScheduleError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitedError",
    "StaleFencingTokenError",
    "StaleVersionError",
    "StoreUnavailableError",
    "TenantLimitError",
    "ValidationError",
    "WorkerDeregisteredError",
    "describe_error",
]


class CronwheelError(Exception):
    """Root of every error cronwheel raises on purpose."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        if self.details:
            body["details"] = self.details
        return {"error": body}


class ValidationError(CronwheelError, ValueError):
    status = 422
    code = "invalid_request"


class InvalidScheduleError(ValidationError):
    code = "invalid_schedule"


class PayloadTooLargeError(ValidationError):
    status = 413
    code = "payload_too_large"


class AuthError(CronwheelError):
    status = 401
    code = "unauthorized"


class PermissionDeniedError(CronwheelError, PermissionError):
    status = 403
    code = "forbidden"


class NotFoundError(CronwheelError, LookupError):
    status = 404
    code = "not_found"


class WorkerDeregisteredError(CronwheelError, LookupError):
    """The worker id named was deregistered: it leases and starts nothing any more.

    410, not 404: the id was valid and is retired for good, which a worker can act on
    (register again for a new id) where 404 — an unknown id, or another tenant's —
    leaves it guessing. Only the worker's own tenant ever sees it: another tenant's
    worker id answers 404 before this is known."""

    status = 410
    code = "worker_deregistered"


class ConflictError(CronwheelError):
    status = 409
    code = "conflict"


class IllegalTransitionError(ConflictError):
    code = "illegal_transition"


class StaleFencingTokenError(ConflictError):
    code = "stale_fencing_token"


class IdempotencyConflictError(ConflictError):
    code = "idempotency_conflict"


class InUseError(ConflictError):
    """Deleting what is still in use (a job with runs in progress, a tenant with live
    jobs) without ``force``: the message and details name what is in the way."""

    code = "in_use"


class StaleVersionError(CronwheelError):
    """A conditional change named a version of its target (``If-Match``) that is no
    longer the current one: someone changed it since it was read. ``details`` names the
    ``current_version``; nothing was changed. Read it again, then decide."""

    status = 412
    code = "precondition_failed"


class RateLimitedError(CronwheelError):
    status = 429
    code = "rate_limited"


class TenantLimitError(CronwheelError):
    """A request would take the tenant past one of its limits (``details.limit`` names
    it, with the tenant's count and the limit); nothing was done. Unlike
    :class:`RateLimitedError`, waiting alone does not help: the count must come down
    (runs finishing) or the limit go up."""

    status = 429
    code = "limit_exceeded"


class StoreUnavailableError(CronwheelError, ConnectionError):
    status = 503
    code = "store_unavailable"


def describe_error(exc: BaseException, *, limit: int = 2000) -> str:
    """An exception as people read it, in records and alerts: its type and message,
    bounded."""
    return f"{type(exc).__name__}: {exc}".strip()[:limit]
