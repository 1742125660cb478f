from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from cronwheel.domain.bucket import TokenBucket

T0 = datetime(2026, 12, 3, tzinfo=UTC)


def test_a_new_bucket_is_full() -> None:
    assert TokenBucket(rate=5, burst=20).level(None, None, T0) == 20


def test_it_refills_at_its_rate_up_to_its_burst() -> None:
    b = TokenBucket(rate=5, burst=20)
    assert b.level(0, T0, T0 + timedelta(seconds=1)) == 5
    assert b.level(0, T0, T0 + timedelta(seconds=10)) == 20


def test_a_clock_that_went_back_refills_nothing() -> None:
    assert TokenBucket(rate=5, burst=20).level(3, T0, T0 - timedelta(seconds=4)) == 3


def test_grant_gives_whole_tokens_only() -> None:
    b = TokenBucket(rate=1, burst=10)
    assert b.grant(2.7, 5) == 2
    assert b.grant(9.0, 5) == 5
    assert b.grant(0.99, 1) == 0


def test_wait_is_the_time_to_refill_the_shortfall() -> None:
    b = TokenBucket(rate=4, burst=10)
    assert b.wait(0.0) == 0.25
    assert b.wait(3.0, 2) == 0.0


@given(
    st.floats(0.1, 1000),
    st.integers(1, 1000),
    st.floats(0, 1000),
    st.floats(0, 3600),
    st.integers(0, 2000),
)
def test_never_more_than_the_burst_nor_a_grant_beyond_the_level(
    rate: float, burst: int, tokens: float, seconds: float, wanted: int
) -> None:
    b = TokenBucket(rate=rate, burst=burst)
    level = b.level(min(tokens, burst), T0, T0 + timedelta(seconds=seconds))
    assert 0 <= level <= burst
    granted = b.grant(level, wanted)
    assert 0 <= granted <= min(wanted, level + 1e-6)
