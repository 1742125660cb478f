"""What the store counts as a moment's failure (answered 503 ``store_unavailable`` with
Retry-After, retried by scheduler passes) rather than a fault."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from cronwheel.store.driver import Driver
from cronwheel.store.drivers.postgres import PostgresDriver
from cronwheel.store.drivers.sqlite import SqliteDriver

DRIVERS = [
    PostgresDriver("postgresql+asyncpg://nobody@127.0.0.1:1/none"),
    SqliteDriver("sqlite+aiosqlite:///unused.db"),
]


@pytest.mark.parametrize("driver", DRIVERS, ids=lambda d: d.dialect)
def test_no_pool_connection_in_time_is_transient(driver: Driver) -> None:
    assert driver.transient(PoolTimeoutError("QueuePool limit of size 3 overflow 4 reached"))
    assert not driver.transient(ValueError("a fault"))


def test_a_full_server_is_transient() -> None:
    full = asyncpg.TooManyConnectionsError("sorry, too many clients already")
    assert DRIVERS[0].transient(full)
    assert not DRIVERS[0].transient(asyncpg.UniqueViolationError("duplicate key"))
