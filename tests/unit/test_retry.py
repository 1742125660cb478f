"""Properties of the retry backoff for each jitter mode."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronwheel.domain.bounds import RETRY_DELAY_MAX
from cronwheel.domain.retry import backoff_delay
from cronwheel.domain.spec import RetryPolicy

JITTERS = ("full", "equal", "none")

# Exactly the policies the API accepts.
policies = st.builds(
    RetryPolicy,
    max_attempts=st.integers(1, 1000),
    initial_delay=st.floats(0, 86_400, allow_nan=False),
    multiplier=st.floats(1.0, 100.0, allow_nan=False),
    max_delay=st.floats(0, 7 * 86_400, allow_nan=False),
    jitter=st.sampled_from(JITTERS),
)
attempts = st.integers(1, 1000)
seeds = st.integers(0, 2**32)
# No per-example deadline: a busy 2-core machine can stall any single example.
relaxed = settings(deadline=None)


def _as_stored(policy: RetryPolicy, **changes: Any) -> dict[str, Any]:
    """The policy as the store keeps it on a run (JSON)."""
    return {**policy.model_dump(mode="json"), **changes}


def _ceiling(policy: dict[str, Any], failed_attempt: int) -> float:
    """The un-jittered backoff ``min(max_delay, initial * multiplier ** (n - 1))``,
    compared in log space so that no exponent can overflow."""
    initial, multiplier, cap = policy["initial_delay"], policy["multiplier"], policy["max_delay"]
    exponent = failed_attempt - 1
    if initial == 0 or cap == 0:
        return 0.0
    if math.log(initial) + exponent * math.log(multiplier) >= math.log(cap):
        return float(cap)
    return math.exp(math.log(initial) + exponent * math.log(multiplier))


def _at_most(value: float, bound: float) -> bool:
    return value <= bound or math.isclose(value, bound, rel_tol=1e-9)


@relaxed
@given(policies, attempts, seeds)
def test_delay_within_its_jitter_bounds(policy: RetryPolicy, attempt: int, seed: int) -> None:
    stored = _as_stored(policy)
    delay = backoff_delay(stored, attempt, random.Random(seed))
    ceiling = _ceiling(stored, attempt)
    assert 0.0 <= delay <= policy.max_delay
    if policy.jitter == "full":
        assert _at_most(delay, ceiling)
    elif policy.jitter == "equal":
        assert _at_most(ceiling / 2, delay)
        assert _at_most(delay, ceiling)
    else:
        assert math.isclose(delay, ceiling, rel_tol=1e-9)


@relaxed
@given(policies, attempts, seeds)
def test_more_failures_never_wait_less_without_jitter(
    policy: RetryPolicy, attempt: int, seed: int
) -> None:
    stored = _as_stored(policy, jitter="none")
    rng = random.Random(seed)
    assert backoff_delay(stored, attempt, rng) <= backoff_delay(stored, attempt + 1, rng)


@relaxed
@given(policies, seeds)
def test_delay_reaches_the_cap_and_stays_there(policy: RetryPolicy, seed: int) -> None:
    stored = _as_stored(policy, jitter="none")
    rng = random.Random(seed)
    delays = [backoff_delay(stored, n, rng) for n in range(1, 60)]
    assert delays == sorted(delays)
    assert all(d <= policy.max_delay for d in delays)
    if policy.initial_delay >= 0.001 and policy.multiplier >= 2:
        # Doubling at least every time, 59 failures pass any allowed cap (a week).
        assert delays[-1] == policy.max_delay


@relaxed
@given(policies, attempts, seeds)
def test_jitter_draws_are_reproducible_and_bounded_by_the_cap(
    policy: RetryPolicy, attempt: int, seed: int
) -> None:
    stored = _as_stored(policy)
    first = backoff_delay(stored, attempt, random.Random(seed))
    assert first == backoff_delay(stored, attempt, random.Random(seed))
    assert 0.0 <= first <= policy.max_delay


def test_first_retry_waits_the_initial_delay() -> None:
    stored = _as_stored(RetryPolicy(initial_delay=7, multiplier=3, max_delay=100, jitter="none"))
    assert [backoff_delay(stored, n) for n in (1, 2, 3, 4)] == [7, 21, 63, 100]


@relaxed
@given(
    initial=st.floats(0, 1e300, allow_nan=False),
    cap=st.floats(0, 1e300, allow_nan=False),
    failed=attempts,
)
def test_a_stored_policy_past_the_bounds_never_waits_past_them(
    initial: float, cap: float, failed: int
) -> None:
    """A policy written before the bounds, or by hand, still lands a retry on an
    instant every backend holds."""
    policy = {"initial_delay": initial, "max_delay": cap, "multiplier": 2.0, "jitter": "none"}
    assert 0.0 <= backoff_delay(policy, failed) <= RETRY_DELAY_MAX


def test_a_policy_with_no_delay_at_all_is_an_error() -> None:
    policy = {"initial_delay": 1.0, "max_delay": math.nan, "jitter": "none"}
    with pytest.raises(ValueError, match="gives no delay"):
        backoff_delay(policy, 2)
