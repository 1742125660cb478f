"""Whose step is next among the bulk operations one API node holds (``Turns``), and
what a failed operation tells clients (``failure_message``)."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

from cronwheel.api.operations import Turns, failure_message
from cronwheel.domain.bulk import Operation, OperationState
from cronwheel.domain.errors import StoreUnavailableError, TenantLimitError

T0 = datetime(2031, 3, 4, tzinfo=UTC)
A, B, C = (uuid.UUID(int=i) for i in (1, 2, 3))


def op(tenant: uuid.UUID, second: float) -> Operation:
    return Operation(
        id=uuid.uuid4(),
        tenant_id=tenant,
        action="cancel",
        selector={},
        reason=None,
        actor="k",
        state=OperationState.RUNNING,
        matched=0,
        changed=0,
        skipped={},
        created_at=T0 + timedelta(seconds=second),
        started_at=None,
        finished_at=None,
    )


def take(turns: Turns, n: int) -> list[Operation]:
    out = []
    for _ in range(n):
        chosen = turns.next()
        assert chosen is not None
        out.append(chosen)
    return out


def test_tenants_share_alike_however_many_operations_each_holds() -> None:
    turns = Turns()
    many = [op(A, s) for s in range(5)]
    one = op(B, 10)
    for o in [*many, one]:
        turns.add(o)
    picked = take(turns, 20)
    assert Counter(o.tenant_id for o in picked) == {A: 10, B: 10}
    # A's operations each begin in turn, oldest first, then go round.
    assert [o.id for o in picked if o.tenant_id == A] == [o.id for o in many] * 2


def test_a_new_operation_goes_at_its_tenants_next_turn() -> None:
    turns = Turns()
    big = op(A, 0)
    turns.add(big)
    assert take(turns, 3) == [big] * 3
    # Another tenant's arrives: it goes next, before the one under way.
    theirs = op(B, 5)
    turns.add(theirs)
    assert take(turns, 3) == [theirs, big, theirs]
    # The busy tenant's own new one goes before its older one's next step.
    mine = op(A, 6)
    turns.add(mine)
    assert take(turns, 4) == [mine, theirs, big, theirs]


def test_dropped_and_lost_operations_leave_the_turns() -> None:
    turns = Turns()
    a, b, c = op(A, 0), op(B, 1), op(C, 2)
    for o in (a, b, c):
        assert turns.add(o)
    assert not turns.add(a)  # claimed again: held once
    assert len(turns) == 3
    turns.drop(b.id)
    assert turns.keep([a.id]) == [c.id]
    assert take(turns, 2) == [a, a]
    turns.drop(a.id)
    assert turns.next() is None


def test_a_failure_tells_clients_only_what_the_api_would() -> None:
    operation = uuid.uuid4()
    refused = TenantLimitError("tenant t has 5 pending runs", limit="max_pending_runs")
    assert failure_message(refused, operation) == "limit_exceeded: tenant t has 5 pending runs"
    for internal in (
        RuntimeError('relation "runs_p17" at db-7.internal:5432 does not exist'),
        StoreUnavailableError("connection to 10.0.0.7 refused"),
    ):
        message = failure_message(internal, operation)
        assert "db-7" not in message and "10.0.0.7" not in message
        assert message.startswith("stopped by an internal error")
        assert str(operation) in message


def test_a_tenant_with_a_step_under_way_is_passed_over() -> None:
    turns = Turns()
    a1, a2, b = op(A, 0), op(A, 1), op(B, 2)
    for o in (a1, a2, b):
        turns.add(o)
    assert turns.next() == a1
    # A's step is under way: the next lane takes B's, and none is left for a third.
    assert turns.next(busy={A}) == b
    assert turns.next(busy={A, B}) is None
    assert turns.next(busy={B}) == a2
