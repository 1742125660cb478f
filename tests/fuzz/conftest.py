"""The fuzz run's size, for the terminal summary the root conftest prints: how many
requests each backend got, summed over the pytest-xdist processes that ran them."""

from __future__ import annotations

import pytest

from .harness import FUZZ_RESULTS


def pytest_sessionfinish(session: pytest.Session) -> None:
    results = [list(r) for r in session.config.stash.get(FUZZ_RESULTS, [])]
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # a pytest-xdist process: its controller prints them
        output["cronwheel_fuzz"] = results
    else:
        session.config.cronwheel_fuzz = results  # type: ignore[attr-defined]
