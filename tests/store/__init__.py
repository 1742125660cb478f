"""The store conformance suite: one set of tests, run against SQLite and PostgreSQL."""
