"""rest_executor: one HTTP request per task, with retries, size caps and the SSRF guard.

Outcome rules (so a tree can rely on them):
- 1xx/2xx/3xx: the task completes with `{status_code, headers, body, truncated, elapsed, attempts}`.
- 5xx and network errors (connection refused, timeouts, ...) are retried `retries` times with
  exponential backoff (0.5 s, 1 s, 2 s, ...); if the last attempt still fails the task fails.
- 4xx is the caller's mistake and is never retried: the task fails at once.
A failing status raises ExecutorError("HTTP 404 from <url>: <head of body>") rather than completing
with an error status, because dependants of a task should not run on a failed call.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit, urlunsplit
from typing import TYPE_CHECKING, Any

from taskgrove.executors.base import ExecutionContext, Executor, ExecutorError
from taskgrove.executors.netguard import UnsafeURLError, ensure_public_url, redact_url, request_guard
from taskgrove.executors import tls
from taskgrove.storage import jsonvalues

# httpx is imported where a request is made: at module level it would load with the executor
# registry at start-up, and with it rich, click and pygments (httpx._main, ~4 MB).
if TYPE_CHECKING:  # pragma: no cover
    import httpx

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
DEFAULT_MAX_BYTES = 1024 * 1024
_BODY_HEAD = 300


def log_url(url: str) -> str:
    """A URL as the task log shows it: no user:password, no query (which may carry a token) and
    no fragment."""
    try:
        return urlunsplit(urlsplit(redact_url(url))._replace(query="", fragment=""))
    except ValueError:
        return "(unparsable URL)"


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _auth(spec: Any) -> tuple[dict[str, str], httpx.Auth | None]:
    """Extra headers and httpx auth for inputs.auth. Never logged, never put in errors."""
    if spec is None:
        return {}, None
    if not isinstance(spec, dict):
        raise ExecutorError("auth must be an object", retryable=False)
    kind = str(spec.get("type", "")).lower()
    if kind == "bearer" and isinstance(spec.get("token"), str):
        return {"Authorization": f"Bearer {spec['token']}"}, None
    if kind == "basic" and isinstance(spec.get("username"), str):
        import httpx  # lazy (see the imports)

        return {}, httpx.BasicAuth(spec["username"], str(spec.get("password", "")))
    raise ExecutorError(
        'auth must be {"type": "bearer", "token": ...} or '
        '{"type": "basic", "username": ..., "password": ...}',
        retryable=False,
    )


class _Retryable(Exception):
    """An attempt failed in a way worth trying again; carries the final error message."""


class RestExecutor(Executor):
    """Sends one HTTP request and returns the response (see the module docstring for outcomes)."""

    id = "rest_executor"
    name = "REST call"
    extension = "http"
    description = (
        "HTTP request: inputs.method, url, headers, query, json|data, auth, timeout, retries, "
        "max_response_bytes. 4xx/5xx fail the task; 5xx and network errors are retried."
    )
    input_schema = {
        "type": "object",
        "required": ["url"],
        "properties": {
            "method": {"type": "string", "default": "GET"},
            "url": {"type": "string", "minLength": 1},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "query": {"type": "object"},
            "json": {},
            "data": {"type": "object"},
            "timeout": {"type": "number", "exclusiveMinimum": 0, "default": 30},
            "retries": {"type": "integer", "minimum": 0, "maximum": 10, "default": 2},
            "follow_redirects": {"type": "boolean", "default": True},
            "max_response_bytes": {"type": "integer", "minimum": 0, "default": DEFAULT_MAX_BYTES},
            "auth": {
                "oneOf": [
                    {
                        "type": "object",
                        "required": ["type", "token"],
                        "properties": {"type": {"const": "bearer"}, "token": {"type": "string"}},
                    },
                    {
                        "type": "object",
                        "required": ["type", "username"],
                        "properties": {
                            "type": {"const": "basic"},
                            "username": {"type": "string"},
                            "password": {"type": "string"},
                        },
                    },
                ]
            },
        },
        "not": {"required": ["json", "data"]},
    }

    # First retry delay in seconds; doubled for each further retry. Tests shrink it.
    backoff_base = 0.5
    # Between retries; a test replaces it on the class without touching asyncio for everyone.
    pause = staticmethod(asyncio.sleep)

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self._client: httpx.AsyncClient | None = None
        self._cancelled = False

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        url = inputs.get("url")
        if not isinstance(url, str) or not url:
            raise ExecutorError("url is required", retryable=False)
        method = str(inputs.get("method", "GET")).upper()
        if method not in METHODS:
            raise ExecutorError(f"method must be one of {', '.join(METHODS)}, got {method!r}", retryable=False)
        if "json" in inputs and "data" in inputs:
            raise ExecutorError("give either json or data as the request body, not both", retryable=False)
        timeout = float(inputs.get("timeout", 30))
        retries = int(inputs.get("retries", 2))
        cap = int(inputs.get("max_response_bytes", DEFAULT_MAX_BYTES))
        allow_private = bool(context.settings.allow_private_urls)
        try:
            await ensure_public_url(url, allow_private)
        except UnsafeURLError as exc:
            raise ExecutorError(str(exc), retryable=False) from None

        auth_headers, auth = _auth(inputs.get("auth"))
        # One key per attempt of this task (`<task id>:<execution id>:<attempt>`), the same on each HTTP retry inside
        # it: a server that honours the header applies the request once per attempt.
        headers = {"Idempotency-Key": context.idempotency_key, **(inputs.get("headers") or {}), **auth_headers}
        if context.traceparent:  # traces on: the callee's spans join the execution's trace
            headers["traceparent"] = context.traceparent
        request_kwargs: dict[str, Any] = {"headers": headers, "params": inputs.get("query")}
        if "json" in inputs:
            request_kwargs["json"] = inputs["json"]
        elif "data" in inputs:
            request_kwargs["data"] = inputs["data"]

        started = time.monotonic()
        import httpx  # lazy (see the imports)

        # trust_env=False: no proxy or .netrc credentials picked up from the service environment.
        self._client = httpx.AsyncClient(
            timeout=timeout,
            auth=auth,
            follow_redirects=bool(inputs.get("follow_redirects", True)),
            event_hooks={"request": [request_guard(allow_private)]},
            trust_env=False,
            verify=tls.shared_context(trust_env=False),
        )
        try:
            for attempt in range(retries + 1):
                try:
                    result = await self._attempt(method, url, request_kwargs, timeout, cap, context)
                except (_Retryable, RuntimeError) as exc:
                    if self._cancelled:  # cancel() closed the client under the request
                        raise ExecutorError("request cancelled") from None
                    if isinstance(exc, RuntimeError):
                        raise
                    if attempt == retries:
                        raise ExecutorError(str(exc)) from None
                    await self.pause(self.backoff_base * 2**attempt)
                    continue
                result["elapsed"] = round(time.monotonic() - started, 6)
                result["attempts"] = attempt + 1
                return result
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            await self._client.aclose()

    async def _attempt(
        self, method: str, url: str, kwargs: dict[str, Any], timeout: float, cap: int, context: ExecutionContext
    ) -> dict[str, Any]:
        """One request. Returns the result, raises _Retryable or ExecutorError. Its method, URL
        (without credentials or query) and status, or its failure, go to the task log."""
        import httpx  # lazy (see the imports); loaded by execute already

        assert self._client is not None
        shown = redact_url(url)
        logged = f"{method} {log_url(url)}"
        try:
            # asyncio.timeout bounds the whole attempt; httpx's timeout only bounds each phase.
            async with asyncio.timeout(timeout):
                async with self._client.stream(method, url, **kwargs) as response:
                    context.log_output("http", f"{logged} -> {response.status_code}")
                    body, truncated = await self._read(response, cap)
        except UnsafeURLError as exc:  # a redirect pointed somewhere private
            context.log_output("http", f"{logged} -> refused (private address)")
            raise ExecutorError(str(exc)) from None
        except TimeoutError:
            context.log_output("http", f"{logged} -> timed out")
            raise _Retryable(f"request to {shown} timed out after {timeout:g}s") from None
        except httpx.TimeoutException:
            context.log_output("http", f"{logged} -> timed out")
            raise _Retryable(f"request to {shown} timed out after {timeout:g}s") from None
        except httpx.TooManyRedirects:
            context.log_output("http", f"{logged} -> too many redirects")
            raise ExecutorError(f"too many redirects from {shown}") from None
        except httpx.TransportError as exc:
            context.log_output("http", f"{logged} -> {type(exc).__name__}")
            raise _Retryable(f"request to {shown} failed: {type(exc).__name__}: {exc}") from None
        except httpx.HTTPError as exc:
            context.log_output("http", f"{logged} -> {type(exc).__name__}")
            raise ExecutorError(f"request to {shown} failed: {exc}") from None

        try:
            text = body.decode(response.encoding or "utf-8", errors="replace")
        except LookupError:  # a charset Python does not know
            text = body.decode("utf-8", errors="replace")
        if response.status_code >= 400:
            message = f"HTTP {response.status_code} from {shown}: {text[:_BODY_HEAD].strip()}"
            if response.status_code >= 500:
                raise _Retryable(message)
            # 408, 425 and 429 say "later"; another attempt cannot fix any other client error.
            raise ExecutorError(message, retryable=response.status_code in (408, 425, 429))
        parsed: Any = text
        if not truncated and _is_json(response.headers.get("content-type", "")) and text:
            try:  # the JSON gate (storage.jsonvalues): bounded depth, our words, never a RecursionError
                parsed = jsonvalues.loads(text, jsonvalues.STORED_MAX_DEPTH, what="the response body").value
            except jsonvalues.JsonTextError:
                parsed = text
        return {
            "status_code": response.status_code,
            "headers": dict(response.headers),
            "body": parsed,
            "truncated": truncated,
        }

    @staticmethod
    async def _read(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
        """Read at most `cap` bytes of the (decoded) body; stop reading past it."""
        kept = bytearray()
        async for chunk in response.aiter_bytes():
            room = cap - len(kept)
            kept += chunk[: max(room, 0)]
            if len(chunk) > room:
                return bytes(kept), True
        return bytes(kept), False

    async def cancel(self) -> dict[str, Any] | None:
        """Close the client so the in-flight request is aborted at once."""
        self._cancelled = True
        if self._client is not None:
            await self._client.aclose()
        return None
