"""The store of record: PostgreSQL in production, SQLite embedded by default."""

from __future__ import annotations

from cronwheel.store.base import (
    CHANNEL_RUNS_NEW,
    CHANNEL_RUNS_READY,
    CompleteItem,
    FailItem,
    HeartbeatItem,
    RunFilter,
    Store,
    Subscription,
)

__all__ = [
    "CHANNEL_RUNS_NEW",
    "CHANNEL_RUNS_READY",
    "CompleteItem",
    "FailItem",
    "HeartbeatItem",
    "RunFilter",
    "Store",
    "Subscription",
    "create_store",
]


def create_store(url: str, *, idle_transaction_timeout: float | None = None) -> Store:
    """A store for a normalised database URL (see ``Settings``); call ``open()`` next.
    ``idle_transaction_timeout`` (PostgreSQL): how long the server lets a session sit
    inside a transaction before ending it (see :class:`PostgresStore`)."""
    if url.startswith("postgresql+asyncpg://"):
        from cronwheel.store.postgres import PostgresStore

        return PostgresStore(url, idle_transaction_timeout=idle_transaction_timeout)
    if url.startswith("sqlite+aiosqlite://"):
        from cronwheel.store.sqlite import SqliteStore

        return SqliteStore(url)
    raise ValueError(f"unsupported database URL: {url}")
