"""An edit, resolved without I/O: the merge, the recorded difference, what the edit
changes of the job's runs, the If-Match header, and the columns a rewrite writes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronwheel.api.routers.job_edit import if_match_version
from cronwheel.domain.errors import (
    IllegalTransitionError,
    PayloadTooLargeError,
    ValidationError,
)
from cronwheel.domain.job_edit import (
    EDITABLE,
    JobEdit,
    check_editable,
    job_changes,
    job_edit,
    patched,
    spec_json,
)
from cronwheel.domain.model import Job
from cronwheel.domain.new_job import JobLimits
from cronwheel.domain.spec import JobSpec, schedule_kind
from cronwheel.domain.states import JobState
from cronwheel.domain.template import RunTemplate
from cronwheel.store.rows import RUN_TEMPLATE_COLUMNS, new_run_row, run_template_values

T0 = datetime(2031, 3, 4, 12, 0, tzinfo=UTC)
LIMITS = JobLimits(max_payload_bytes=100)


def _job(state: JobState = JobState.ACTIVE, **fields: Any) -> Job:
    spec = JobSpec.model_validate(
        {"name": "j", "schedule": {"cron": "0 * * * *"}, "task": "t", **fields}
    )
    dumped = spec.model_dump(mode="json")
    return Job(
        id=uuid.uuid4(),
        tenant_id=uuid.uuid4(),
        name=spec.name,
        state=state,
        kind=schedule_kind(spec.schedule),
        schedule=dumped["schedule"],
        template=RunTemplate.of(spec),
        version=3,
        next_due_at=T0,
        created_at=T0,
        updated_at=T0,
    )


def _edit(job: Job, **patch: Any) -> JobEdit:
    spec = JobSpec.model_validate(patched(spec_json(job), patch))
    return job_edit(job, spec, now=T0, limits=LIMITS)


def test_every_field_a_job_is_created_with_is_editable() -> None:
    assert set(EDITABLE) == set(JobSpec.model_fields)
    assert set(spec_json(_job())) == set(EDITABLE)


def test_a_patch_replaces_fields_whole_and_null_removes_them() -> None:
    current = {"name": "j", "payload": {"a": 1, "b": 2}, "tags": ["x"], "task": "t"}
    assert patched(current, {"payload": {"a": 9}, "tags": None}) == {
        "name": "j",
        "payload": {"a": 9},
        "task": "t",
    }
    hooked = {"webhook": {"url": "https://x"}, "requires": ["gpu", "webhook"]}
    # The webhook capability goes with the webhook, unless requires is given too.
    assert patched(hooked, {"webhook": None, "task": "t"})["requires"] == ["gpu"]
    assert patched(hooked, {"webhook": None, "requires": ["webhook"]})["requires"] == ["webhook"]
    assert patched(hooked, {"payload": {}})["requires"] == ["gpu", "webhook"]


def test_the_difference_holds_only_what_changed_and_hides_header_values() -> None:
    before = {"pool": "a", "priority": 1, "webhook": {"url": "u", "headers": {"K": "old"}}}
    after = {"pool": "b", "priority": 1, "webhook": {"url": "u", "headers": {"K": "new"}}}
    old, new = job_changes(before, after)
    assert old == {"pool": "a", "webhook": {"url": "u", "headers": {"K": "[redacted]"}}}
    assert new == {"pool": "b", "webhook": {"url": "u", "headers": {"K": "[redacted]"}}}
    assert job_changes(before, before) == ({}, {})


def test_what_an_edit_changes_of_the_runs() -> None:
    job = _job()
    template = _edit(job, payload={"a": 1}, name="n2")
    assert (template.occurrence, template.rewrites) == (None, True)
    assert template.before == {"payload": {}, "name": "j"}
    policy = _edit(job, schedule={**job.schedule, "catch_up": "skip", "overlap": "skip"})
    assert (policy.occurrence, policy.rewrites) == (None, False)
    assert set(policy.after) == {"schedule"}
    moved = _edit(job, schedule={"cron": "30 * * * *"})
    assert moved.occurrence is not None and not moved.rewrites
    assert moved.occurrence.first_due_at == T0 + timedelta(minutes=30)
    spread = _edit(job, spread=10)
    assert spread.occurrence is not None and spread.occurrence.first_due_at == T0
    assert spread.version == 3 and spread.template.spread == 10
    same = _edit(job, schedule=dict(job.schedule), pool="default")
    assert same.changes_nothing and same.occurrence is None


def test_what_a_new_job_could_not_be_an_edit_cannot_make() -> None:
    job = _job()
    with pytest.raises(ValidationError) as info:
        _edit(job, schedule={"at": "2031-03-05T00:00:00Z"})
    assert info.value.field == "schedule" and "one-off" in info.value.message
    with pytest.raises(PayloadTooLargeError):
        _edit(job, payload={"x": "y" * 200})
    with pytest.raises(ValidationError) as info:
        _edit(job, spread=3600)  # not shorter than the hourly schedule's interval
    assert info.value.field == "spread"
    one_off = _job(schedule={"at": "2031-03-04T13:00:00Z"})
    with pytest.raises(ValidationError) as info:
        _edit(one_off, schedule={"interval": 60})
    assert info.value.field == "schedule"
    # A payload over a limit lowered since is no reason to refuse another change.
    big = _job(payload={"x": "y" * 200})
    assert _edit(big, pool="p").rewrites


def test_only_active_and_paused_jobs_are_editable() -> None:
    for state in (JobState.ACTIVE, JobState.PAUSED):
        check_editable(_job(state))
    for state in (JobState.CANCELLED, JobState.FINISHED):
        with pytest.raises(IllegalTransitionError) as info:
            check_editable(_job(state))
        assert info.value.status == 409 and state.value in info.value.message


@pytest.mark.parametrize(
    ("header", "version"),
    [(None, None), ("*", None), (" * ", None), ("3", 3), ('"3"', 3), (' "12" ', 12)],
)
def test_if_match_names_a_version(header: str | None, version: int | None) -> None:
    assert if_match_version(header) == version


@pytest.mark.parametrize(
    "header", ['W/"3"', '"3", "4"', "three", "-1", "", '""', "\uff13", "9" * 19]
)
def test_if_match_that_names_no_version_is_refused(header: str) -> None:
    with pytest.raises(ValidationError) as info:
        if_match_version(header)
    assert info.value.field == "If-Match"


def test_a_rewrite_writes_the_columns_a_new_run_copies() -> None:
    template = _job(payload={"a": 1}, pool="p", priority=0, retry={"max_attempts": 4}).template
    row = new_run_row(
        run_id=uuid.uuid4(),
        tenant_id=uuid.uuid4(),
        job_id=uuid.uuid4(),
        name="named",
        template=template,
        due_at=T0,
        due_local=None,
        shard=0,
        at=T0,
    )
    values = run_template_values("named", template)
    assert set(values) == set(RUN_TEMPLATE_COLUMNS)
    assert values == {c: row[c] for c in RUN_TEMPLATE_COLUMNS}
