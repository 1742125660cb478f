"""cronwheel's version, as its installed distribution says."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["package_version"]


def package_version() -> str:
    try:
        return version("cronwheel")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0.0.0"
