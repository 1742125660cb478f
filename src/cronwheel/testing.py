"""Run real cronwheel processes — the API, scheduler nodes, workers — the way users do,
for acceptance tests and benchmarks (yours too: test your workers against a real
cronwheel). Processes are started through the CLI and waited on by readiness, never
by sleeping a fixed time. Faults are real too: a process can be killed (``kill -9``)
or frozen and thawed (``SIGSTOP`` / ``SIGCONT``)."""

from __future__ import annotations

import asyncio
import inspect
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from cronwheel.client import ApiError

if TYPE_CHECKING:
    from typer.testing import Result

__all__ = [
    "NOT_YET",
    "Cluster",
    "free_port",
    "invoke_then_terminate",
    "wait_until",
    "wait_until_async",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


NOT_YET: tuple[type[Exception], ...] = (httpx.HTTPError, ApiError)
"""What :func:`wait_until` counts as "not yet" by default: an HTTP or API error, as from a
process still starting."""


class _Deadline:
    """The I/O-free part of a wait, shared by its blocking and async forms."""

    def __init__(
        self,
        timeout: float,
        what: str | Callable[[], str],
        not_yet: tuple[type[BaseException], ...],
    ) -> None:
        self.timeout = timeout
        self.what = what
        self.not_yet = not_yet
        self._at = time.monotonic() + timeout

    def check_passed(self) -> None:
        if time.monotonic() > self._at:
            what = self.what if isinstance(self.what, str) else self.what()
            raise AssertionError(f"not within {self.timeout:g} s: {what}")


def wait_until(
    check: Callable[[], Any],
    timeout: float = 30.0,
    *,
    what: str | Callable[[], str] = "the condition",
    interval: float = 0.01,
    not_yet: tuple[type[BaseException], ...] = NOT_YET,
) -> Any:
    """Poll ``check`` every ``interval`` seconds until it returns something truthy, and
    return that; at the deadline fail with an ``AssertionError`` naming ``what`` (text,
    or a function that tells it then, e.g. the state last seen). An exception of
    ``not_yet`` counts as not yet (pass ``()`` to let every exception through at once);
    any other is raised."""
    deadline = _Deadline(timeout, what, not_yet)
    while True:
        try:
            value = check()
        except deadline.not_yet:
            value = None
        if value:
            return value
        deadline.check_passed()
        time.sleep(interval)


async def wait_until_async(
    check: Callable[[], Any],
    timeout: float = 30.0,
    *,
    what: str | Callable[[], str] = "the condition",
    interval: float = 0.01,
    not_yet: tuple[type[BaseException], ...] = NOT_YET,
) -> Any:
    """:func:`wait_until` on the running event loop: ``check`` may also return an
    awaitable (be a coroutine function), whose result counts."""
    deadline = _Deadline(timeout, what, not_yet)
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
        except deadline.not_yet:
            value = None
        if value:
            return value
        deadline.check_passed()
        await asyncio.sleep(interval)


def invoke_then_terminate(
    args: list[str], after: Callable[[], None], env: dict[str, str] | None = None
) -> Result:
    """Run a long-running ``cronwheel`` command in this process; once ``after`` returns
    (on another thread), SIGTERM this process as a process manager would. Whatever
    ``after`` raises is raised here."""
    from typer.testing import CliRunner

    from cronwheel.cli import app

    errors: list[BaseException] = []
    returned = threading.Event()

    def watcher() -> None:
        try:
            after()
        except BaseException as exc:
            errors.append(exc)
        finally:
            if not returned.is_set():  # a command that already failed has no handler left
                os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watcher)
    thread.start()
    try:
        result = CliRunner().invoke(app, args, env={"COLUMNS": "200", **(env or {})})
    finally:
        returned.set()
        thread.join()
    if errors:
        raise errors[0]
    return result


@dataclass
class Cluster:
    """Real cronwheel processes: the API, scheduler nodes and workers."""

    database_url: str
    workdir: Path
    admin_key: str = field(default_factory=lambda: "cw_admin_" + secrets.token_urlsafe(24))
    port: int = field(default_factory=free_port)
    python_path: list[Path] = field(default_factory=list)  # where --import modules live
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)  # for every process started
    paused: set[str] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            CRONWHEEL_DATABASE_URL=self.database_url,
            CRONWHEEL_ADMIN_KEY=self.admin_key,
            CRONWHEEL_DATA_DIR=str(self.workdir),
            PYTHONPATH=os.pathsep.join([*map(str, self.python_path), env.get("PYTHONPATH", "")]),
        )
        env.update(self.extra_env)
        return env

    def start(self, name: str, *args: str, env: Mapping[str, str] | None = None) -> None:
        """Start ``cronwheel ARGS`` as ``name``, with ``env`` added to its environment;
        its output goes to ``<workdir>/<name>.log``."""
        with open(self.workdir / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "cronwheel", *args],
                env={**self.env(), **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def start_server(self, schedulers: int) -> None:
        if self.database_url.startswith("sqlite"):
            self.start("server", "server", "--port", str(self.port))
            return
        self.start("api", "api", "--port", str(self.port))
        for i in range(schedulers):
            self.start(f"scheduler-{i}", "scheduler", "--node-id", f"bench-node-{i}")

    def start_workers(
        self,
        count: int,
        api_key: str,
        *,
        pool: str,
        module: str,
        concurrency: int,
        options: Sequence[str] = (),
    ) -> None:
        """Start ``count`` ``cronwheel worker`` processes, ``worker-0`` … (``options``:
        more of its command-line options, the same for each)."""
        for i in range(count):
            self.start_worker(
                f"worker-{i}",
                api_key,
                pool=pool,
                module=module,
                concurrency=concurrency,
                options=options,
            )

    def start_worker(
        self,
        name: str,
        api_key: str,
        *,
        pool: str,
        module: str,
        concurrency: int = 1,
        capabilities: Sequence[str] = (),
        tags: Sequence[str] = (),
        grace_period: float | None = None,
        env: Mapping[str, str] | None = None,
        options: Sequence[str] = (),
    ) -> None:
        """Start one ``cronwheel worker`` as ``name`` (also its name on the server); it
        declares the tasks of ``module``'s handlers, as every SDK worker does.
        ``options``: more of its command-line options."""
        args = ["--url", self.url, "--api-key", api_key, "--pool", pool, "--import", module]
        args += ["--concurrency", str(concurrency), "--name", name]
        if grace_period is not None:
            args += ["--grace-period", str(grace_period)]
        for capability in capabilities:
            args += ["--capability", capability]
        for tag in tags:
            args += ["--tag", tag]
        self.start(name, "worker", *args, *options, env=env)

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def kill(self, name: str) -> None:
        """``kill -9``: the process dies at once, saying goodbye to no one. It is
        forgotten (its log stays), so :meth:`check_alive` does not count it."""
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()
        self.paused.discard(name)

    def pause(self, name: str) -> None:
        """``SIGSTOP``: the process is frozen — no heartbeat, no request — until
        :meth:`resume`."""
        self.procs[name].send_signal(signal.SIGSTOP)
        self.paused.add(name)

    def resume(self, name: str) -> None:
        """``SIGCONT``: a frozen process carries on where it stopped."""
        self.procs[name].send_signal(signal.SIGCONT)
        self.paused.discard(name)

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the API answers ``/readyz``; fail at once if a process exits."""
        async with httpx.AsyncClient() as client:

            async def ready() -> bool:
                return (await client.get(self.url + "/readyz")).status_code == 200

            await self.wait_until(
                ready, timeout, what=f"the API at {self.url} to become ready", not_yet=NOT_YET
            )

    async def wait_until(
        self,
        check: Callable[[], Any],
        timeout: float = 60.0,
        *,
        what: str | Callable[[], str] = "the condition",
        interval: float = 0.1,
        not_yet: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """:func:`wait_until_async` while every process lives: one that exits fails the
        wait at once (:meth:`check_alive`). Any exception of ``check`` fails it too by
        default — a cluster that is up answers — unless it is one of ``not_yet``."""

        async def alive_and_true() -> Any:
            self.check_alive()
            value = check()
            return await value if inspect.isawaitable(value) else value

        return await wait_until_async(
            alive_and_true, timeout, what=what, interval=interval, not_yet=not_yet
        )

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                log = (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log}")

    def stop(self, names: list[str] | None = None, sig: int = signal.SIGTERM) -> None:
        chosen = [n for n in self.procs if names is None or n in names]
        for name in chosen:
            if name in self.paused:  # a frozen process would never see the signal
                self.resume(name)
        for name in chosen:
            if self.procs[name].poll() is None:
                self.procs[name].send_signal(sig)
        for name in chosen:
            try:
                self.procs[name].wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.procs[name].kill()
                self.procs[name].wait()

    async def tenant(self, name: str) -> tuple[str, str, str]:
        """Create a tenant; returns (tenant id, operator key, worker key)."""
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        async with httpx.AsyncClient(base_url=self.url, headers=headers) as client:
            made = (await client.post("/v1/tenants", json={"name": name})).raise_for_status()
            tenant = made.json()
            key = await client.post(f"/v1/tenants/{tenant['id']}/keys", json={"role": "worker"})
            return str(tenant["id"]), tenant["api_key"], key.raise_for_status().json()["api_key"]

    def start_scheduler(
        self, name: str, node_id: str | None = None, *, env: Mapping[str, str] | None = None
    ) -> str:
        """Start one ``cronwheel scheduler`` process as ``name``, with ``env`` added to its
        environment (e.g. ``CRONWHEEL_SHARD_LEASE_TTL``). Its node id — the actor of the
        events it writes — is ``node_id``, by default ``name``; returns it."""
        node = node_id or name
        self.start(name, "scheduler", "--node-id", node, env=env)
        return node

    def terminate(self, name: str, timeout: float = 20.0) -> int:
        """A graceful stop of one process: ``SIGTERM`` (a frozen one is thawed first, or
        it would never see the signal), then wait for it to exit — ``kill -9`` after
        ``timeout`` s. It is forgotten like a killed one (its log stays), so
        :meth:`check_alive` does not count it. Returns its exit code."""
        proc = self.procs.pop(name)
        if name in self.paused:
            proc.send_signal(signal.SIGCONT)
            self.paused.discard(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
