"""The Python worker SDK: register handlers, then run.

::

    from cronwheel.worker import Worker, NonRetryableError

    worker = Worker("http://localhost:8000", api_key=WORKER_KEY, pool="default")

    @worker.task("billing.charge")
    async def charge(ctx, payload):
        ctx.log.info("charging %s", payload["customer"])
        await billing.charge(payload, idempotency_key=ctx.idempotency_key)

    worker.run()   # until SIGTERM / SIGINT; a second signal skips the grace period

The worker declares its handlers' task names when it registers: the server leases it
runs of those tasks only (and, with ``tags``, runs whose route tags it carries). It
leases as many runs as it has free slots in one long-poll, runs async handlers on its
event loop and sync ones in a thread pool, sends one heartbeat request per interval
for everything it holds, keeps one long-poll open that tells it of a cancel as soon as
it is asked, and reports outcomes in batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import httpx

from cronwheel import eventloop
from cronwheel.client import DEFAULT_TIMEOUT, AsyncClient
from cronwheel.domain.spec import WEBHOOK_CAPABILITY
from cronwheel.worker.logship import LogShipConfig
from cronwheel.worker.outbox import WorkerStats
from cronwheel.worker.protocol import WorkerProtocol
from cronwheel.worker.session import SessionConfig, WorkerSession
from cronwheel.worker.tasks import H, TaskRegistry
from cronwheel.worker.webhook import AllowList, WebhookCaller

__all__ = ["Worker", "webhook_worker"]


class Worker:
    """A worker of one pool. It is leased runs of the tasks it has handlers for when it
    starts (register them first), and with ``tags`` also runs whose route tags are all
    among them.

    ``concurrency`` bounds the handlers running at once. ``prefetch`` bounds the leased
    runs held waiting for a slot while every slot is busy (None: twice ``concurrency``; 0:
    none): the worker holds about what its handlers finish in 0.2 s, so that a slot
    that frees up starts the next run at once; with long handlers, none.
    ``grace_period`` is how long shutdown waits for running handlers before handing
    their runs back. ``lease_wait`` is the long-poll duration; ``heartbeat_interval``
    overrides the server's suggestion (it is also kept under a third of each run's
    heartbeat timeout). ``flush_delay``/``flush_size`` shape the outcome batches.
    ``webhook`` makes the worker call webhooks too (it declares the ``webhook``
    capability); with no task handlers it leases webhook runs only — see
    :func:`webhook_worker`.
    ``log_shipping`` says which ``ctx.log`` records go to the server, where
    ``cronwheel runs logs`` shows them (default: INFO and above;
    ``LogShipConfig(level=None)``: none).
    ``lease_ahead``: runs dispatched ahead of their instant and due within this many
    seconds are leased as reservations, and started at their instant with one small
    request (None: as far as the server allows; 0: never). ``reserve`` bounds the
    reservations held beyond the free slots (None: 10,000; 0: each holds a slot):
    about what the slots begin in two seconds, once the handlers' duration is known;
    started ones that the slots' pace would not begin by then are handed back.
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: str,
        pool: str = "default",
        capabilities: Sequence[str] = (),
        tags: Sequence[str] = (),
        concurrency: int = 10,
        name: str | None = None,
        grace_period: float = 30.0,
        lease_wait: float = 20.0,
        heartbeat_interval: float | None = None,
        flush_delay: float = 0.01,
        flush_size: int = 100,
        backoff_max: float = 30.0,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        webhook: WebhookCaller | None = None,
        log_shipping: LogShipConfig | None = None,
        lease_ahead: float | None = None,
        prefetch: int | None = None,
        reserve: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if grace_period < 0 or lease_wait < 0 or flush_delay < 0:
            raise ValueError("grace_period, lease_wait and flush_delay cannot be negative")
        if lease_ahead is not None and lease_ahead < 0:
            raise ValueError("lease_ahead cannot be negative")
        if prefetch is not None and prefetch < 0:
            raise ValueError("prefetch cannot be negative")
        if reserve is not None and reserve < 0:
            raise ValueError("reserve cannot be negative")
        if heartbeat_interval is not None and heartbeat_interval <= 0:
            raise ValueError("heartbeat_interval must be positive")
        if flush_size < 1:
            raise ValueError("flush_size must be at least 1")
        if not api_key:
            raise ValueError("a worker needs an api_key (a key with the worker role)")
        self.url = url
        self.api_key = api_key
        self.timeout = timeout
        self.webhook = webhook
        if webhook is not None and WEBHOOK_CAPABILITY not in capabilities:
            capabilities = (*capabilities, WEBHOOK_CAPABILITY)
        self.config = SessionConfig(
            pool=pool,
            capabilities=tuple(capabilities),
            tags=tuple(tags),
            concurrency=concurrency,
            name=name,
            grace_period=grace_period,
            lease_wait=lease_wait,
            flush_delay=flush_delay,
            flush_size=flush_size,
            heartbeat_interval=heartbeat_interval,
            backoff_max=backoff_max,
            log_shipping=log_shipping or LogShipConfig(),
            lease_ahead=lease_ahead,
            prefetch=prefetch,
            reserve=reserve,
        )
        self.registry = TaskRegistry()
        self.stats = WorkerStats()
        self.worker_id: str | None = None
        self._transport = transport
        self._session: WorkerSession | None = None
        # Client is built lazily so that a bad URL fails here, not in the event loop.
        AsyncClient._validate_url(url)

    # -- handlers --------------------------------------------------------------------

    def task(self, name: str) -> Callable[[H], H]:
        """Decorator registering a handler ``(ctx, payload)`` for task ``name``."""
        return self.registry.task(name)

    def include(self, registry: TaskRegistry) -> None:
        """Add every handler of ``registry`` (e.g. the global ``cronwheel.worker.registry``)."""
        self.registry.include(registry)

    # -- running ---------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Handlers running right now."""
        return 0 if self._session is None else self._session.running

    @property
    def held(self) -> int:
        """Attempts leased and not yet acknowledged by the server."""
        return 0 if self._session is None else len(self._session.held)

    async def run_async(
        self,
        stop: asyncio.Event | None = None,
        *,
        drain: bool = False,
        force: asyncio.Event | None = None,
    ) -> None:
        """Work until ``stop`` is set — or, with ``drain=True``, until no run is left to
        lease and every outcome is reported. ``force`` cuts the grace period short."""
        stop = stop or asyncio.Event()
        force = force or asyncio.Event()
        async with AsyncClient(
            self.url, api_key=self.api_key, timeout=self.timeout, transport=self._transport
        ) as client:
            webhooks_only = self.webhook is not None and not len(self.registry)
            session = WorkerSession(
                self.config,
                self.registry,
                WorkerProtocol(client, webhooks_only=webhooks_only),
                self.stats,
                stop=stop,
                force=force,
                drain=drain,
                webhook=None if self.webhook is None else self.webhook.bind,
            )
            self._session = session
            try:
                await session.run()
            finally:
                self.worker_id = session.worker_id
                if self.webhook is not None:
                    await self.webhook.aclose()

    def run(self) -> None:
        """Work until SIGTERM or SIGINT (blocking). The first signal starts a graceful
        shutdown; a second one releases what is still running at once. Runs on uvloop
        where it is installed (``cronwheel.eventloop``)."""
        eventloop.run(self._run_with_signals())

    async def _run_with_signals(self) -> None:
        stop, force = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            (force if stop.is_set() else stop).set()

        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal)
                installed.append(sig)
        try:
            await self.run_async(stop, force=force)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)


def webhook_worker(
    url: str,
    *,
    api_key: str,
    pool: str = "default",
    allow: AllowList | Iterable[str] = (),
    timeout: float = 30.0,
    concurrency: int = 20,
    **options: Any,
) -> Worker:
    """A worker that calls webhooks and nothing else: it declares the ``webhook``
    capability and leases only webhook runs. ``options`` go to
    :class:`~cronwheel.worker.Worker` (name, grace_period, lease_wait, …)."""
    caller = WebhookCaller(allow=allow, timeout=timeout)
    return Worker(
        url, api_key=api_key, pool=pool, concurrency=concurrency, webhook=caller, **options
    )
