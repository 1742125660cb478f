"""Progress reports in the worker protocol: the fields a heartbeat carries when the
handler reported progress (``ctx.heartbeat(details)`` in the SDK), on the single
heartbeat and on each heartbeat of a batch alike."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from cronwheel.domain.bounds import Flag
from cronwheel.domain.progress import PROGRESS_DETAILS_MAX_BYTES, details_size

__all__ = ["ProgressReport"]


class ProgressReport(BaseModel):
    """Mixed into a heartbeat's body: ``progress`` and ``details``."""

    progress: Flag = Field(
        default=False,
        description="the handler reported progress since the last beat: the attempt "
        "records the time and `details`, and under the job's `progress_timeout` its "
        "progress deadline moves to now plus that timeout. Implied by `details`.",
    )
    details: Any = Field(
        default=None,
        description="the report's details: any JSON up to "
        f"{PROGRESS_DETAILS_MAX_BYTES} bytes (compact, UTF-8; larger is refused, never "
        "cut). They replace the attempt's last ones and show in `GET /v1/runs/{id}`.",
    )

    @field_validator("details")
    @classmethod
    def _details(cls, value: Any) -> Any:
        size = details_size(value)
        if size > PROGRESS_DETAILS_MAX_BYTES:
            raise ValueError(f"{size} bytes of JSON; the limit is {PROGRESS_DETAILS_MAX_BYTES}")
        return value

    @property
    def reports_progress(self) -> bool:
        return self.progress or self.details is not None
