"""The README's "Using it" section, run as written: its shell and Python blocks are read
from README.md itself and run in order, with real processes (``cronwheel server``, the
CLI, ``cronwheel worker`` with the README's ``my_tasks.py``, the client example), in a
home directory of their own. Only what a reader puts in is put in: the ``<…>`` a
command shows, from what an earlier command printed, and the port. At the end every
job the section created has run, and every run that came due ended SUCCESS.

A README change that stops the section working as written fails this test."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cronwheel import Client
from cronwheel.testing import free_port, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "Using it"
COMMAND_SECONDS = 30.0  # the most one command of the section may take
FINISH_SECONDS = 60.0  # the most the jobs may take to run, once created
README_PORT = "8000"

# What a reader copies from a command's output into a later `<…>`.
PRINTED = {
    "admin key": re.compile(r"admin key \(shown once, kept in [^)]*\): (\S+)"),
    "tenant id": re.compile(r"created tenant (\S+) \("),
    "operator key": re.compile(r"operator key \(shown once\): (\S+)"),
    "worker key": re.compile(r"worker key \(shown once\): (\S+)"),
    "run id": re.compile(r"triggered run (\S+)"),
}
CREATED_JOB = re.compile(r"created job (\S+) \(([^)]+)\)")
# Commands that keep running in their own terminal, and the line that says they are up.
LONG_RUNNING = {"cronwheel server": "admin key", "cronwheel worker": "cronwheel worker pool"}


@dataclass(frozen=True)
class Block:
    language: str
    text: str


def section_blocks(readme: str, heading: str) -> list[Block]:
    """The fenced ``bash`` and ``python`` blocks under ``## heading``, in order."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## )", readme, re.S | re.M)
    assert match, f"README.md has no section '## {heading}'"
    fences = re.finditer(r"^```(\w+)\n(.*?)^```$", match.group(1), re.S | re.M)
    return [Block(f.group(1), f.group(2)) for f in fences if f.group(1) in ("bash", "python")]


def commands(block: str) -> list[str]:
    """The shell commands of a block: a line ending in ``\\`` goes on the next one."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip()]


@dataclass
class Reader:
    """Someone following the section: a terminal's environment and what they saw."""

    home: Path
    port: int
    env: dict[str, str]
    seen: dict[str, str] = field(default_factory=dict)
    job_ids: dict[str, str] = field(default_factory=dict)
    background: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def learn(self, output: str) -> None:
        for what, pattern in PRINTED.items():
            for found in pattern.finditer(output):
                self.seen[what] = found.group(1)
        for found in CREATED_JOB.finditer(output):
            self.seen[f"{found.group(2)} job id"] = self.job_ids[found.group(2)] = found.group(1)

    def fill_in(self, command: str) -> str:
        def value(placeholder: re.Match[str]) -> str:
            what = placeholder.group(1)
            assert what in self.seen, (
                f"the README asks for <{what}> in `{command}`, which no earlier command "
                f"printed (seen: {sorted(self.seen)})"
            )
            return self.seen[what]

        command = re.sub(rf"\b{README_PORT}\b", str(self.port), command)
        return re.sub(r"<([^<>\n]+)>", value, command)

    def run(self, command: str) -> str:
        command = self.fill_in(command)
        for start, ready in LONG_RUNNING.items():
            if command.startswith(start):
                return self.start(start.split()[1], command, ready)
        exported = re.fullmatch(r"export (\w+)=(.*)", command)
        if exported:  # the value as the shell reads it
            name = exported.group(1)
            command = f'{command}; printf %s "${name}"'
        done = subprocess.run(
            ["bash", "-c", f"set -eo pipefail\n{command}"],
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_SECONDS,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"`{command}` exited with {done.returncode}:\n{output}"
        if exported:
            self.env[exported.group(1)] = done.stdout
        self.learn(output)
        return output

    def start(self, name: str, command: str, ready: str) -> str:
        """A command left running, as in its own terminal; returns once it says it is up."""
        log = self.home / f"{name}.log"
        with open(log, "wb") as sink:
            self.background[name] = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=self.home,
                env=self.env,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )

        def up() -> str | None:
            self.check_alive()
            output = log.read_text(errors="replace")
            return output if ready in output else None

        output: str = wait_until(
            up, COMMAND_SECONDS, what=f"`{command}` to say '{ready}'", interval=0.05
        )
        self.learn(output)
        return output

    def run_python(self, source: str) -> None:
        first = source.splitlines()[0]
        module = re.fullmatch(r"# (\w+\.py)(, continued)?", first)
        if module:  # a file the reader writes, for a later command to use
            path = self.home / module.group(1)
            with open(path, "a" if module.group(2) else "w") as out:
                out.write(source if not module.group(2) else "\n\n" + source)
            return
        script = self.home / "snippet.py"
        script.write_text(source)
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_SECONDS,
        )
        assert done.returncode == 0, f"the Python block failed:\n{source}\n{done.stderr}"
        self.learn(done.stdout)

    def check_alive(self) -> None:
        for name, proc in self.background.items():
            if proc.poll() is not None:
                log = (self.home / f"{name}.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{log}")

    def stop(self, name: str) -> int:
        """Ctrl-C in its terminal (SIGTERM), as a process manager would stop it."""
        proc = self.background.pop(name)
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[Reader]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWHEEL_")}
    bin_dir = str(Path(sys.executable).parent)  # where `cronwheel` is installed
    env.update(HOME=str(tmp_path), PATH=os.pathsep.join([bin_dir, env.get("PATH", "")]))
    env.pop("PYTHONPATH", None)
    person = Reader(home=tmp_path, port=free_port(), env=env)
    try:
        yield person
    finally:
        for name in list(person.background):
            person.stop(name)


def _summary(client: Client) -> dict[str, list[tuple[str, int, bool]]]:
    """Each job's runs: (state, attempts made, due yet)."""
    now = datetime.now(UTC)
    return {
        job["name"]: [
            (run["state"], run["attempt"], datetime.fromisoformat(run["due_at"]) <= now)
            for run in client.runs.iter(job_id=job["id"])
        ]
        for job in client.jobs.iter()
    }


def _all_succeeded(runs: list[tuple[str, int, bool]]) -> bool:
    """At least one run ended SUCCESS and every other one did too, or is not due yet
    (a recurring job's next occurrences: never tried, scheduled or dispatched ahead)."""
    return any(state == "SUCCESS" for state, _, _ in runs) and all(
        state == "SUCCESS" or (state in ("SCHEDULED", "DISPATCHED") and attempts == 0 and not due)
        for state, attempts, due in runs
    )


def test_the_readme_section_runs_as_written_and_every_job_succeeds(reader: Reader) -> None:
    blocks = section_blocks(README.read_text(), SECTION)
    assert any(b.language == "python" for b in blocks) and any(b.language == "bash" for b in blocks)
    for block in blocks:
        if block.language == "python":
            reader.run_python(block.text)
        else:
            for command in commands(block.text):
                reader.run(command)

    assert "server" in reader.background and "worker" in reader.background
    assert reader.job_ids, "the section created no job with the CLI"
    seen: dict[str, dict[str, list[tuple[str, int]]]] = {}
    with Client(reader.env["CRONWHEEL_URL"], api_key=reader.env["CRONWHEEL_API_KEY"]) as client:
        jobs = {job["id"] for job in client.jobs.iter()}
        assert set(reader.job_ids.values()) <= jobs

        def done() -> bool:
            reader.check_alive()
            seen["runs"] = _summary(client)
            return all(_all_succeeded(runs) for runs in seen["runs"].values())

        # Each look is a few requests: looked at twice a second, they stay far from the
        # key's rate limit, whose refusals would count as "not yet".
        wait_until(
            done,
            FINISH_SECONDS,
            what=lambda: f"every job to succeed; runs: {seen.get('runs')}",
            interval=0.5,
        )

    # Ctrl-C in each terminal stops them cleanly.
    assert reader.stop("worker") == 0
    assert reader.stop("server") == 0
