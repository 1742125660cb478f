"""The REST API: a FastAPI app over a store (``create_app``), its auth and its errors."""

from __future__ import annotations

from cronwheel.api.app import create_app, stop_long_polls
from cronwheel.api.auth import Principal, generate_key, hash_key

__all__ = ["Principal", "create_app", "generate_key", "hash_key", "stop_long_polls"]
