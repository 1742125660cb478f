"""The fuzz run's size in the terminal summary: how many requests each backend got."""

from __future__ import annotations

import pytest

from .harness import FUZZ_RESULTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    results = terminalreporter.config.stash.get(FUZZ_RESULTS, [])
    for backend, cases, steps, served, seconds in results:
        terminalreporter.write_line(
            f"API fuzzing ({backend}): {cases} generated requests in {seconds:.1f} s; "
            f"{steps} of them steps of stateful scenarios, {served} served with a 2xx"
        )
