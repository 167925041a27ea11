"""Webhook callbacks of tasks.execute (`webhook_config`).

Each execution with a webhook gets one delivery coroutine that posts the execution's events in
order. A callback that keeps failing is retried with exponential backoff (1 s, 2 s, 4 s, ...) on
5xx and network errors, never on 4xx, and then given up; the next event (such as `final`) is still
sent. Nothing here can change the task's own outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from taskgrove.agent.engine.bus import FINAL, TASK_COMPLETED
from taskgrove.agent.engine.bus import BusSubscription
from taskgrove.agent.engine.stream import run_summary, wire_event
from taskgrove.agent.foundations.errors import invalid_params
from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.netguard import UnsafeURLError, ensure_public_url, log_url
from taskgrove.executors import tls

if TYPE_CHECKING:  # pragma: no cover
    import httpx

log = logging.getLogger(__name__)
METHODS = ("POST", "PUT", "PATCH")


@dataclass(frozen=True)
class WebhookConfig:
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    method: str = "POST"
    timeout: float = 30.0
    max_retries: int = 3
    backoff: float = 1.0

    @classmethod
    async def parse(cls, raw: Any, settings: Settings) -> "WebhookConfig":
        if not isinstance(raw, Mapping):
            raise invalid_params("webhook_config must be an object with at least a url")
        url = raw.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise invalid_params("webhook_config.url is required and must be an http:// or https:// URL")
        headers = raw.get("headers") or {}
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise invalid_params("webhook_config.headers must be an object of string values")
        method = str(raw.get("method") or "POST").upper()
        if method not in METHODS:
            raise invalid_params(f"webhook_config.method must be one of {', '.join(METHODS)}")
        timeout = raw.get("timeout", 30.0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 300:
            raise invalid_params("webhook_config.timeout must be a number of seconds in (0, 300]")
        retries = raw.get("max_retries", 3)
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 10:
            raise invalid_params("webhook_config.max_retries must be an integer from 0 to 10")
        try:
            await ensure_public_url(url, settings.allow_private_urls)
        except UnsafeURLError as exc:
            raise invalid_params(f"webhook_config.url refused: {exc}") from None
        return cls(url=url, headers=dict(headers), method=method, timeout=float(timeout), max_retries=retries)


def webhook_payload(event: Mapping[str, Any]) -> dict[str, Any]:
    wire = wire_event(event)
    return {
        "protocol": "jsonrpc",
        "root_task_id": event["root_task_id"],
        "task_id": event["task_id"],
        "status": wire["status"],
        "progress": wire["progress"],
        "message": wire.get("message") or wire.get("error") or "",
        "type": wire["type"],
        "timestamp": wire["timestamp"],
        "final": event["type"] == FINAL,
        "result": run_summary(event),
        **({"task_result": wire["result"]} if event["type"] == TASK_COMPLETED else {}),
        **({"error": wire["error"]} if "error" in wire else {}),
    }


async def deliver_webhooks(events: AsyncIterable[Mapping[str, Any]] | BusSubscription, config: WebhookConfig,
                           traceparent: str | None = None) -> None:
    """Post each event until `final`. `events`: a bus subscription, or `follow.follow_execution`
    (which ends with `final` from the database even when the owner's own event never arrives).
    `traceparent` (traces on: the execution span's, agent/foundations/tracing.py) is sent with every post."""
    import httpx  # lazy: loads rich, click and pygments (httpx._main); not needed until a webhook is sent

    headers = {**config.headers, "traceparent": traceparent} if traceparent else config.headers
    async with httpx.AsyncClient(timeout=config.timeout, follow_redirects=False,
                                 verify=tls.shared_context(trust_env=True)) as client:
        try:
            async for event in events:
                await post_with_retries(client, config.method, config.url, webhook_payload(event), headers,
                                        max_retries=config.max_retries, backoff=config.backoff)
                if event["type"] == FINAL:
                    return
        finally:
            if isinstance(events, BusSubscription):
                events.close()
            else:
                await events.aclose()  # type: ignore[attr-defined]


async def post_with_retries(client: httpx.AsyncClient, method: str, url: str, payload: dict[str, Any],
                            headers: Mapping[str, str], *, max_retries: int = 3, backoff: float = 1.0) -> bool:
    """One callback, retried on 5xx and network errors after backoff, 2*backoff, 4*backoff ...
    seconds, never on 4xx. Shared by webhooks and A2A push notifications. True if delivered."""
    import httpx  # loaded with the caller's client already

    for attempt in range(max_retries + 1):
        if attempt:
            await asyncio.sleep(backoff * 2 ** (attempt - 1))
        try:
            response = await client.request(method, url, json=payload, headers=dict(headers))
        except httpx.HTTPError as exc:
            log.warning("callback %s attempt %d failed: %s", log_url(url), attempt + 1, type(exc).__name__)
            continue
        if response.status_code < 400:
            return True
        if response.status_code < 500:
            log.warning("callback %s answered %d; not retried", log_url(url), response.status_code)
            return False
        log.warning("callback %s answered %d (attempt %d)", log_url(url), response.status_code, attempt + 1)
    return False
