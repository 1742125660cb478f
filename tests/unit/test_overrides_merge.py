"""``domain/overrides``: RFC 7396's merge-patch (its appendix's cases) and the merge
order, pure."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronwheel.domain.overrides import (
    Override,
    OverrideScope,
    RunFields,
    applied,
    merge_patch,
    run_overlay,
)

T0 = datetime(2031, 1, 1, tzinfo=UTC)


# RFC 7396, Appendix A: target, patch, result.
@pytest.mark.parametrize(
    ("target", "patch", "result"),
    [
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_merge_patch_follows_rfc_7396(target: Any, patch: Any, result: Any) -> None:
    before = repr(target), repr(patch)
    assert merge_patch(target, patch) == result
    assert (repr(target), repr(patch)) == before  # neither is changed


def _override(scope: OverrideScope, minute: int, **values: Any) -> Override:
    return Override(
        id=uuid.uuid4(),
        tenant_id=uuid.uuid4(),
        job_id=uuid.uuid4(),
        run_id=None,
        scope=scope,
        payload=values.get("payload"),
        timeout=values.get("timeout"),
        priority=values.get("priority"),
        pool=values.get("pool"),
        reason=None,
        created_by=None,
        created_at=T0 + timedelta(minutes=minute),
    )


def test_the_merge_order_is_scope_then_age_whatever_the_order_given() -> None:
    base = RunFields(payload={"k": "job", "keep": 1}, timeout=60.0, priority=2, pool="default")
    own = _override(OverrideScope.RUN, 0, payload={"k": "run"})
    following = _override(OverrideScope.NEXT, 1, payload={"k": "next"}, pool="next-pool")
    old = _override(OverrideScope.FUTURE, 2, payload={"k": "f-old", "f": 1}, timeout=5.0)
    new = _override(OverrideScope.FUTURE, 3, payload={"k": "f-new"}, timeout=9.0, priority=0)
    result = applied(base, [own, new, following, old])
    assert result == RunFields(
        payload={"k": "run", "keep": 1, "f": 1}, timeout=9.0, priority=0, pool="next-pool"
    )
    overlay = run_overlay(base, [own, new, following, old])
    assert overlay is not None
    assert overlay["ids"] == [str(o.id) for o in (old, new, following, own)]
    assert overlay["base"] == base.to_json()
    assert run_overlay(base, []) is None
    assert applied(base, []) == base
