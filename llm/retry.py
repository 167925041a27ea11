"""How long to wait before trying an LLM call again (docs/costs.md, "When a provider fails").

Why our own retries and not litellm's: litellm hands retries to the OpenAI client for OpenAI and
OpenAI-compatible servers (which waits the answer's `Retry-After`), but for the providers it
speaks to with its own HTTP code (Anthropic, Gemini, ...) it retries through `tenacity`, an
optional package: without it a 429 was not retried at all, and with it the wait is its own
backoff, not the provider's `Retry-After`. So the client (llm/client.py) asks litellm for one try
and retries here, the same way for every provider.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping

# A provider that asks for a longer pause is not waited for inside one call (the attempt would hold
# its slot all that time): the call fails, and the task's retry policy may try later.
MAX_RETRY_AFTER = 60.0
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 8.0


def _headers(exc: BaseException) -> Mapping[str, str] | None:
    found = getattr(exc, "litellm_response_headers", None)
    if found is None:
        found = getattr(getattr(exc, "response", None), "headers", None)
    return found if isinstance(found, Mapping) or hasattr(found, "get") else None


def retry_after(exc: BaseException) -> float | None:
    """The seconds the provider's answer asked to wait (`retry-after-ms`, or `Retry-After` as
    seconds or an HTTP date), None when it did not say (or said something unreadable)."""
    headers = _headers(exc)
    if headers is None:
        return None
    value = headers.get("retry-after")
    for raw, scale in ((headers.get("retry-after-ms"), 1000.0), (value, 1.0)):
        try:
            if raw is not None:
                return max(0.0, float(raw) / scale)
        except ValueError:
            continue
    if not value:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, when.timestamp() - time.time())


def wait_seconds(exc: BaseException, tried: int) -> float | None:
    """How long to wait before try `tried + 1` after `exc` (a failure worth retrying): what the
    provider asked for, else a backoff doubling from 0.5 s up to 8 s with some jitter; None when
    the provider asked for more than MAX_RETRY_AFTER."""
    told = retry_after(exc)
    if told is not None:
        return told if told <= MAX_RETRY_AFTER else None
    return min(BACKOFF_FIRST * 2 ** tried, BACKOFF_MAX) * random.uniform(1.0, 1.25)
