"""``new_job``: the one path from a spec to what the store creates (API, bench, tools)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from cronwheel.domain.audit import Actor
from cronwheel.domain.errors import CronwheelError, PayloadTooLargeError
from cronwheel.domain.new_job import JobLimits, check_json_size, new_job
from cronwheel.domain.spec import JobSpec

NOW = datetime(2026, 3, 7, 12, 0, tzinfo=UTC)


def _spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "task": "t", **fields})


def test_the_first_due_instant_and_its_local_time() -> None:
    made = new_job(
        _spec(schedule={"cron": "30 9 * * *", "timezone": "Europe/Paris"}),
        now=NOW,
        limits=JobLimits(),
        actor=Actor("api:key"),
        idempotency_key="k",
    )
    assert made.first_due_at == datetime(2026, 3, 8, 8, 30, tzinfo=UTC)
    assert made.due_local == "2026-03-08T09:30:00+01:00"
    assert (made.actor, made.idempotency_key, made.skipped) == (Actor("api:key"), "k", ())


def test_the_wall_times_a_gap_skips_before_the_first_run_are_listed() -> None:
    # 02:30 does not exist in New York on 2026-03-08 (spring forward).
    spec = _spec(
        schedule={"cron": "30 2 * * *", "timezone": "America/New_York", "on_nonexistent": "skip"}
    )
    made = new_job(spec, now=NOW, limits=JobLimits())
    assert [s.due_local for s in made.skipped] == ["2026-03-08T02:30:00"]
    assert made.first_due_at is not None and made.first_due_at > made.skipped[0].due_at


def test_the_limits_hold() -> None:
    big = _spec(schedule={"asap": True}, payload={"x": "y" * 2000})
    with pytest.raises(PayloadTooLargeError):
        new_job(big, now=NOW, limits=JobLimits(max_payload_bytes=1024))
    far = _spec(schedule={"at": (NOW + timedelta(days=10)).isoformat()})
    with pytest.raises(CronwheelError):
        new_job(far, now=NOW, limits=JobLimits(max_horizon=timedelta(days=5)))
    past = _spec(schedule={"at": (NOW - timedelta(seconds=60)).isoformat()})
    with pytest.raises(CronwheelError):
        new_job(past, now=NOW, limits=JobLimits(past_grace=timedelta(seconds=10)))
    assert new_job(past, now=NOW, limits=JobLimits(past_grace=timedelta(seconds=120)))


@pytest.mark.parametrize(
    "payload",
    [
        {"f": [1e-7] * 100},  # ``json`` writes 1e-07, a character more than orjson
        {"n": 2**70},  # past 64 bits: orjson cannot write it
        {"s": "é☃\n" * 60},
    ],
)
def test_the_payload_is_measured_as_json_writes_it(payload: dict[str, object]) -> None:
    size = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())
    check_json_size(payload, limit=size, field="payload")
    with pytest.raises(PayloadTooLargeError, match=f"payload is {size} bytes of JSON"):
        check_json_size(payload, limit=size - 1, field="payload")
