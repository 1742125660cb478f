"""The Node.js example worker (``examples/node-worker/worker.mjs``) against a real
server, as a team outside Python would run it: its runs end SUCCESS with the line it
logged readable through the API, its failures end FAILED or DEAD_LETTER with their
error, its progress reports reach the attempt, and on SIGTERM it hands back what it
could not finish, deregisters and exits 0."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cronwheel import Client
from cronwheel.testing import wait_until

NODE = shutil.which("node")
WORKER = Path(__file__).resolve().parents[2] / "examples" / "node-worker" / "worker.mjs"
FINAL = {"SUCCESS", "FAILED", "DEAD_LETTER", "CANCELLED", "SKIPPED"}

pytestmark = pytest.mark.skipif(
    NODE is None, reason="node is not on PATH: the Node.js example worker cannot run"
)


class NodeWorker:
    """``node worker.mjs`` as a process, its output in a file."""

    def __init__(self, url: str, key: str, out: Path, **env: str) -> None:
        assert NODE is not None
        self.out = out
        variables = {k: v for k, v in os.environ.items() if not k.startswith("CRONWHEEL_")}
        variables.update(CRONWHEEL_URL=url, CRONWHEEL_API_KEY=key, **env)
        with open(out, "wb") as sink:
            self.proc = subprocess.Popen(
                [NODE, str(WORKER)], env=variables, stdout=sink, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def worker_id(self) -> str:
        found = wait_until(
            lambda: self.alive() and re.search(r"registered worker (\S+)", self.output()),
            what=lambda: f"the worker to register; it said:\n{self.output()}",
        )
        return str(found.group(1))

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the worker exited with {self.proc.returncode}:\n{self.output()}")
        return True

    def terminate(self, timeout: float = 20.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def node_worker(live: tuple[str, Client, str], tmp_path: Path) -> Iterator[NodeWorker]:
    url, _, worker_key = live
    worker = NodeWorker(url, worker_key, tmp_path / "node-worker.log", CRONWHEEL_GRACE_PERIOD="1")
    try:
        yield worker
    finally:
        worker.kill()


def _run(operator: Client, job: dict[str, Any]) -> dict[str, Any]:
    run: dict[str, Any] = operator.runs.get(job["first_run_id"])
    return run


def _final(operator: Client, job: dict[str, Any], worker: NodeWorker) -> dict[str, Any]:
    """The job's first run once it has ended."""

    def ended() -> dict[str, Any] | None:
        worker.alive()
        run = _run(operator, job)
        return run if run["state"] in FINAL else None

    run: dict[str, Any] = wait_until(
        ended,
        what=lambda: (
            f"the run of {job['name']} to end: {_run(operator, job)['state']}; "
            f"the worker said:\n{worker.output()}"
        ),
    )
    return run


def test_node_worker_runs_fails_logs_and_deregisters_on_sigterm(
    live: tuple[str, Client, str], node_worker: NodeWorker
) -> None:
    url, operator, worker_key = live
    greet = operator.jobs.create(
        name="greet", schedule={"asap": True}, task="node.greet", payload={"name": "cronwheel"}
    )
    by_zero = operator.jobs.create(
        name="by-zero", schedule={"asap": True}, task="node.divide", payload={"n": 1, "by": 0}
    )
    by_text = operator.jobs.create(
        name="by-text",
        schedule={"asap": True},
        task="node.divide",
        payload={"n": 1, "by": "two"},
        retry={"max_attempts": 1},
    )
    slow = operator.jobs.create(
        name="slow",
        schedule={"asap": True},
        task="node.sleep",
        payload={"seconds": 120},
        progress_timeout=4,  # the worker beats every second for it
    )
    worker_id = node_worker.worker_id()

    done = _final(operator, greet, node_worker)
    assert done["state"] == "SUCCESS", done
    assert done["result"] == {"greeting": "hello, cronwheel"}
    [attempt] = done["attempts"]
    assert attempt["worker_id"] == worker_id
    lines = [line["message"] for line in operator.runs.logs(done["id"])]
    assert lines == [f"hello, cronwheel (run {done['id']}, attempt 1)"]

    failed = _final(operator, by_zero, node_worker)
    assert failed["state"] == "FAILED", failed
    assert failed["attempts"][0]["error"] == "NonRetryableError: division by zero"

    dead = _final(operator, by_text, node_worker)
    assert dead["state"] == "DEAD_LETTER", dead
    assert dead["attempts"][0]["error"] == "Error: cannot divide 1 by two"

    # The slow handler runs and reports progress on the worker's heartbeats.
    wait_until(
        lambda: (
            node_worker.alive()
            and (_run(operator, slow)["attempts"] or [{}])[0].get("progress_details")
        ),
        what=lambda: f"a progress report; the worker said:\n{node_worker.output()}",
    )

    assert node_worker.terminate() == 0, node_worker.output()
    said = node_worker.output()
    assert f"deregistered worker {worker_id} (1 handed back" in said, said
    # What it could not finish within its grace period is ready again, the try not
    # counted, and the worker id is retired.
    handed_back = _run(operator, slow)
    assert handed_back["state"] == "DISPATCHED", handed_back
    assert [a["state"] for a in handed_back["attempts"]] == ["RELEASED"]
    lease = httpx.post(
        f"{url}/v1/workers/{worker_id}/lease",
        json={"max": 1},
        headers={"Authorization": f"Bearer {worker_key}"},
    )
    assert lease.status_code == 410, lease.text
    assert lease.json()["error"]["code"] == "worker_deregistered"


def test_node_worker_refuses_to_start_without_a_key(tmp_path: Path) -> None:
    assert NODE is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWHEEL_")}
    done = subprocess.run([NODE, str(WORKER)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "CRONWHEEL_API_KEY is not set" in done.stderr
