"""Editing a job: the one path from a patch to what the store applies, as
``new_job.py`` is for a new job.

A patch is a partial job — any of the fields a job is created with (:class:`JobSpec`)
— merged over the job at the top level, JSON merge-patch style (:func:`patched`): a
field given replaces the job's whole (``schedule``, ``payload``, ``retry``, ``webhook``
alike: nothing is merged inside them), and ``null`` sets it back to its default, as if
it had been left out at creation. The result is validated as a new job is, with the
same messages, before anything is stored.

What changes decides what becomes of the job's *pending occurrence* (its SCHEDULED run
not yet tried, the one ``next_due_at`` shows; ``store/sql/edits.py`` applies it)::

    occurrences  the schedule but its policies, spread ──▶ moved to the new schedule's
                                                           next occurrence from now
    policies     catch_up, catch_up_window, overlap   ──▶ nothing: read when runs fire
    lateness_budget                                   ──▶ nothing: read by the missed-run
                                                          check (docs/alerts.md)
    template     the name and every other field       ──▶ its columns rewritten in place

A one-off job stays one-off (``at``, ``delay``, ``asap``) and a recurring one
recurring (``cron``, ``interval``): a job's runs and history are those of one kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cronwheel.domain.audit import changed
from cronwheel.domain.errors import IllegalTransitionError, ValidationError
from cronwheel.domain.model import Job, NewJob
from cronwheel.domain.new_job import JobLimits, check_json_size, new_job
from cronwheel.domain.spec import (
    ONE_OFF_KINDS,
    WEBHOOK_CAPABILITY,
    JobSpec,
    redact_webhook,
    schedule_kind,
)
from cronwheel.domain.states import JobState
from cronwheel.domain.template import RunTemplate

__all__ = [
    "EDITABLE",
    "JobEdit",
    "check_editable",
    "job_changes",
    "job_edit",
    "patched",
    "spec_json",
]

EDITABLE: tuple[str, ...] = tuple(JobSpec.model_fields)
"""The fields a patch may name: every field a job is created with."""

# A recurring schedule's fields that say what to do when a run fires, not when it is
# due: read from the job at each firing, so changing them moves no run.
_POLICIES = frozenset({"catch_up", "catch_up_window", "overlap"})
# Fields of the job read from the job itself, never copied into its runs: changing them
# rewrites no run (the lateness budget is read by the missed-run check).
_JOB_ONLY = frozenset({"lateness_budget"})


@dataclass(frozen=True, slots=True)
class JobEdit:
    """An edit of a job, resolved: what the store applies in one transaction, only
    while the job is still at ``version``."""

    version: int  # the version of the job the edit was made from
    spec: JobSpec  # the job as it becomes
    before: dict[str, Any]  # the fields that change, as they were (:func:`job_changes`)
    after: dict[str, Any]  # and as they become
    # When the job's occurrences change: the first as of the edit (due instant, its
    # local form, the wall times a DST gap skips before it), as a new job's would be.
    occurrence: NewJob | None = None
    # Whether its runs' template columns (or the job's name they copy) change.
    rewrites: bool = False

    @property
    def template(self) -> RunTemplate:
        return RunTemplate.of(self.spec)

    @property
    def changes_nothing(self) -> bool:
        return not self.after and not self.before


def spec_json(job: Job) -> dict[str, Any]:
    """The job as the fields it was created with, in JSON: its name, stored schedule
    and template."""
    return {"name": job.name, "schedule": dict(job.schedule), **job.template.to_json()}


def patched(current: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``patch`` merged over ``current`` (a job's JSON, :func:`spec_json`) at the top
    level: a field given replaces the job's, ``None`` removes it (its default applies).
    A webhook job's implied ``webhook`` capability goes with its webhook, unless the
    patch names ``requires`` itself."""
    out = dict(current)
    for name, value in patch.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    dropped = current.get("webhook") is not None and out.get("webhook") is None
    if dropped and "requires" not in patch:
        out["requires"] = [r for r in out.get("requires", []) if r != WEBHOOK_CAPABILITY]
    return out


def job_changes(
    before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields of a job that differ between ``before`` and ``after`` (each a job's
    JSON), each side with only those, as the job's history and the audit trail keep
    them: a webhook's header values hidden (they are write-only)."""
    old, new = changed(dict(before), dict(after))
    for side in (old, new):
        if side.get("webhook") is not None:
            side["webhook"] = redact_webhook(side["webhook"])
    return old, new


def check_editable(job: Job) -> None:
    """Refuse (409) to edit a job that is over: only an active or paused job can be; and
    a workflow (its DAG is what its runs are made of: create a new workflow instead)."""
    if job.workflow is not None:
        raise IllegalTransitionError(
            f"job {job.id} is a workflow: a workflow cannot be edited; create a new one "
            "(and cancel or delete this one)",
            source=job.state.value,
            target="edited",
        )
    if job.state not in (JobState.ACTIVE, JobState.PAUSED):
        raise IllegalTransitionError(
            f"job {job.id} is {job.state.value} and cannot be edited",
            source=job.state.value,
            target="edited",
        )


def _occurrences(schedule: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schedule.items() if k not in _POLICIES}


def job_edit(job: Job, spec: JobSpec, *, now: datetime, limits: JobLimits) -> JobEdit:
    """The edit that makes ``job`` into ``spec`` (the patched job, validated), at
    ``now`` (the database clock's instant): checked as a new job is — the payload's
    size, and, when its occurrences change, the new schedule's first due instant and
    its spread — or :class:`ValidationError` naming the field."""
    current = spec_json(job)
    wanted = spec.model_dump(mode="json")
    differs = {name for name, value in wanted.items() if current.get(name) != value}
    if (schedule_kind(spec.schedule) in ONE_OFF_KINDS) != (job.kind in ONE_OFF_KINDS):
        raise ValidationError(
            "schedule: a one-off job (at, delay, asap) stays one-off and a recurring one "
            f"(cron, interval) recurring; this job is {job.kind}: create a new job instead",
            field="schedule",
        )
    if "payload" in differs:
        check_json_size(spec.payload, limit=limits.max_payload_bytes, field="payload")
    occurrence = None
    if "spread" in differs or _occurrences(current["schedule"]) != _occurrences(wanted["schedule"]):
        # The first occurrence as a job created now would have it, checked the same way.
        occurrence = new_job(spec, now=now, limits=limits)
    before, after = job_changes(current, wanted)
    return JobEdit(
        version=job.version,
        spec=spec,
        before=before,
        after=after,
        occurrence=occurrence,
        rewrites=bool(differs - {"schedule", "spread"} - _JOB_ONLY),
    )
