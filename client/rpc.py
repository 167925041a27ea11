"""One JSON-RPC call to the service over a pooled httpx client: the envelope, the token, the
Idempotency-Key of a write, the answer turned into a result or an exception, and the retries.

Everything that goes over HTTP goes through `Connection.call`, so the rules of resending
(client/resend.py) and of errors (client/exceptions.py) hold for every method of both clients.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import uuid
from collections.abc import Mapping
from typing import Any

import httpx

from taskgrove.client.exceptions import (ProtocolError, TaskgroveError, Unreachable, from_http_status, from_rpc_error,
                                     parse_retry_after)
from taskgrove.client.resend import Retry, RetryEvent, Safety

log = logging.getLogger("taskgrove.client")

DEFAULT_URL = "http://127.0.0.1:8000"
URL_VARIABLE = "TASKGROVE_URL"
TOKEN_VARIABLE = "TASKGROVE_TOKEN"
IDEMPOTENCY_HEADER = "Idempotency-Key"
# tasks.create answers once its tree has run (at most SERVICE_CREATE_WAIT_TIMEOUT, 30 s by
# default), so a call may rightly take a while: the read timeout is well above that.
DEFAULT_TIMEOUT = httpx.Timeout(120.0, connect=10.0)
# Methods served on /system; the others on /tasks (SPEC.md, Endpoints).
SYSTEM_PREFIXES = ("system.", "config.", "examples.")
# Transport failures after which the request certainly did not reach the service.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def resolve_url(url: str | None) -> str:
    """The service's base URL: the argument, else TASKGROVE_URL, else http://127.0.0.1:8000."""
    chosen = url or os.environ.get(URL_VARIABLE) or DEFAULT_URL
    return chosen.rstrip("/")


def resolve_token(token: str | None) -> str | None:
    """The Bearer token: the argument, else TASKGROVE_TOKEN, else none."""
    return token or os.environ.get(TOKEN_VARIABLE) or None


class Connection:
    """The HTTP side of a client: one pooled httpx.AsyncClient for every call."""

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 timeout: float | httpx.Timeout | None = None, retry: Retry | None = None,
                 headers: Mapping[str, str] | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 verify: Any = True) -> None:
        self.url = resolve_url(url)
        self.token = resolve_token(token)
        self.retry = retry if retry is not None else Retry()
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else (
            DEFAULT_TIMEOUT if timeout is None else httpx.Timeout(timeout, connect=min(10.0, timeout)))
        self.headers = {**(dict(headers) if headers else {}), **self.auth_headers()}
        self._ids = itertools.count(1)
        self._http = httpx.AsyncClient(base_url=self.url, timeout=self.timeout, headers=self.headers,
                                       transport=transport, verify=verify,
                                       limits=httpx.Limits(max_connections=100, max_keepalive_connections=20))

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def close(self) -> None:
        await self._http.aclose()

    async def call(self, method: str, params: Any = None, *, safety: Safety,
                   idempotency_key: str | None = None, retry: Retry | None = None) -> Any:
        """The method's result (JSON); a TaskgroveError when the service refused it or gave no
        answer after the retries `retry` (default: the client's) allows for this call's `safety`."""
        policy = retry or self.retry
        path = "/system" if method.startswith(SYSTEM_PREFIXES) else "/tasks"
        headers: dict[str, str] = {}
        if safety.is_write:  # one key for every try of this call: a resend is the same request
            headers[IDEMPOTENCY_HEADER] = idempotency_key or uuid.uuid4().hex
        attempt = 0
        while True:
            attempt += 1
            body = {"jsonrpc": "2.0", "id": next(self._ids), "method": method,
                    "params": params if params is not None else {}}
            try:
                return await self._once(path, method, body, headers)
            except TaskgroveError as error:
                delay = policy.delay(attempt, error, safety)
                if delay is None:
                    raise
                log.info("%s: try %d failed (%s); trying again in %.1f s", method, attempt, error, delay)
                if policy.on_retry is not None:
                    policy.on_retry(RetryEvent(method, attempt, error, delay))
                await asyncio.sleep(delay)

    async def _once(self, path: str, method: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        try:
            response = await self._http.post(path, content=json.dumps(body, allow_nan=False).encode(),
                                             headers={"Content-Type": "application/json", **headers})
        except httpx.TransportError as exc:
            raise unreachable(self.url, exc, method) from None
        return answer(response, method)

    async def get_json(self, path: str) -> Any:
        """A GET of one of the service's plain JSON routes (the agent card)."""
        try:
            response = await self._http.get(path)
        except httpx.TransportError as exc:
            raise unreachable(self.url, exc, None) from None
        if response.status_code != 200:
            raise from_http_status(response.status_code, response.text)
        return response.json()


def unreachable(url: str, exc: httpx.TransportError, method: str | None) -> Unreachable:
    reason = str(exc) or type(exc).__name__
    return Unreachable(f"cannot reach the service at {url} ({reason})", maybe_sent=not isinstance(exc, NOT_SENT),
                       method=method)


def answer(response: httpx.Response, method: str) -> Any:
    """The result of a JSON-RPC answer, or the exception it stands for."""
    retry_after = parse_retry_after(response.headers.get("Retry-After"))
    try:
        document = response.json()
    except ValueError:
        raise from_http_status(response.status_code, response.text, retry_after=retry_after,
                               method=method) from None
    if not isinstance(document, dict) or ("result" not in document and "error" not in document):
        if response.status_code != 200:
            raise from_http_status(response.status_code, response.text, retry_after=retry_after, method=method)
        raise ProtocolError(f"the service did not answer JSON-RPC (HTTP {response.status_code}): is this a "
                            "taskgrove service?", http_status=response.status_code, method=method)
    if document.get("error") is not None:
        raise from_rpc_error(document["error"], http_status=response.status_code, retry_after=retry_after,
                             method=method)
    return document["result"]
