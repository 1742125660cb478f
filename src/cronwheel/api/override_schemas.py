"""Bodies of ``/v1/jobs/{id}/overrides`` and ``/v1/runs/{id}/overrides``
(``domain/overrides.py``). The rules of the API's other bodies hold
(``api/schemas.py``)."""

from __future__ import annotations

import uuid
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from cronwheel.api.schemas import RequestModel, ResponseModel, UtcInstant
from cronwheel.domain.bounds import TIMEOUT_MAX, Integer, Label, Seconds
from cronwheel.domain.overrides import Override

__all__ = ["OverrideIn", "OverrideList", "OverrideOut", "RunOverrideIn", "override_out"]

_PAYLOAD = (
    "a JSON merge-patch (RFC 7396) over the run's payload: each key given replaces the "
    "payload's, an object merges into an object, `null` removes the key"
)


class RunOverrideIn(RequestModel):
    payload: dict[str, Any] | None = Field(default=None, description=_PAYLOAD)
    timeout: Seconds | None = Field(default=None, gt=0, le=TIMEOUT_MAX)
    priority: Integer | None = Field(default=None, ge=0, le=3)
    pool: Label | None = None
    reason: str | None = Field(
        default=None, max_length=1000, description="why: kept with the override, in the "
        "runs' history and in the audit trail",
    )  # fmt: skip

    @model_validator(mode="after")
    def _no_nulls(self) -> Self:
        """A field sent as null would be accepted and do nothing: refused, as any
        value the API would ignore."""
        for name in ("payload", "timeout", "priority", "pool"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(
                    f"{name}: null sets nothing; leave the field out to keep the run's "
                    "own (to remove a payload key, send it as null inside payload)"
                )
        return self


class OverrideIn(RunOverrideIn):
    scope: Literal["next", "future"] = Field(
        description="`next`: the job's next occurrence only (bound to it now, consumed "
        "when it starts); `future`: every run of the job not started yet and every one "
        "made until the override is removed. A single run's override is made at "
        "`POST /v1/runs/{id}/overrides`"
    )


class OverrideOut(ResponseModel):
    id: uuid.UUID
    job_id: uuid.UUID
    run_id: uuid.UUID | None = Field(description="the run a `run` or `next` override is bound to")
    scope: str = Field(description="run | next | future")
    status: str = Field(
        description="active; consumed (its run started or ended: it keeps it); removed"
    )
    payload: dict[str, Any] | None = Field(description=_PAYLOAD)
    timeout: float | None
    priority: int | None
    pool: str | None
    reason: str | None
    created_by: str | None
    created_at: UtcInstant
    removed_by: str | None
    removed_at: UtcInstant | None
    runs: list[uuid.UUID] | None = Field(
        default=None,
        description="in the answer to a change: the runs not started yet it changed now",
    )


class OverrideList(ResponseModel):
    items: list[OverrideOut] = Field(description="in the merge order")


def override_out(o: Override, runs: list[uuid.UUID] | None = None) -> OverrideOut:
    return OverrideOut(
        id=o.id,
        job_id=o.job_id,
        run_id=o.run_id,
        scope=o.scope.value,
        status=o.status,
        payload=o.payload,
        timeout=o.timeout,
        priority=o.priority,
        pool=o.pool,
        reason=o.reason,
        created_by=o.created_by,
        created_at=o.created_at,
        removed_by=o.removed_by,
        removed_at=o.removed_at,
        runs=runs,
    )
