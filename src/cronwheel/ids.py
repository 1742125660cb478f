"""Identifiers: time-ordered UUIDs (version 7), so new rows land at the right of their
indexes and ids sort roughly by creation — which cursor pagination relies on."""

from __future__ import annotations

import uuid

from uuid_utils import compat

__all__ = ["new_id"]


def new_id() -> uuid.UUID:
    return compat.uuid7()
