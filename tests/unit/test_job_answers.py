"""The answers to creating jobs are written from plain values (``job_fields``), not
through the response model: they must say exactly what the model would, byte for
byte."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from asyncpg.pgproto.pgproto import UUID as AsyncpgUUID

from cronwheel.api.routers.jobs import fields_answer, job_fields, job_out
from cronwheel.api.schemas import JobList, JobOut
from cronwheel.domain.model import Job
from cronwheel.domain.spec import JobSpec
from cronwheel.domain.states import JobState
from cronwheel.domain.template import RunTemplate

_ID = uuid.UUID("01a23c18-6175-75b5-a43c-82fd1b7220dc")
_RUN = uuid.UUID("01a23c18-6175-75b5-a43c-82fd1b7220dd")
_AT = datetime(2026, 12, 3, 13, 29, 18, 600311, tzinfo=UTC)


def _job(spec: dict[str, Any], **changes: Any) -> Job:
    fields: dict[str, Any] = {
        "id": _ID,
        "tenant_id": uuid.uuid4(),
        "name": spec["name"],
        "state": JobState.ACTIVE,
        "kind": next(iter(spec["schedule"])),
        "schedule": spec["schedule"],
        "template": RunTemplate.of(JobSpec.model_validate(spec)),
        "version": 1,
        "next_due_at": _AT + timedelta(minutes=1),
        "created_at": _AT,
        "updated_at": _AT,
        "idempotency_key": None,
    }
    return Job(**(fields | changes))


_JOBS = [
    _job({"name": "plain", "schedule": {"delay": 60}, "task": "t", "payload": {"n": 1}}),
    _job(
        {
            "name": "webhook",
            "schedule": {"cron": "*/5 * * * *", "timezone": "Europe/Paris"},
            "webhook": {"url": "https://example.com/x", "headers": {"X-Token": "secret"}},
            "payload": {"s": "é\u2028", "f": 0.1, "nested": {"a": [1, None, True]}},
            "tags": ["a", "b"],
            "route_tags": ["eu"],
            "priority": 0,
            "timeout": 30,
            "spread": 1.5,
        },
        idempotency_key="key-1",
        next_due_at=None,
    ),
    _job(
        {"name": "progress", "schedule": {"asap": True}, "task": "t", "progress_timeout": 5},
        # An instant in another zone, a whole second, and asyncpg's own UUID type.
        created_at=_AT.replace(microsecond=0).astimezone(timezone(timedelta(hours=5))),
        tenant_id=AsyncpgUUID(_ID.bytes),
    ),
    # Past 64 bits: orjson refuses it, the model writes it.
    _job({"name": "big", "schedule": {"delay": 1}, "task": "t", "payload": {"big": 2**70}}),
]


@pytest.mark.parametrize("job", _JOBS, ids=lambda j: j.name)
def test_a_created_job_is_answered_as_its_model_writes_it(job: Job) -> None:
    answer = fields_answer(job_fields(job, first_run_id=_RUN), JobOut, 201)
    expected = job_out(job, first_run_id=_RUN).model_dump_json()
    # Byte for byte: the same keys in the same order, instants in UTC with Z, floats
    # written as floats.
    assert answer.body == expected.encode()
    assert answer.status_code == 201 and answer.media_type == "application/json"


def test_a_batch_is_answered_as_its_model_writes_it() -> None:
    answer = fields_answer(
        {"items": [job_fields(j) for j in _JOBS], "next_cursor": None}, JobList, 201
    )
    expected = JobList(items=[job_out(j) for j in _JOBS], next_cursor=None).model_dump_json()
    assert answer.body == expected.encode()
