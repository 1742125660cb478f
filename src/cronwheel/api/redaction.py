"""Webhook header values are write-only.

A webhook's ``headers`` carry credentials for the receiving end (``Authorization:
Bearer …``), and every key of the tenant that may read its jobs — viewers included —
would otherwise read them back. So every answer that shows a job or a run shows each
header *name* with the value replaced by :data:`REDACTED`; the store keeps the real
values, and the one reader that needs them, the webhook worker, gets them in its lease
answer (worker role only). A job created with the marker as a header value is refused:
it is a read answer sent back, and would send the marker to the receiver. (The marker
and the redaction itself are the domain's, ``domain.spec``: a job's recorded history
hides the values too.)
"""

from __future__ import annotations

from cronwheel.domain.errors import ValidationError
from cronwheel.domain.spec import REDACTED, RunSpec, redact_webhook

__all__ = ["REDACTED", "WEBHOOK_OUT_DESCRIPTION", "redact_webhook", "refuse_redacted"]

WEBHOOK_OUT_DESCRIPTION = (
    "the webhook (`url`, `method`, `headers`) instead of a task, or null; header values "
    f"are write-only: each is shown as `{REDACTED}` (the names are kept), and only the "
    "webhook worker's lease answer carries the real values (see docs/webhooks.md)"
)


def refuse_redacted(spec: RunSpec, *, field: str = "webhook.headers") -> None:
    """Refuse a job whose webhook sends the redaction marker as a header value."""
    if spec.webhook is None:
        return
    for name, value in spec.webhook.headers.items():
        if value == REDACTED:
            raise ValidationError(
                f"{field}.{name}: {REDACTED!r} is how answers hide header values, not a "
                "value to send: give the real one",
                field=f"{field}.{name}",
            )
