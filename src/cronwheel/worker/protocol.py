"""The HTTP worker protocol, as typed calls: register, lease (long-poll), the batch
endpoint that carries heartbeats, completions, failures and releases together, the
cancels long-poll, and deregister.

Any worker written in Python — the SDK's :class:`~cronwheel.worker.Worker`, the
built-in webhook worker — speaks the protocol through :class:`WorkerProtocol`, so the
wire format is written down in one place.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote

from cronwheel.client import ApiError, AsyncClient, Call

__all__ = [
    "BatchOutcomes",
    "Completion",
    "Failure",
    "GatesHeard",
    "Heartbeat",
    "Lease",
    "LogsAppended",
    "Outcome",
    "Registration",
    "Started",
    "TokenRef",
    "WorkerProtocol",
]

T = TypeVar("T")

# The server may hold a lease request open for ``wait`` seconds; the HTTP read
# timeout must outlast it, with room for a slow answer after the wait.
_LONG_POLL_MARGIN = 15.0
_OFFSET_WINDOW = 60.0  # seconds of lease answers the clock offset is taken from


@dataclass(frozen=True, slots=True)
class Registration:
    worker_id: str
    heartbeat_interval: float
    lease_wait_max: float | None = None  # the longest long-poll the server accepts
    lease_ahead_max: float = 0.0  # how far ahead the server lets it reserve runs
    start_ahead_max: float = 0.0  # how long before its instant it may start a reservation
    cancels_poll: bool = False  # the server answers the cancels long-poll
    gates_poll: bool = False  # the server leases gated reservations, answers their gates


@dataclass(frozen=True, slots=True)
class Lease:
    """One attempt the server handed to this worker."""

    attempt_id: str
    run_id: str
    job_id: str
    attempt: int
    task: str | None
    webhook: dict[str, Any] | None
    payload: dict[str, Any]
    fencing_token: int
    lease_expires_at: datetime
    deadline: datetime
    due_at: datetime | None
    heartbeat_timeout: float
    tenant_id: str | None = None
    # Webhook runs only: the tenant's secret the request is signed with (never logged).
    signing_secret: str | None = field(default=None, repr=False)
    # A reservation: not started; the worker starts it at this instant (server time)
    # with :meth:`WorkerProtocol.start`, and may run it only if that succeeds.
    not_before: datetime | None = None
    # Seconds the handler may go without reporting progress (None: no bound).
    progress_timeout: float | None = None
    # The server takes progress reports on heartbeats (it names ``progress_timeout``).
    takes_progress: bool = False
    # The run's priority class, 0 (P0) .. 3: of runs waiting here for a slot, the
    # highest class starts first.
    priority: int = 2
    # A workflow's node run: its workflow run. Its outcome moves the workflow on: it is
    # reported at once, never held back behind a burst.
    workflow_run_id: str | None = None
    # A gated reservation: a workflow node still waiting for its upstream nodes. It
    # runs only once its gate opens (:meth:`WorkerProtocol.gates`), with the payload
    # the opening gives (:meth:`opened`), and is then started.
    gated: bool = False

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lease:
        def instant(key: str) -> datetime:
            return datetime.fromisoformat(str(data[key]).replace("Z", "+00:00"))

        return cls(
            attempt_id=str(data["attempt_id"]),
            run_id=str(data["run_id"]),
            job_id=str(data.get("job_id", "")),
            attempt=int(data.get("attempt", 1)),
            task=data.get("task"),
            webhook=data.get("webhook"),
            payload=dict(data.get("payload") or {}),
            fencing_token=int(data["fencing_token"]),
            lease_expires_at=instant("lease_expires_at"),
            deadline=instant("deadline"),
            due_at=instant("due_at") if data.get("due_at") else None,
            heartbeat_timeout=float(data.get("heartbeat_timeout", 30.0)),
            tenant_id=None if data.get("tenant_id") is None else str(data["tenant_id"]),
            signing_secret=(
                None if data.get("signing_secret") is None else str(data["signing_secret"])
            ),
            not_before=instant("not_before") if data.get("not_before") else None,
            progress_timeout=(
                None if data.get("progress_timeout") is None else float(data["progress_timeout"])
            ),
            takes_progress="progress_timeout" in data,
            workflow_run_id=(
                None if data.get("workflow_run_id") is None else str(data["workflow_run_id"])
            ),
            priority=int(data.get("priority", 2)),
            gated=data.get("gated") is True,
        )

    def started(self, at: datetime) -> Lease:
        """This reservation as the attempt its start made it: begun at the later of
        ``at`` (server time) and its instant."""
        assert self.not_before is not None
        at = max(at, self.not_before)
        timeout = self.deadline - self.not_before
        begun = self._copy()
        object.__setattr__(
            begun, "lease_expires_at", at + timedelta(seconds=self.heartbeat_timeout)
        )
        object.__setattr__(begun, "deadline", at + timeout)
        object.__setattr__(begun, "not_before", None)
        return begun

    def open(self, at: datetime, payload: dict[str, Any]) -> None:
        """Make this gated reservation, in place, the attempt its gate's opening at
        ``at`` (server time) makes it: begun then, with ``payload``. In place, not a
        copy: a fan-out's opening makes a thousand at once, on the path to their
        handlers; nothing else holds a gated reservation (its worker's gated loop, and
        the handler context made for it, which it becomes)."""
        assert self.gated
        leased_at = self.lease_expires_at - timedelta(seconds=self.heartbeat_timeout)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "lease_expires_at", at + timedelta(seconds=self.heartbeat_timeout))
        object.__setattr__(self, "deadline", at + (self.deadline - leased_at))
        object.__setattr__(self, "due_at", at)
        object.__setattr__(self, "gated", False)

    def _copy(self) -> Lease:
        """A copy slot by slot: ``dataclasses.replace`` and ``copy.copy`` cost ten times
        more, and a burst's instant or a fan-out's gate makes thousands."""
        copy = object.__new__(Lease)
        for name in Lease.__slots__:
            object.__setattr__(copy, name, getattr(self, name))
        return copy

    @property
    def run_seconds_left(self) -> float:
        """Seconds from the lease to the deadline, measured on the server's clock alone
        (the lease's expiry is the server's now plus the heartbeat timeout), so a
        worker whose clock drifts still enforces the right budget."""
        leased_at = self.lease_expires_at.timestamp() - self.heartbeat_timeout
        return max(0.0, self.deadline.timestamp() - leased_at)


@dataclass(frozen=True, slots=True)
class TokenRef:
    attempt_id: str
    fencing_token: int

    def to_json(self) -> dict[str, Any]:
        return {"attempt_id": self.attempt_id, "fencing_token": self.fencing_token}


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A beat for one attempt; with ``progress``, it carries the handler's last report
    since the beat before, and its ``details``."""

    attempt_id: str
    fencing_token: int
    progress: bool = False
    details: Any = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"attempt_id": self.attempt_id, "fencing_token": self.fencing_token}
        if self.progress:  # only then: older servers refuse the fields
            body["progress"] = True
            if self.details is not None:
                body["details"] = self.details
        return body


@dataclass(frozen=True, slots=True)
class Completion:
    attempt_id: str
    fencing_token: int
    result: Any = None
    # Sent without waiting (a workflow's node: its outcome readies the next nodes).
    urgent: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt_id": self.attempt_id,
            "fencing_token": self.fencing_token,
            "result": self.result,
        }


@dataclass(frozen=True, slots=True)
class Failure:
    """``retry_after``: seconds before which the next attempt must not start (the
    server waits for the longer of it and the retry policy's backoff)."""

    attempt_id: str
    fencing_token: int
    error: str
    retryable: bool = True
    retry_after: float | None = None
    urgent: bool = False  # as a Completion's

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "attempt_id": self.attempt_id,
            "fencing_token": self.fencing_token,
            "error": self.error,
            "retryable": self.retryable,
        }
        if self.retry_after is not None:  # only when set: older servers refuse the field
            body["retry_after"] = self.retry_after
        return body


@dataclass(frozen=True, slots=True)
class Outcome:
    """The server's answer for one item of a batch."""

    attempt_id: str
    ok: bool
    error: str | None = None
    lease_expires_at: datetime | None = None
    cancel_requested: bool = False

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        error = data.get("error")
        if isinstance(error, dict):
            error = error.get("code") or error.get("message")
        return cls(
            attempt_id=str(data["attempt_id"]),
            ok=bool(data.get("ok")),
            error=None if error is None else str(error),
            lease_expires_at=_instant(data.get("lease_expires_at")),
            cancel_requested=bool(data.get("cancel_requested", False)),
        )


def _instant(value: Any) -> datetime | None:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else None


@dataclass(frozen=True, slots=True)
class Started:
    """The server's answer to starting reservations: tokens now running (since
    ``started_at``), due later, and refused (gone: drop them)."""

    started_at: datetime | None
    started: list[int]
    not_yet: list[int]
    refused: list[int]


@dataclass(frozen=True, slots=True)
class GatesHeard:
    """A gates long-poll's answer: ``(tokens, payload, opened_at)`` of the gated
    reservations whose gates opened together, and the tokens of those gone."""

    opened: list[tuple[list[int], dict[str, Any], datetime]]
    gone: list[int]


@dataclass(frozen=True, slots=True)
class LogsAppended:
    """The server's answer to a batch of log lines: ``dropped`` lines were past the
    attempt's log cap."""

    accepted: int
    dropped: int


@dataclass(frozen=True, slots=True)
class BatchOutcomes:
    heartbeats: list[Outcome] = field(default_factory=list)
    completions: list[Outcome] = field(default_factory=list)
    failures: list[Outcome] = field(default_factory=list)
    releases: list[Outcome] = field(default_factory=list)


def _outcomes(data: dict[str, Any], key: str) -> list[Outcome]:
    return [Outcome.from_json(item) for item in data.get(key) or []]


def _parsed(what: str, parse: Callable[[], T]) -> T:
    """Parse an answer; a malformed one is an :class:`ApiError` like any other, so the
    worker's loops treat it as a failed request instead of dying on it."""
    try:
        return parse()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ApiError(200, "bad_response", f"malformed {what} answer: {exc!r}") from exc


class WorkerProtocol:
    """The worker endpoints of one server, over an :class:`AsyncClient`.

    ``webhooks_only``: lease webhook runs only (a worker that calls webhooks and has no
    task handlers, such as the built-in webhook worker).
    """

    def __init__(self, client: AsyncClient, *, webhooks_only: bool = False) -> None:
        self.client = client
        self.webhooks_only = webhooks_only
        # The server's clock minus ours, in seconds: when a reservation's ``not_before``
        # comes by our clock. See :meth:`_clock_sample`.
        self.clock_offset = 0.0
        # This worker's slots only P0 runs may take, as the last lease answer said.
        self.p0_reserved_slots = 0
        self._offsets: deque[tuple[float, float]] = deque()  # (monotonic, lower bound)

    async def register(
        self,
        *,
        pool: str,
        capabilities: Sequence[str],
        tags: Sequence[str],
        capacity: int,
        name: str | None = None,
        tasks: Sequence[str] | None = None,
    ) -> Registration:
        """Register; with ``tasks``, the server leases this worker runs of those tasks
        only (and webhook runs, as its capabilities allow)."""
        body: dict[str, Any] = {
            "pool": pool,
            "capabilities": list(capabilities),
            "tags": list(tags),
            "capacity": capacity,
        }
        if name is not None:
            body["name"] = name
        if tasks is not None:
            body["tasks"] = list(tasks)
        if self.webhooks_only:
            body["webhooks_only"] = True
        data = await self.client.send(Call("POST", "/v1/workers", json=body))
        return _parsed(
            "register",
            lambda: Registration(
                worker_id=str(data["worker_id"]),
                heartbeat_interval=float(data.get("heartbeat_interval", 10.0)),
                lease_wait_max=(
                    None if data.get("lease_wait_max") is None else float(data["lease_wait_max"])
                ),
                lease_ahead_max=float(data.get("lease_ahead_max") or 0.0),
                start_ahead_max=float(data.get("start_ahead_max") or 0.0),
                cancels_poll=data.get("cancels_poll") is True,
                gates_poll=data.get("gates_poll") is True,
            ),
        )

    async def lease(
        self,
        worker_id: str,
        *,
        max: int,
        wait: float,
        ahead: float = 0.0,
        reserve: int = 0,
        gated: int = 0,
    ) -> list[Lease]:
        """Up to ``max`` attempts; the server answers as soon as it has any, or after
        ``wait`` seconds with none. With ``ahead``, runs due within that many seconds
        come as reservations (``not_before`` set), and with ``reserve`` too, up to that
        many more of them once ``max`` is filled. With ``gated``, up to that many
        workflow nodes whose upstream nodes are under way, as gated reservations
        (``gated`` set). Each answer updates :attr:`clock_offset`."""
        body: dict[str, Any] = {"max": max, "wait": wait}
        if self.webhooks_only:
            body["webhooks_only"] = True
        if ahead > 0:  # only when set: older servers refuse the fields
            body["ahead"] = ahead
            if reserve > 0:
                body["reserve"] = reserve
        if gated > 0:
            body["gated"] = gated
        call = Call("POST", f"/v1/workers/{quote(worker_id, safe='')}/lease", json=body)
        data = await self.client.send(call, read_timeout=wait + _LONG_POLL_MARGIN)
        received = time.time()
        leases = _parsed("lease", lambda: [Lease.from_json(i) for i in data.get("attempts") or []])
        server_now = _instant(data.get("now"))
        if server_now is not None:
            self._clock_sample(server_now.timestamp() - received)
        reserved = data.get("p0_reserved_slots")
        self.p0_reserved_slots = reserved if isinstance(reserved, int) and reserved > 0 else 0
        return leases

    def server_now(self) -> float:
        """The server's time now as this worker reckons it (seconds since the epoch)."""
        return time.time() + self.clock_offset

    def _clock_sample(self, lower_bound: float) -> None:
        """The server read its clock before we received its answer, so its time minus
        our receipt time is a lower bound of the offset, the closer the sooner the
        answer travelled. The offset is the largest such bound of the last
        ``_OFFSET_WINDOW`` seconds: a slow answer (a busy server) cannot make us start
        reservations late, and a clock that drifts is followed."""
        at = time.monotonic()
        self._offsets.append((at, lower_bound))
        while self._offsets and self._offsets[0][0] < at - _OFFSET_WINDOW:
            self._offsets.popleft()
        self.clock_offset = max(bound for _, bound in self._offsets)

    async def start(self, worker_id: str, tokens: Sequence[int]) -> Started:
        """Start reservations at their instant, by fencing token."""
        call = Call(
            "POST",
            f"/v1/workers/{quote(worker_id, safe='')}/start",
            json={"fencing_tokens": list(tokens)},
        )
        data = await self.client.send(call)
        # A small answer, sent just before the instants it starts: the closest reading
        # of the server's clock the worker gets when those instants matter most.
        server_now = _instant(data.get("now"))
        if server_now is not None:
            self._clock_sample(server_now.timestamp() - time.time())
        return _parsed(
            "start",
            lambda: Started(
                started_at=_instant(data.get("started_at")),
                started=[int(t) for t in data["started"]],
                not_yet=[int(t) for t in data["not_yet"]],
                refused=[int(t) for t in data["refused"]],
            ),
        )

    async def gates(self, worker_id: str, tokens: Sequence[int], *, wait: float) -> GatesHeard:
        """Of the gated reservations ``tokens``: those whose gate opened, and those
        gone; the server answers as soon as there is one, or after ``wait`` seconds."""
        call = Call(
            "POST",
            f"/v1/workers/{quote(worker_id, safe='')}/gates",
            json={"fencing_tokens": list(tokens), "wait": wait},
        )
        data = await self.client.send(call, read_timeout=wait + _LONG_POLL_MARGIN)
        return _parsed(
            "gates",
            lambda: GatesHeard(
                opened=[
                    (
                        [int(t) for t in g["fencing_tokens"]],
                        dict(g["payload"]),
                        datetime.fromisoformat(str(g["opened_at"]).replace("Z", "+00:00")),
                    )
                    for g in data["opened"]
                ],
                gone=[int(t) for t in data["gone"]],
            ),
        )

    async def cancels(
        self, worker_id: str, *, wait: float, known: Sequence[int] = ()
    ) -> list[TokenRef]:
        """The worker's running attempts whose run was asked to stop, but those whose
        token is in ``known``; the server answers as soon as there is one, or after
        ``wait`` seconds with none."""
        call = Call(
            "POST",
            f"/v1/workers/{quote(worker_id, safe='')}/cancels",
            json={"wait": wait, "known": list(known)},
        )
        data = await self.client.send(call, read_timeout=wait + _LONG_POLL_MARGIN)
        return _parsed(
            "cancels",
            lambda: [
                TokenRef(str(c["attempt_id"]), int(c["fencing_token"])) for c in data["cancels"]
            ],
        )

    async def deregister(self, worker_id: str, *, timeout: float) -> int:
        """Tell the server this worker is gone: it releases every attempt still counted
        as the worker's. Returns how many there were."""
        call = Call("DELETE", f"/v1/workers/{quote(worker_id, safe='')}")
        data = await self.client.send(call, read_timeout=timeout)
        return _parsed("deregister", lambda: int(data["released"]))

    async def batch(
        self,
        *,
        heartbeats: Sequence[Heartbeat | TokenRef] = (),
        completions: Sequence[Completion] = (),
        failures: Sequence[Failure] = (),
        releases: Sequence[TokenRef] = (),
    ) -> BatchOutcomes:
        """One request for everything a worker has to report; answers per item, in
        the order given."""
        body = {
            "heartbeats": [h.to_json() for h in heartbeats],
            "completions": [c.to_json() for c in completions],
            "failures": [f.to_json() for f in failures],
            "releases": [r.to_json() for r in releases],
        }
        data = await self.client.send(Call("POST", "/v1/attempts/batch", json=body))
        return _parsed(
            "batch",
            lambda: BatchOutcomes(
                heartbeats=_outcomes(data, "heartbeats"),
                completions=_outcomes(data, "completions"),
                failures=_outcomes(data, "failures"),
                releases=_outcomes(data, "releases"),
            ),
        )

    async def append_logs(
        self, attempt_id: str, *, fencing_token: int, lines: Sequence[dict[str, Any]]
    ) -> LogsAppended:
        """Append log lines (``{"ts", "level", "message"}``) to a live attempt's log. A
        stale token, or an attempt that has ended, raises :class:`ApiError` 409."""
        call = Call(
            "POST",
            f"/v1/attempts/{quote(attempt_id, safe='')}/logs",
            json={"fencing_token": fencing_token, "lines": list(lines)},
        )
        data = await self.client.send(call)
        return _parsed(
            "logs",
            lambda: LogsAppended(accepted=int(data["accepted"]), dropped=int(data["dropped"])),
        )
