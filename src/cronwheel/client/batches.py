"""Creating many jobs: ``jobs.create_many`` of both clients, planned here without I/O.

The jobs go in chunks of at most 1,000 (``POST /v1/jobs/batch``, one transaction
each). A chunk is all or nothing on the server, so one bad job must not take its
neighbours down unseen: when the API refuses a chunk naming jobs in it (``jobs.3.…``:
a 422 lists every invalid field, or names the first job refused once validated), those
jobs get their own errors and the rest of the chunk is sent again, until it is stored
or empty. An error that names no job (the tenant's ``max_pending_runs``, a lost
connection) is every job of the chunk's::

    chunk ──▶ 201 ─────────────────────────────▶ each job's answer, in order
          └─▶ error naming jobs i, j … ─▶ i, j … get it; the others again ─▶ …
          └─▶ error naming none ────────▶ each job of the chunk gets it

Only the chunk the errors named is sent again; a chunk is never half stored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic_core import to_jsonable_python

from cronwheel.client.base import read_items
from cronwheel.client.calls import Call, Json
from cronwheel.client.errors import ApiError

__all__ = ["CHUNK_MAX", "CreateMany", "CreatedMany"]

CHUNK_MAX = 1000  # jobs per POST /v1/jobs/batch, the API's bound

_ITEM = re.compile(r"^jobs\.(\d+)(?:\.(.*))?$")


@dataclass
class CreatedMany:
    """What ``create_many`` did, job by job in the order given: ``jobs[i]`` is the
    job created for the i-th input (as ``jobs.create`` answers it), or None when that
    one failed, and then ``errors[i]`` says why (its ``field`` relative to the job,
    e.g. ``schedule.at``). An error that is not the job's own — a lost connection, the
    tenant's ``max_pending_runs`` — is given to every job of the chunk it hit; after a
    lost connection (``status`` 0) those jobs may or may not have been stored."""

    jobs: list[Json | None]
    errors: dict[int, ApiError] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_for_errors(self) -> None:
        """Raise the first job's error, if any failed."""
        if self.errors:
            index = min(self.errors)
            error = self.errors[index]
            raise ApiError(
                error.status,
                error.code,
                f"job {index} of {len(self.jobs)}: {error.message} "
                f"({len(self.errors)} of them failed)",
                None if error.field is None else f"jobs.{index}.{error.field}",
            )


class CreateMany:
    """The requests of one ``create_many`` and what their answers mean. Call
    :meth:`next_call`, send it, then :meth:`answered` or :meth:`failed`, until
    :meth:`next_call` gives None; the outcome is :attr:`result`."""

    def __init__(self, jobs: Iterable[Mapping[str, Any]], *, chunk_size: int = CHUNK_MAX) -> None:
        if not 1 <= chunk_size <= CHUNK_MAX:
            raise ValueError(f"chunk_size must be between 1 and {CHUNK_MAX}")
        self._jobs: list[Json] = [
            to_jsonable_python(dict(job), by_alias=True, exclude_none=True) for job in jobs
        ]
        count = len(self._jobs)
        self.result = CreatedMany(jobs=[None] * count)
        self._chunks = [
            list(range(i, min(i + chunk_size, count))) for i in range(0, count, chunk_size)
        ]

    def next_call(self) -> Call | None:
        if not self._chunks:
            return None
        return Call(
            "POST", "/v1/jobs/batch", json={"jobs": [self._jobs[i] for i in self._chunks[0]]}
        )

    def answered(self, data: Any) -> None:
        chunk = self._chunks.pop(0)
        items = read_items(data)
        if len(items) != len(chunk):
            raise ApiError(200, "bad_response", f"{len(items)} jobs answered for {len(chunk)} sent")
        for index, item in zip(chunk, items, strict=True):
            self.result.jobs[index] = item

    def failed(self, error: ApiError) -> None:
        chunk = self._chunks[0]
        named = _named(error, len(chunk))
        if not named:
            self._chunks.pop(0)
            for index in chunk:
                self.result.errors[index] = error
            return
        for position, own in named.items():
            self.result.errors[chunk[position]] = own
        rest = [index for position, index in enumerate(chunk) if position not in named]
        if rest:
            self._chunks[0] = rest
        else:
            self._chunks.pop(0)


def _named(error: ApiError, size: int) -> dict[int, ApiError]:
    """The errors of single jobs of a chunk of ``size`` that ``error`` names, by their
    position in the chunk: the error's own field, and each field its details list."""
    if error.status < 400 or error.status >= 500:
        return {}
    fields: list[tuple[str | None, str]] = [(error.field, error.message)]
    listed = error.details.get("errors") if isinstance(error.details, Mapping) else None
    if isinstance(listed, list):
        fields += [
            (e.get("field"), str(e.get("message", error.message)))
            for e in listed
            if isinstance(e, Mapping)
        ]
    named: dict[int, ApiError] = {}
    for name, message in fields:
        match = _ITEM.match(name or "")
        if match is None or int(match.group(1)) >= size:
            continue
        position = int(match.group(1))
        named.setdefault(position, ApiError(error.status, error.code, message, match.group(2)))
    return named
