"""cronwheel: a multi-tenant distributed job scheduler.

``Client`` / ``AsyncClient`` talk to the HTTP API; workers live in
:mod:`cronwheel.worker`.
"""

from __future__ import annotations

from cronwheel.client import (
    ApiConnectionError,
    ApiError,
    AsyncClient,
    Client,
    PreconditionFailedError,
)

__all__ = ["ApiConnectionError", "ApiError", "AsyncClient", "Client", "PreconditionFailedError"]
