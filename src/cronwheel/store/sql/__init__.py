"""The store's logic, written once over a driver (``store/driver.py``)."""

from __future__ import annotations

from cronwheel.store.sql.admission import AdmissionMixin
from cronwheel.store.sql.attempts import AttemptsMixin
from cronwheel.store.sql.audit import AuditMixin
from cronwheel.store.sql.bulk import BulkMixin
from cronwheel.store.sql.deletion import DeletionMixin
from cronwheel.store.sql.edits import EditsMixin
from cronwheel.store.sql.events import EventsMixin
from cronwheel.store.sql.expiry import ExpiryMixin
from cronwheel.store.sql.firing import FiringMixin
from cronwheel.store.sql.logs import LogsMixin
from cronwheel.store.sql.missed import MissedMixin
from cronwheel.store.sql.overrides import OverridesMixin
from cronwheel.store.sql.overview import OverviewMixin
from cronwheel.store.sql.pools import PoolsMixin
from cronwheel.store.sql.rate_buckets import RateBucketsMixin
from cronwheel.store.sql.redrive import RedriveMixin
from cronwheel.store.sql.routing import RoutingMixin
from cronwheel.store.sql.runs import RunsMixin
from cronwheel.store.sql.shard_leases import ShardLeasesMixin
from cronwheel.store.sql.tenants import TenantsMixin
from cronwheel.store.sql.triggers import TriggersMixin
from cronwheel.store.sql.ui_sessions import UiSessionsMixin
from cronwheel.store.sql.workflows import WorkflowsMixin

__all__ = ["SqlStore"]


class SqlStore(
    BulkMixin,  # and the triggers and redrive it takes steps of
    TenantsMixin,
    RateBucketsMixin,
    WorkflowsMixin,
    TriggersMixin,  # and JobsMixin, which it builds on
    EditsMixin,
    OverridesMixin,
    RunsMixin,
    OverviewMixin,
    RedriveMixin,
    FiringMixin,
    ShardLeasesMixin,
    AttemptsMixin,  # and WorkersMixin, RetriesMixin
    ExpiryMixin,
    RoutingMixin,
    MissedMixin,
    EventsMixin,
    AuditMixin,
    LogsMixin,
    DeletionMixin,
    AdmissionMixin,
    PoolsMixin,
    UiSessionsMixin,
):
    """Implements every method of ``Store``, once, over the driver it is given.

    One room (module) per table or concept; each is a mixin over ``SqlCore``."""
