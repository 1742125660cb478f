"""The blocking and the asyncio clients are written twice, side by side; these tests fail
as soon as the two part: a resource, a method or a parameter on one side only, another
default, another type. The async side may differ only where it must: it awaits
(``async def``), it yields asynchronously (``AsyncIterator`` for ``Iterator``), it closes
with ``aclose``, and it uses the asyncio twins of httpx's classes.

The checker itself is tried on small fake clients too, so that a comparison that
could never fail would fail here."""

from __future__ import annotations

import asyncio
import inspect
import operator
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from functools import reduce
from typing import Any, Union, get_args, get_origin, get_type_hints

import httpx
import pytest

from cronwheel.client import aio, sync

URL = "http://parity.invalid"

# The async name of each sync name that has to differ.
ASYNC_NAMES = {"close": "aclose", "__enter__": "__aenter__", "__exit__": "__aexit__"}

# Each async type and the sync type it stands for, besides the clients' own classes.
ASYNC_TYPES = {
    AsyncIterator: Iterator,
    httpx.AsyncBaseTransport: httpx.BaseTransport,
    httpx.AsyncClient: httpx.Client,
}

# Methods that do no I/O, so that neither side awaits them.
NOT_AWAITED = {"__init__", "with_tenant"}

# Parameters only the async side has, and why.
ASYNC_ONLY_PARAMETERS = {
    # The worker protocol long-polls for leases, and only the async client is used for it.
    ("AsyncClient.send", "read_timeout"),
}


# -- the checker ---------------------------------------------------------------------


def _twins() -> dict[Any, Any]:
    """Each async-side type and the sync type it stands for."""
    pairs: dict[Any, Any] = dict(ASYNC_TYPES)
    for name in sync.__all__:
        if hasattr(aio, f"Async{name}"):
            pairs[getattr(aio, f"Async{name}")] = getattr(sync, name)
    return pairs


def _as_sync(hint: Any, twins: dict[Any, Any]) -> Any:
    """``hint`` with every async type replaced by its sync twin, and no ``Awaitable``."""
    if isinstance(hint, list):  # a Callable's parameters
        return [_as_sync(h, twins) for h in hint]
    origin, args = get_origin(hint), get_args(hint)
    if origin is None:
        return twins.get(hint, hint)
    if origin in (Awaitable, Coroutine):
        return _as_sync(args[-1], twins)
    converted = tuple(_as_sync(a, twins) for a in args)
    if origin in (types.UnionType, Union):
        return reduce(operator.or_, converted)
    return twins.get(origin, origin)[converted]


def _awaits(function: Callable[..., Any], returns: Any) -> bool:
    """Whether a call of ``function`` has to be awaited or iterated with ``async for``."""
    if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
        return True
    return get_origin(returns) in (Awaitable, Coroutine, AsyncIterator)


def signature_differences(
    sync_function: Callable[..., Any],
    async_function: Callable[..., Any],
    *,
    where: str,
    twins: dict[Any, Any],
    async_only: frozenset[str] = frozenset(),
    awaited: bool = True,
) -> list[str]:
    """How ``async_function`` differs from ``sync_function`` beyond being async (unless
    not ``awaited``: then they have to be called alike)."""
    sync_hints = get_type_hints(sync_function)
    async_hints = get_type_hints(async_function)
    out = []
    if _awaits(sync_function, sync_hints.get("return")):
        out.append(f"{where}: the sync side is async")
    if _awaits(async_function, async_hints.get("return")) != awaited:
        out.append(f"{where}: the async side is {'not ' if awaited else ''}async")
    if inspect.isgeneratorfunction(sync_function) != inspect.isasyncgenfunction(async_function):
        out.append(f"{where}: one side is a generator and the other is not")
    sync_parameters = list(inspect.signature(sync_function).parameters.values())
    async_parameters = [
        p for p in inspect.signature(async_function).parameters.values() if p.name not in async_only
    ]
    sync_names = [p.name for p in sync_parameters]
    async_names = [p.name for p in async_parameters]
    if sync_names != async_names:
        return [*out, f"{where}: parameters {sync_names} (sync) but {async_names} (async)"]
    for s, a in zip(sync_parameters, async_parameters, strict=True):
        if s.kind != a.kind:
            out.append(f"{where}({s.name}): {s.kind.description} but {a.kind.description}")
        if s.default != a.default:
            out.append(f"{where}({s.name}): default {s.default!r} but {a.default!r}")
        sync_hint, async_hint = sync_hints.get(s.name), async_hints.get(a.name)
        if sync_hint != _as_sync(async_hint, twins):
            out.append(f"{where}({s.name}): {sync_hint} but {async_hint}")
    if sync_hints.get("return") != _as_sync(async_hints.get("return"), twins):
        out.append(f"{where}: returns {sync_hints.get('return')} but {async_hints.get('return')}")
    return out


def _public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    return {
        name: member
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
        or name in ASYNC_NAMES
        or name in ASYNC_NAMES.values()
        or name == "__init__"
    }


def class_differences(
    sync_cls: type, async_cls: type, *, twins: dict[Any, Any] | None = None
) -> list[str]:
    """Every method one class has and the other lacks, and every signature that differs."""
    twins = _twins() if twins is None else twins
    sync_methods, async_methods = _public_methods(sync_cls), _public_methods(async_cls)
    expected = {ASYNC_NAMES.get(name, name): name for name in sync_methods}
    out = [
        f"{sync_cls.__name__}.{sync_name}: no {async_cls.__name__}.{async_name}"
        for async_name, sync_name in sorted(expected.items())
        if async_name not in async_methods
    ]
    out += [
        f"{async_cls.__name__}.{name}: no {sync_cls.__name__} twin"
        for name in sorted(set(async_methods) - set(expected))
    ]
    for async_name, sync_name in sorted(expected.items()):
        if async_name not in async_methods:
            continue
        where = f"{async_cls.__name__}.{async_name}"
        async_only = frozenset(p for w, p in ASYNC_ONLY_PARAMETERS if w == where)
        out += signature_differences(
            sync_methods[sync_name],
            async_methods[async_name],
            where=where,
            twins=twins,
            async_only=async_only,
            awaited=async_name not in NOT_AWAITED,
        )
    return out


def resources(client: object) -> dict[str, type]:
    """The client's resources: its attributes bound to it, and their classes."""
    return {
        name: type(value)
        for name, value in vars(client).items()
        if getattr(value, "_client", None) is client
    }


def resource_differences(sync_client: object, async_client: object) -> list[str]:
    """The resources of one client and not the other, and those that are not the twin
    of the other side's."""
    twins = _twins()
    sync_resources, async_resources = resources(sync_client), resources(async_client)
    out = [f"no async {n!r} resource" for n in sorted(set(sync_resources) - set(async_resources))]
    out += [f"no sync {n!r} resource" for n in sorted(set(async_resources) - set(sync_resources))]
    for name in sorted(set(sync_resources) & set(async_resources)):
        if twins.get(async_resources[name]) is not sync_resources[name]:
            out.append(
                f"{name}: {sync_resources[name].__name__} but {async_resources[name].__name__}"
            )
    return out


# -- the clients ---------------------------------------------------------------------

PAIRS = [
    (getattr(sync, name), getattr(aio, f"Async{name}"))
    for name in sorted(sync.__all__)
    if hasattr(aio, f"Async{name}")  # the others fail the test below
]


def test_every_sync_class_has_an_async_twin() -> None:
    assert sorted(aio.__all__) == sorted(f"Async{name}" for name in sync.__all__)


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_the_twins_have_the_same_methods_and_signatures(sync_cls: type, async_cls: type) -> None:
    assert class_differences(sync_cls, async_cls) == []


@pytest.mark.parametrize("tenant", [None, "a-tenant"], ids=["client", "with_tenant"])
def test_the_clients_have_the_same_resources(tenant: str | None) -> None:
    sync_client, async_client = sync.Client(URL), aio.AsyncClient(URL)
    try:
        sync_view, async_view = sync_client, async_client
        if tenant is not None:
            sync_view, async_view = (
                sync_client.with_tenant(tenant),
                async_client.with_tenant(tenant),
            )
        assert resource_differences(sync_view, async_view) == []
        assert resources(sync_view) == resources(sync_client)  # a view has them all
        assert resources(async_view) == resources(async_client)
    finally:
        sync_client.close()
        asyncio.run(async_client.aclose())


# -- the checker can fail ------------------------------------------------------------


class _Box:
    def __init__(self, client: object) -> None:
        self._client = client


class _Other(_Box):
    pass


class _SyncFake:
    def get(self, box_id: str, *, limit: int | None = None) -> dict[str, Any]:
        return {}

    def iter(self, *, page_size: int = 10) -> Iterator[dict[str, Any]]:
        yield {}

    def drop(self) -> None:
        pass


class _AsyncFake:
    async def get(self, box_id: str, *, limit: int | None = None) -> dict[str, Any]:
        return {}

    async def iter(self, *, page_size: int = 10) -> AsyncIterator[dict[str, Any]]:
        yield {}

    async def drop(self) -> None:
        pass


def _without(cls: type, method: str) -> type:
    """A copy of ``cls`` that lacks ``method``."""
    members = {k: v for k, v in vars(cls).items() if k != method and not k.startswith("__")}
    return type(f"{cls.__name__}Without{method.title()}", (), members)


class _AsyncDrifted:
    async def get(self, box: str, *, limit: int | None = 5) -> dict[str, Any]:
        return {}

    def iter(self, page_size: str = "10") -> Iterator[dict[str, Any]]:
        yield {}

    async def drop(self) -> None:
        pass

    async def extra(self) -> None:
        pass


def test_the_checker_accepts_twins_that_differ_only_in_awaiting() -> None:
    assert class_differences(_SyncFake, _AsyncFake, twins=ASYNC_TYPES) == []


def test_the_checker_finds_a_method_missing_on_either_side() -> None:
    assert class_differences(_SyncFake, _without(_AsyncFake, "drop"), twins=ASYNC_TYPES) == [
        "_SyncFake.drop: no _AsyncFakeWithoutDrop.drop"
    ]
    assert class_differences(_without(_SyncFake, "drop"), _AsyncFake, twins=ASYNC_TYPES) == [
        "_AsyncFake.drop: no _SyncFakeWithoutDrop twin"
    ]


def test_the_checker_finds_every_drift_of_a_signature() -> None:
    found = "\n".join(class_differences(_SyncFake, _AsyncDrifted, twins=ASYNC_TYPES))
    assert "_AsyncDrifted.extra: no _SyncFake twin" in found
    assert "parameters ['self', 'box_id', 'limit'] (sync) but ['self', 'box', 'limit']" in found
    assert "_AsyncDrifted.iter: the async side is not async" in found
    assert "_AsyncDrifted.iter(page_size): keyword-only but positional or keyword" in found
    assert "_AsyncDrifted.iter(page_size): default 10 but '10'" in found
    assert "_AsyncDrifted.iter(page_size): <class 'int'> but <class 'str'>" in found


def test_the_checker_finds_a_missing_or_wrong_resource() -> None:
    sync_client, async_client = types.SimpleNamespace(), types.SimpleNamespace()
    sync_client.jobs, sync_client.runs = _Box(sync_client), _Box(sync_client)
    async_client.jobs, async_client.tenants = _Other(async_client), _Box(async_client)
    assert resource_differences(sync_client, async_client) == [
        "no async 'runs' resource",
        "no sync 'tenants' resource",
        "jobs: _Box but _Other",
    ]
