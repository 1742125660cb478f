"""The run template: what every run of a job is made from, the one place its shape is
defined.

A job stores it as JSON (``jobs.template``); each new run copies it into its own
columns, so leasing needs no join with the job. The PostgreSQL driver reads the same
keys inside its next-occurrence statement; a test holds that statement to the fields
below.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cronwheel.domain.spec import JobSpec

__all__ = ["RunTemplate"]


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

    @classmethod
    def of(cls, spec: JobSpec) -> RunTemplate:
        """The template of a validated job spec."""
        data = spec.model_dump(mode="json", exclude={"name", "schedule"})
        return cls.from_json(data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunTemplate:
        """The template as stored. A key the template needs and the JSON lacks raises
        ``KeyError`` (a row no version wrote: the scheduler quarantines its run)."""
        return cls(
            task=data.get("task"),
            webhook=data.get("webhook"),
            payload=data["payload"],
            pool=data["pool"],
            requires=list(data["requires"]),
            tags=list(data["tags"]),
            priority=data["priority"],
            retry=data["retry"],
            timeout=data["timeout"],
            heartbeat_timeout=data["heartbeat_timeout"],
            progress_timeout=data.get("progress_timeout"),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def with_payload(self, extra: Mapping[str, Any] | None) -> RunTemplate:
        """The same template, ``extra`` merged over its payload (a triggered run's)."""
        return replace(self, payload={**self.payload, **(extra or {})})

    @property
    def max_attempts(self) -> int:
        return int(self.retry["max_attempts"])
