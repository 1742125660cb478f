"""The store of record: PostgreSQL in production, SQLite embedded by default."""

from __future__ import annotations

from cronwheel.store.base import Store, Subscription
from cronwheel.store.notices import CHANNEL_KEYS_REVOKED, CHANNEL_RUNS_NEW, CHANNEL_RUNS_READY
from cronwheel.store.values import CompleteItem, FailItem, HeartbeatItem, RunFilter

__all__ = [
    "CHANNEL_KEYS_REVOKED",
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


def create_store(
    url: str,
    *,
    idle_transaction_timeout: float | None = None,
    pool_size: int = 10,
    pool_overflow: int = 8,
    warm: bool = False,
) -> Store:
    """A store for a normalised database URL (see ``Settings``); call ``open()`` next.
    PostgreSQL only: ``idle_transaction_timeout``, how long the server lets a session
    sit inside a transaction before ending it; ``pool_size``, the connections kept
    open; ``pool_overflow``, how many more may be opened under load; ``warm``, open the
    pool at ``open()`` rather than on demand (see
    :class:`~cronwheel.store.drivers.postgres.PostgresDriver`)."""
    from cronwheel.store.driver import Driver
    from cronwheel.store.sql import SqlStore

    driver: Driver
    if url.startswith("postgresql+asyncpg://"):
        from cronwheel.store.drivers.postgres import PostgresDriver

        driver = PostgresDriver(
            url,
            idle_transaction_timeout=idle_transaction_timeout,
            pool_size=pool_size,
            pool_overflow=pool_overflow,
            warm=warm,
        )
    elif url.startswith("sqlite+aiosqlite://"):
        from cronwheel.store.drivers.sqlite import SqliteDriver

        driver = SqliteDriver(url)
    else:
        raise ValueError(f"unsupported database URL: {url}")
    return SqlStore(driver)
