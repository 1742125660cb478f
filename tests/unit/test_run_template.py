"""The run template's shape is defined once (``domain/template.py``): a job spec's
template round-trips through its stored JSON, and the PostgreSQL driver's
next-occurrence statement reads exactly the template's keys."""

from __future__ import annotations

import re

import pytest

from cronwheel.domain.spec import JobSpec
from cronwheel.domain.template import JOB_ONLY, RunTemplate
from cronwheel.store.drivers import postgres_firing

SPEC = {
    "name": "report",
    "schedule": {"cron": "0 * * * *"},
    "task": "reports.build",
    "payload": {"day": 1},
    "pool": "batch",
    "requires": ["gpu"],
    "tags": ["red"],
    "route_tags": ["eu", "ssd"],
    "priority": 1,
    "timeout": 60,
    "progress_timeout": 30,
}


def test_a_specs_template_round_trips_through_its_json() -> None:
    spec = JobSpec.model_validate(SPEC)
    template = RunTemplate.of(spec)
    assert template.to_json() == spec.model_dump(mode="json", exclude={"name", "schedule"})
    assert RunTemplate.from_json(template.to_json()) == template
    assert (template.pool, template.max_attempts, template.progress_timeout) == (
        "batch",
        spec.retry.max_attempts,
        30.0,
    )
    assert template.with_payload({"day": 2, "x": 1}).payload == {"day": 2, "x": 1}
    assert template.payload == {"day": 1}  # with_payload makes a new template


def test_a_template_stored_before_progress_timeouts_reads() -> None:
    data = RunTemplate.of(JobSpec.model_validate(SPEC)).to_json()
    del data["progress_timeout"]
    assert RunTemplate.from_json(data).progress_timeout is None


@pytest.mark.parametrize(
    "key", ["payload", "pool", "priority", "retry", "timeout", "tags", "route_tags"]
)
def test_a_field_the_stored_json_lacks_takes_the_specs_default(key: str) -> None:
    data = RunTemplate.of(JobSpec.model_validate(SPEC)).to_json()
    del data[key]
    bare = {"name": "d", "schedule": {"asap": True}, "task": "t"}
    defaults = RunTemplate.of(JobSpec.model_validate(bare))
    assert getattr(RunTemplate.from_json(data), key) == getattr(defaults, key)


def test_the_postgres_next_occurrence_statement_reads_the_templates_keys() -> None:
    # The fields an override may set are read through ``o.f``: the job's template, or
    # what its future overrides make of it.
    read = set(re.findall(r"(?:template|o\.f)->>?'(\w+)'", postgres_firing._PLANNED))
    # Fields read from the job itself (the lateness budget) are not copied into runs.
    assert read == set(RunTemplate.__dataclass_fields__) - JOB_ONLY
