"""Run real cronwheel processes — the API, scheduler nodes, workers — the way users do,
for acceptance tests and benchmarks (yours too: test your workers against a real
cronwheel). Processes are started through the CLI and waited on by readiness, never
by sleeping a fixed time."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

__all__ = ["Cluster", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    """Real cronwheel processes: the API, scheduler nodes and workers."""

    database_url: str
    workdir: Path
    admin_key: str = field(default_factory=lambda: "cw_admin_" + secrets.token_urlsafe(24))
    port: int = field(default_factory=free_port)
    python_path: list[Path] = field(default_factory=list)  # where --import modules live
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

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
        return env

    def start(self, name: str, *args: str) -> None:
        """Start ``cronwheel ARGS`` as ``name``; its output goes to ``<workdir>/<name>.log``."""
        with open(self.workdir / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "cronwheel", *args],
                env=self.env(),
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
        self, count: int, api_key: str, *, pool: str, module: str, concurrency: int
    ) -> None:
        for i in range(count):
            self.start(
                f"worker-{i}",
                "worker",
                "--url",
                self.url,
                "--api-key",
                api_key,
                "--pool",
                pool,
                "--import",
                module,
                "--concurrency",
                str(concurrency),
            )

    async def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient() as client:
            while True:
                self.check_alive()
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.url + "/readyz")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the API at {self.url} did not become ready")
                await asyncio.sleep(0.1)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                log = (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log}")

    def stop(self, names: list[str] | None = None, sig: int = signal.SIGTERM) -> None:
        chosen = [n for n in self.procs if names is None or n in names]
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
