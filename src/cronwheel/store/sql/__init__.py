"""The store's logic, written once over a driver (``store/driver.py``)."""

from __future__ import annotations

from cronwheel.store.sql.attempts import AttemptsMixin
from cronwheel.store.sql.catalog import CatalogMixin
from cronwheel.store.sql.control import ControlMixin
from cronwheel.store.sql.dispatch import DispatchMixin
from cronwheel.store.sql.expiry import ExpiryMixin
from cronwheel.store.sql.redrive import RedriveMixin
from cronwheel.store.sql.routing import RoutingMixin
from cronwheel.store.sql.tenancy import TenancyMixin

__all__ = ["SqlStore"]


class SqlStore(
    TenancyMixin,
    CatalogMixin,
    ControlMixin,
    RedriveMixin,
    DispatchMixin,
    AttemptsMixin,  # and LeasingMixin, which it builds on
    ExpiryMixin,  # and FailuresMixin, QuarantineMixin
    RoutingMixin,
):
    """Implements every method of ``Store``, once, over the driver it is given."""
