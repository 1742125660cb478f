"""The SQL store shared by both dialects (SQLAlchemy Core)."""

from __future__ import annotations

from cronwheel.store.sql.attempts import AttemptsMixin
from cronwheel.store.sql.catalog import CatalogMixin
from cronwheel.store.sql.dispatch import DispatchMixin

__all__ = ["SqlStore"]


class SqlStore(CatalogMixin, DispatchMixin, AttemptsMixin):
    """Implements every method of ``Store``; dialect subclasses fill in the hooks."""
