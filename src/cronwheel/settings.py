"""Configuration: one validated ``Settings`` object, read once at start-up from
``CRONWHEEL_*`` environment variables (and command-line flags that override them)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from cronwheel.domain.new_job import JobLimits
from cronwheel.domain.workflow import NODE_INPUT_MAX

__all__ = ["OTHER_POOLS", "Settings", "normalise_database_url"]

OTHER_POOLS = "other"
"""The ``pool`` label value in metrics of every pool ``metrics_pools`` does not list."""


def normalise_database_url(url: str) -> str:
    """Accept the URLs people write (``postgresql://…``, ``sqlite:///…``) and name the
    async driver cronwheel uses for each."""
    if url.startswith(("postgres://", "postgresql://")):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    if url.startswith("sqlite://") and not url.startswith("sqlite+aiosqlite://"):
        return "sqlite+aiosqlite://" + url.split("://", 1)[1]
    if url.startswith(("postgresql+asyncpg://", "sqlite+aiosqlite://")):
        return url
    raise ValueError(
        f"unsupported database URL {url.split('://', 1)[0]!r}: use postgresql://… or sqlite:///…"
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CRONWHEEL_", extra="ignore")

    data_dir: Path = Field(default=Path.home() / ".cronwheel")
    database_url: str | None = None
    admin_key: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)

    # /metrics (API and scheduler) answers only to this bearer token or the admin key;
    # unset: the admin key only.
    metrics_token: str | None = Field(default=None, min_length=16)
    # The pools whose runs get their own value of the ``pool`` label; every other pool
    # — named by tenants, so unbounded and not for other tenants' eyes — is counted
    # under ``other`` (which therefore may not be listed).
    metrics_pools: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["default"],
        description="pools that get their own `pool` label value in /metrics; the "
        "environment takes a comma-separated list",
    )

    # A request's head: at most this many headers, and this many bytes of request line
    # and headers together; more is refused with 431 while it is still arriving.
    max_header_count: int = Field(default=100, ge=10, le=10_000)
    max_header_bytes: int = Field(default=32 * 1024, ge=4096, le=1 << 20)

    # Requests per second (token buckets, each API process on its own; 0: no limit):
    # per operator or viewer key; per worker key and for the admin key (they carry the
    # worker protocol of whole fleets); per client address for requests without a valid
    # key. See cronwheel/api/rate_limits.py.
    rate_limit: float = Field(default=100.0, ge=0)
    rate_limit_burst: int = Field(default=200, ge=1)
    worker_rate_limit: float = Field(default=2000.0, ge=0)
    worker_rate_limit_burst: int = Field(default=4000, ge=1)
    anonymous_rate_limit: float = Field(default=20.0, ge=0)
    anonymous_rate_limit_burst: int = Field(default=100, ge=1)

    max_payload_bytes: int = Field(default=64 * 1024, ge=1024)
    # The most a workflow's node is given when it is made ready: its payload with its
    # upstream nodes' results (docs/workflows.md). At least the payload limit, so that
    # a node's own payload always fits; unset, 1 MiB or the payload limit if larger
    # (``node_input_limit``).
    max_node_input_bytes: int | None = Field(default=None, ge=1024)
    # Database connections a process keeps open (PostgreSQL). An API process makes all
    # of its ``api_pool_size`` at start-up, so a burst's start statements never wait for
    # one; a process without the API (a scheduler node) keeps ``db_pool_size``. Under
    # load either may open ``db_pool_overflow`` more, closed again when returned, and
    # each keeps one more for LISTEN. So a process holds at most pool + overflow + 1.
    api_pool_size: int = Field(default=32, ge=2, le=500)
    db_pool_size: int = Field(default=10, ge=2, le=500)
    db_pool_overflow: int = Field(default=8, ge=0, le=500)
    max_horizon_days: int = Field(default=3 * 366, ge=1)
    past_grace_seconds: float = Field(default=300.0, ge=0)

    # scheduler
    node_id: str | None = None
    window_seconds: float = Field(default=30.0, ge=1)
    fire_batch_size: int = Field(default=1000, ge=1)
    shard_lease_ttl: float = Field(default=10.0, ge=1)
    expire_interval: float = Field(default=1.0, gt=0)
    # Dispatch runs this many seconds ahead of their instant: they wait in the ready
    # queue (not leasable, still cancellable and pausable), or reserved by a worker,
    # until it comes, so the instant itself costs only their start. 0 turns it off.
    # Ten seconds let one scheduler and two workers dispatch and reserve a 20,000-run
    # burst before its instant (five did not: what was left was leased after it,
    # seconds late). Only instants with at least ``dispatch_lead_burst`` runs due on one
    # node go ahead; the others at their instant. Every run, by default: reserved and
    # started by the batch, runs due one by one cost less than leased one by one, and
    # their handlers begin within milliseconds of their instants. (A run whose job
    # guards against overlap is always fired at its instant.)
    dispatch_lead: float = Field(default=10.0, ge=0, le=60)
    dispatch_lead_burst: int = Field(default=1, ge=1)
    # Capacity-aware release (scheduler/release.py): a burst's runs go to a pool's ready
    # queue while it holds fewer than the larger of ``dispatch_buffer`` and twice the
    # slots of the pool's live workers — P0 first, then tenants by weight — the rest
    # waiting SCHEDULED, looked at again every ``release_interval`` seconds.
    dispatch_buffer: int = Field(default=1000, ge=1)
    release_interval: float = Field(default=0.02, gt=0, le=5)
    # Dispatched runs no live worker can take: checked this often, once they have
    # waited ``route_wait`` seconds; a worker counts as live for ``worker_ttl`` seconds
    # after its last lease call (longer while it holds an unexpired lease).
    route_check_interval: float = Field(default=5.0, gt=0)
    route_wait: float = Field(default=5.0, ge=0)
    worker_ttl: float = Field(default=30.0, gt=0)
    # Missed runs (undispatched past their job's lateness budget) and stalled
    # schedules are looked for this often, ``missed_batch`` runs or jobs at a time
    # (docs/alerts.md).
    missed_check_interval: float = Field(default=5.0, gt=0)
    missed_batch: int = Field(default=1000, ge=1, le=100_000)
    # A node whose clock cannot be trusted within this many seconds (the round trip of
    # its best offset reading, or the offset's change since the reading before) gives
    # up its shards until it can.
    max_clock_uncertainty: float = Field(default=1.0, gt=0)
    clock_check_interval: float = Field(default=10.0, gt=0)

    # worker protocol
    heartbeat_interval: float = Field(default=10.0, gt=0)
    lease_wait_max: float = Field(default=30.0, gt=0)
    # Workers may lease runs dispatched ahead of their instant (see ``dispatch_lead``)
    # up to this many seconds early, as reservations they start at the instant; 0 turns
    # reservations off. As long as the dispatch lead, so a burst is reserved as soon as
    # it is dispatched.
    lease_ahead_max: float = Field(default=10.0, ge=0, le=60)
    # A worker may start a reservation up to this many seconds before its instant: the
    # run is RUNNING from then (its attempt dated from the instant) and the worker
    # begins its handler at the instant by its own clock, with no round trip left to
    # make. A cancel or pause that comes after that start is a cancel of a running run.
    # Three seconds: what starting a 10,000-run burst takes on SQLite (a burst's starts
    # go out this early; runs due one by one a few round trips before their instant).
    start_ahead_max: float = Field(default=3.0, ge=0, le=10)
    # The share of each worker's slots that only P0 runs may take, so that a flood of
    # lower classes never occupies every slot (a pool's own setting overrides it:
    # ``PUT /v1/pools/{name}``). A worker keeps floor(share * capacity) slots for P0.
    # Off by default: reserved slots stand idle whenever no P0 run waits, and a ready P0
    # run is leased before any lower class anyway; a pool whose handlers run long (a
    # slot frees up rarely) is where a share pays for itself.
    p0_reserved_share: float = Field(default=0.0, ge=0, le=1)

    # API keys: how long an API process trusts a key it looked up before asking the
    # database again (heartbeats must not cost a round trip each). A revoked key is
    # dropped at once on every API process all the same: the revocation's notice wakes
    # them (LISTEN/NOTIFY on PostgreSQL); the TTL only bounds a notice that got lost.
    key_cache_ttl: float = Field(
        default=5.0,
        ge=0,
        le=3600,
        description="seconds an API process keeps a looked-up API key before reading it "
        "again; revocations reach every process at once regardless",
    )

    # the dashboard (see docs/dashboard.md)
    ui_session_idle: float = Field(
        default=12 * 3600.0,
        ge=60,
        le=30 * 86400,
        description="seconds a dashboard session lasts without being used",
    )
    ui_session_lifetime: float = Field(
        default=7 * 86400.0,
        ge=60,
        le=365 * 86400,
        description="seconds a dashboard session lasts at most, used or not",
    )

    # worker logs (see docs/logs.md)
    log_store: Literal["files", "database"] | None = Field(
        default=None,
        description="where worker logs are kept: `files` under `log_dir`, or `database` "
        "(the `log_chunks` table, which every API process reads); unset: `database` on "
        "PostgreSQL, `files` on SQLite",
    )
    log_dir: Path | None = Field(
        default=None, description="the file log store's directory (default: data_dir/logs)"
    )
    max_log_bytes_per_attempt: int = Field(default=1 << 20, ge=4096)
    log_retention_days: int = Field(
        default=30,
        ge=1,
        le=3660,
        description="days the database log store keeps lines (whole days are dropped once "
        "older); the file store keeps them until removed",
    )

    audit_retention_days: int = Field(
        default=400,
        ge=1,
        le=36600,
        description="days the audit trail keeps a record (retention, by the scheduler "
        "node that owns shard 0, hourly, is the only way records leave)",
    )

    # bulk operations (see docs/bulk.md)
    max_open_operations: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description="bulk operations a tenant may have open (pending or running) at once; "
        "one more is refused with 429 `limit_exceeded` until one ends",
    )
    operation_retention_days: int = Field(
        default=30,
        ge=1,
        le=36600,
        description="days a finished bulk operation stays readable at /v1/operations "
        "(removed hourly with the audit trail's retention; the audit record of who asked "
        "for it stays audit_retention_days)",
    )

    # the built-in webhook worker
    webhook_pools: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["default"],
        description="pools `cronwheel server` runs a webhook worker for (empty: none); "
        "the environment takes a comma-separated list",
    )
    webhook_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="CIDRs and host names webhooks may reach although they are private, "
        "loopback, link-local…; the environment takes a comma-separated list",
    )
    webhook_timeout: float = Field(default=30.0, gt=0, le=3600)
    webhook_concurrency: int = Field(default=20, ge=1, le=10_000)

    @field_validator("webhook_pools", "webhook_allow", "metrics_pools", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("metrics_token", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("metrics_pools")
    @classmethod
    def _metrics_pools(cls, value: list[str]) -> list[str]:
        if OTHER_POOLS in value:
            raise ValueError(
                f"{OTHER_POOLS!r} is the label value of every pool not listed: list the "
                "pool under another name"
            )
        return list(dict.fromkeys(value))

    @field_validator("webhook_allow")
    @classmethod
    def _allow_list(cls, value: list[str]) -> list[str]:
        from cronwheel.worker.webhook import AllowList

        AllowList.parse(value)  # a bad entry fails at start-up, naming itself
        return value

    @field_validator("max_node_input_bytes")
    @classmethod
    def _node_input(cls, value: int | None, info: ValidationInfo) -> int | None:
        payload = info.data.get("max_payload_bytes")
        if value is not None and payload is not None and value < payload:
            raise ValueError(
                f"CRONWHEEL_MAX_NODE_INPUT_BYTES ({value}) must be at least the payload "
                f"limit, CRONWHEEL_MAX_PAYLOAD_BYTES ({payload}): a node's own payload "
                "must fit in it"
            )
        return value

    @field_validator("database_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else normalise_database_url(value)

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{self.data_dir / 'cronwheel.db'}"

    @property
    def job_limits(self) -> JobLimits:
        """What a new job may be (``domain.new_job``)."""
        return JobLimits(
            max_payload_bytes=self.max_payload_bytes,
            max_horizon=timedelta(days=self.max_horizon_days),
            past_grace=timedelta(seconds=self.past_grace_seconds),
        )

    @property
    def node_input_limit(self) -> int:
        """The most bytes of JSON a workflow's node is given when made ready: the
        setting, else 1 MiB or the payload limit if larger."""
        if self.max_node_input_bytes is not None:
            return self.max_node_input_bytes
        return max(NODE_INPUT_MAX, self.max_payload_bytes)

    @property
    def resolved_log_store(self) -> str:
        """``files`` or ``database``: the setting, else what the database suggests."""
        if self.log_store is not None:
            return self.log_store
        return "database" if self.resolved_database_url.startswith("postgresql") else "files"

    @property
    def resolved_log_dir(self) -> Path:
        return self.log_dir if self.log_dir is not None else self.data_dir / "logs"

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Environment first, then the non-None ``overrides`` (command-line flags)."""
        return cls(**{k: v for k, v in overrides.items() if v is not None})
