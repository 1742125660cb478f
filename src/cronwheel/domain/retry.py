"""Retry backoff: exponential with a cap and jitter (the AWS Architecture Blog's
"full" and "equal" jitter), computed from the policy stored on the run."""

from __future__ import annotations

import math
import random
from typing import Any

from cronwheel.domain.bounds import RETRY_DELAY_MAX

__all__ = ["backoff_delay"]

_RNG = random.Random()


def backoff_delay(
    policy: dict[str, Any], failed_attempt: int, rng: random.Random | None = None
) -> float:
    """Seconds to wait before the try after ``failed_attempt`` (1-based) failed."""
    draw = (rng or _RNG).uniform
    initial = float(policy.get("initial_delay", 1.0))
    multiplier = float(policy.get("multiplier", 2.0))
    cap = float(policy.get("max_delay", 300.0))
    exponent = max(0, failed_attempt - 1)
    # In log space: initial * multiplier**exponent overflows a float long before the
    # attempt limits do (25.0**221) — even under the cap, when the initial delay is
    # tiny (a subnormal times 42.0**190).
    if initial <= 0 or cap <= 0:
        base = 0.0
    else:
        log_base = math.log(initial) + exponent * math.log(multiplier)
        if log_base >= math.log(cap):
            base = cap
        else:
            try:  # exact where it can be: 7 * 3.0**1 is 7, not exp(log 7)
                base = min(cap, initial * multiplier**exponent)
            except OverflowError:
                base = min(cap, math.exp(log_base))
    if math.isnan(base):
        raise ValueError(f"the retry policy {policy!r} gives no delay")
    # Whatever a stored policy says, a retry is never further away than the bound: the
    # instant it lands on must stay one every backend can hold.
    base = min(max(base, 0.0), RETRY_DELAY_MAX)
    jitter = policy.get("jitter", "full")
    if jitter == "full":
        return draw(0.0, base)
    if jitter == "equal":
        return base / 2 + draw(0.0, base / 2)
    return base
