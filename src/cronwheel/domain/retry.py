"""Retry backoff: exponential with a cap and jitter (the AWS Architecture Blog's
"full" and "equal" jitter), computed from the policy stored on the run."""

from __future__ import annotations

import math
import random
from typing import Any

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
    # Compare in log space first: initial * multiplier**exponent overflows a float long
    # before the attempt limits do (25.0**221), and the cap is reached far earlier.
    if initial <= 0 or cap <= 0:
        base = 0.0
    elif math.log(initial) + exponent * math.log(multiplier) >= math.log(cap):
        base = cap
    else:
        base = min(cap, initial * multiplier**exponent)
    jitter = policy.get("jitter", "full")
    if jitter == "full":
        return draw(0.0, base)
    if jitter == "equal":
        return base / 2 + draw(0.0, base / 2)
    return base
