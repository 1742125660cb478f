"""Progress reports: the rules a handler's ``ctx.heartbeat(details)`` follows, shared by
the SDK that sends them, the API that checks them and the store that keeps them.

A run whose job sets ``progress_timeout`` must report progress within that many
seconds of its attempt's start and of each report before; otherwise the expiry sweep
ends the attempt TIMED_OUT (:func:`no_progress_error`) and the run is retried like after
any timeout. A report may carry *details*, small JSON the attempt keeps (the last one
wins) so that a retry, or a person, can see how far the work got.
"""

from __future__ import annotations

import json
from typing import Any

from cronwheel.domain.bounds import JSON_DEPTH_MAX

__all__ = [
    "PROGRESS_DETAILS_DEPTH_MAX",
    "PROGRESS_DETAILS_MAX_BYTES",
    "details_size",
    "no_progress_error",
]

PROGRESS_DETAILS_MAX_BYTES = 4096
"""The most a report's details may take as compact JSON (UTF-8). Larger ones are
refused, never truncated: a cut JSON document would not parse."""

# Details travel as deep as a result: body > heartbeats > item > details.
PROGRESS_DETAILS_DEPTH_MAX = JSON_DEPTH_MAX - 3


def details_size(details: Any) -> int:
    """The size of ``details`` as compact JSON, in bytes, as the API measures it."""
    return len(json.dumps(details, separators=(",", ":"), ensure_ascii=False).encode())


def no_progress_error(seconds: float) -> str:
    """The error of an attempt ended for reporting no progress within ``seconds``."""
    return f"no progress reported for {seconds:g} s (progress_timeout)"
