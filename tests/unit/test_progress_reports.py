"""The worker's side of progress reports, without a server: what ``ctx.heartbeat`` keeps,
refuses, and hands to the next beat."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from cronwheel.domain.progress import PROGRESS_DETAILS_DEPTH_MAX, PROGRESS_DETAILS_MAX_BYTES
from cronwheel.worker.progress import ProgressReport, UnsentProgress, heartbeats
from cronwheel.worker.protocol import Heartbeat, Lease

NOW = datetime(2031, 3, 4, 12, 0, tzinfo=UTC)


def lease(attempt_id: str, **fields: Any) -> Lease:
    body: dict[str, Any] = {
        "attempt_id": attempt_id,
        "run_id": "r",
        "fencing_token": 7,
        "lease_expires_at": NOW.isoformat(),
        "deadline": NOW.isoformat(),
        **fields,
    }
    return Lease.from_json(body)


def test_the_last_report_wins_and_a_failed_beat_gives_it_back() -> None:
    unsent = UnsentProgress()
    assert unsent.take() is None
    unsent.put({"step": 1})
    unsent.put({"step": 2})
    report = unsent.take()
    assert report == ProgressReport({"step": 2})
    assert unsent.take() is None
    # The beat carrying it failed: it goes with the next one ...
    assert report is not None
    unsent.restore(report)
    assert unsent.take() == report
    # ... unless the handler reported again meanwhile.
    unsent.put({"step": 3})
    unsent.restore(report)
    assert unsent.take() == ProgressReport({"step": 3})


def test_details_must_be_small_json() -> None:
    unsent = UnsentProgress()
    unsent.put(None)
    assert unsent.take() == ProgressReport(None)
    unsent.put(("a", NOW))  # made JSON-ready as results are
    assert unsent.take() == ProgressReport(["a", "2031-03-04T12:00:00Z"])
    with pytest.raises(TypeError, match="JSON"):
        unsent.put(object())
    with pytest.raises(ValueError, match=str(PROGRESS_DETAILS_MAX_BYTES)):
        unsent.put("x" * PROGRESS_DETAILS_MAX_BYTES)
    # What the server's strict JSON would refuse, and with it the whole batch of beats.
    with pytest.raises(ValueError, match=r"details\.rate: is not a finite number"):
        unsent.put({"rate": float("nan")})
    with pytest.raises(ValueError, match="NUL"):
        unsent.put(["ok", "bad\x00"])
    deep: Any = "leaf"
    for _ in range(PROGRESS_DETAILS_DEPTH_MAX + 1):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper"):
        unsent.put(deep)
    assert unsent.take() is None  # nothing refused is kept


def test_beats_carry_reports_only_to_servers_that_take_them() -> None:
    new = lease("a", progress_timeout=2)
    plain = lease("b", progress_timeout=None)
    old = lease("c")  # a server before progress reports names no progress_timeout
    assert (new.progress_timeout, new.takes_progress) == (2.0, True)
    assert (plain.progress_timeout, plain.takes_progress) == (None, True)
    assert (old.progress_timeout, old.takes_progress) == (None, False)
    pending = [UnsentProgress() for _ in range(3)]
    for unsent in pending:
        unsent.put({"n": 1})
    beats, taken = heartbeats(zip((new, plain, old), pending, strict=True))
    assert beats == [
        Heartbeat("a", 7, True, {"n": 1}),
        Heartbeat("b", 7, True, {"n": 1}),
        Heartbeat("c", 7),
    ]
    assert [unsent for unsent, _ in taken] == pending[:2]
    assert beats[2].to_json() == {"attempt_id": "c", "fencing_token": 7}
    assert beats[0].to_json() == {
        "attempt_id": "a",
        "fencing_token": 7,
        "progress": True,
        "details": {"n": 1},
    }
    assert Heartbeat("a", 7, True).to_json() == {
        "attempt_id": "a",
        "fencing_token": 7,
        "progress": True,
    }
