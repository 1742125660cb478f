"""Shared fixtures: a fresh, migrated store per test, on SQLite and on PostgreSQL.

PostgreSQL: the schema is migrated once per session into a template database; each
test gets its own database cloned from it (fast), dropped at the end of the session.
SQLite: the schema is migrated once per session into a template file; each test gets
its own copy of it.

The suite runs on two processes (pytest-xdist, ``-n 2`` in pyproject.toml; ``-n 0``
runs it in one). Each process has its own template and databases. The end-to-end tests,
which start real processes and measure them, all run on one process, one at a time.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from cronwheel.domain.states import illegal_transitions
from cronwheel.settings import normalise_database_url
from cronwheel.store import Store, create_store
from pg_server import pg_admin
from pg_server import pg_url as pg_url_of

# The CLI's tables are as wide as COLUMNS says when its console is made; tests that
# read them set it per call. pytest-xdist sets COLUMNS=80 in its processes: drop it, so
# the console reads the width of each call.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)
# Every process the suite starts (in this process or as a child) keeps a few
# connections, not production's 32 (API) and 10 (scheduler), and opens few more under
# load: two test processes share one PostgreSQL server, maybe with other users.
os.environ.setdefault("CRONWHEEL_API_POOL_SIZE", "10")
os.environ.setdefault("CRONWHEEL_DB_POOL_SIZE", "3")
os.environ.setdefault("CRONWHEEL_DB_POOL_OVERFLOW", "4")
# A store the suite opens itself keeps as few.
TEST_POOL = {"pool_size": 3, "pool_overflow": 4}

# Per-test databases, dropped at the end of the session.
_spent: list[str] = []
# Drops at once at the end of the session: each one waits for a checkpoint, and
# concurrent drops share one (100 drops: 9 s four at once, 6 s sixteen at once; more
# would crowd the other test process's connections while it finishes).
_DROPS_AT_ONCE = 16


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """Name of a migrated template database, made once per test session."""
    name = f"cw_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"

    async def make() -> None:
        await pg_admin(f'CREATE DATABASE "{name}"')
        store = create_store(pg_url_of(name))
        await store.migrate()
        await store.close()

    asyncio.run(make())
    yield name

    async def drop_all() -> None:
        gate = asyncio.Semaphore(_DROPS_AT_ONCE)

        async def drop(db: str) -> None:
            async with gate:
                await pg_admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

        outcomes = await asyncio.gather(
            *(drop(db) for db in [*_spent, name]), return_exceptions=True
        )
        for outcome in outcomes:  # every drop was tried before any failure is told
            if isinstance(outcome, BaseException):
                raise outcome

    asyncio.run(drop_all())
    _spent.clear()


@pytest.fixture
async def pg_url(pg_template: str) -> AsyncIterator[str]:
    """A fresh migrated PostgreSQL database for one test; dropped afterwards."""
    name = f"cw_t_{uuid.uuid4().hex[:12]}"
    await pg_admin(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    # Dropped with the template at the end of the session: a drop costs as much as the
    # create, and nothing reuses the name.
    _spent.append(name)
    yield pg_url_of(name)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file, made once per test session."""
    path = tmp_path_factory.mktemp("sqlite-template") / "cronwheel.db"

    async def make() -> None:
        store = create_store(normalise_database_url(f"sqlite:///{path}"))
        await store.migrate()
        await store.close()

    asyncio.run(make())
    # Closed, the file holds everything: no write-ahead log is left beside it to copy.
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    return path


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A fresh migrated SQLite database for one test: a copy of the template."""
    path = tmp_path / "cronwheel.db"
    shutil.copyfile(sqlite_template, path)
    return normalise_database_url(f"sqlite:///{path}")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    """A fresh migrated database URL, once per backend."""
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    """An open store on a fresh migrated database, once per backend."""
    s = create_store(store_url, **TEST_POOL)
    await s.open()
    try:
        yield s
        # Whatever the test did, every transition it recorded is one the state machine
        # allows (domain/states.TRANSITIONS): the table is the law, not documentation.
        assert illegal_transitions(await s.events_transitions()) == []
    finally:
        await s.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """End-to-end tests share one process (``--dist loadgroup``): two clusters of real
    processes at once would measure each other."""
    for item in items:
        if item.get_closest_marker("e2e") is not None:
            item.add_marker(pytest.mark.xdist_group("e2e"))


# What the fuzz tests (tests/fuzz) ran: (backend, requests, stateful steps, 2xx
# answers, seconds), from each pytest-xdist process or from this one.
_FUZZ_RUNS: list[list[object]] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    _FUZZ_RUNS.extend(getattr(node, "workeroutput", {}).get("cronwheel_fuzz", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    runs = _FUZZ_RUNS + getattr(terminalreporter.config, "cronwheel_fuzz", [])
    totals: dict[str, list[float]] = {}
    for backend, *counts in runs:
        sums = totals.setdefault(str(backend), [0, 0, 0, 0.0])
        for i, value in enumerate(counts):
            sums[i] += float(value)  # type: ignore[arg-type]
    for backend, (cases, steps, served, seconds) in sorted(totals.items()):
        terminalreporter.write_line(
            f"API fuzzing ({backend}): {cases:.0f} generated requests in {seconds:.1f} s; "
            f"{steps:.0f} of them steps of stateful scenarios, {served:.0f} served with a 2xx"
        )
