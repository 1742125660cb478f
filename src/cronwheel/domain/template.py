"""The run template: what every run of a job is made from, the one place its shape is
defined.

A job stores it as JSON (``jobs.template``); each new run copies it into its own
columns, so leasing needs no join with the job. The PostgreSQL driver reads the same
keys inside its next-occurrence statement; a test holds that statement to the fields
below.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel

from cronwheel.domain.spec import JobSpec

__all__ = ["JOB_ONLY", "RunTemplate"]


@dataclass(frozen=True, slots=True)
class RunTemplate:
    task: str | None
    webhook: dict[str, Any] | None
    payload: dict[str, Any]
    pool: str
    requires: list[str]
    tags: list[str]
    priority: int
    retry: dict[str, Any]  # a RetryPolicy's JSON; ``max_attempts`` is always there
    timeout: float
    heartbeat_timeout: float
    progress_timeout: float | None = None  # absent from jobs stored before it existed
    # A worker leases the runs only when its tags include all of these.
    route_tags: list[str] = field(default_factory=list)  # absent from older jobs too
    # Seconds each run's fire time may follow its due instant (``timing.spread``).
    spread: float = 0.0  # absent from jobs stored before it existed
    # Seconds a run may go undispatched past its fire time (missed-run detection).
    # Read from the job when the scheduler looks for missed runs: not copied into runs.
    lateness_budget: float = 30.0  # absent from jobs stored before it existed

    @classmethod
    def of(cls, spec: JobSpec) -> RunTemplate:
        """The template of a validated job spec."""
        return cls.of_spec_json(spec.model_dump(mode="json"))

    @classmethod
    def of_spec_json(cls, data: Mapping[str, Any]) -> RunTemplate:
        """The template of a validated job spec from its whole JSON
        (``spec.model_dump(mode="json")``), which a caller may need for more."""
        # Every field is the spec's own: its JSON is the template as is (half the time
        # of filling defaults in, which only a stored one may lack). The whole JSON is
        # cheaper than the template's fields alone: a selective dump costs twice.
        return cls(*_VALUES(data))

    @staticmethod
    def json_of_spec_json(data: Mapping[str, Any]) -> dict[str, Any]:
        """``of_spec_json(data).to_json()``, without the template in between."""
        return dict(zip(_FIELDS, _VALUES(data), strict=True))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunTemplate:
        """The template as stored. A field the JSON lacks (a job stored before the field
        existed, or written by hand) takes the job spec's default, as a new job would."""
        values = {name: data[name] if name in data else _DEFAULTS[name] for name in _FIELDS}
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        # Shallow: the values are JSON already, and never changed in place.
        return {name: getattr(self, name) for name in _FIELDS}

    def with_payload(self, extra: Mapping[str, Any] | None) -> RunTemplate:
        """The same template, ``extra`` merged over its payload (a triggered run's)."""
        return replace(self, payload={**self.payload, **(extra or {})})

    @property
    def max_attempts(self) -> int:
        return int(self.retry["max_attempts"])


def _default(name: str) -> Any:
    value = JobSpec.model_fields[name].get_default(call_default_factory=True)
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


_FIELDS = tuple(RunTemplate.__dataclass_fields__)
JOB_ONLY: frozenset[str] = frozenset({"lateness_budget"})
"""Template fields read from the job itself, never copied into a run's columns."""
_VALUES = operator.itemgetter(*_FIELDS)  # a spec JSON's template values, in order
_DEFAULTS: dict[str, Any] = {name: _default(name) for name in _FIELDS}
