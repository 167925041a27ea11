"""What every method handler is given and returns, on every surface: the call's context, the
handler's type, the envelope's limits and a streamed result.

Below the services and the surfaces alike: a service reads who calls (`CallContext.caller`) and the
limits of the call; a surface (JSON-RPC, A2A, GraphQL, MCP, WebSocket) builds the context from its
request (agent/surfaces/edge.py `call_context`) and renders what the handler returns.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from taskgrove.agent.foundations.auth import ANONYMOUS, Caller
from taskgrove.agent.foundations.errors import QuotaExceeded
from taskgrove.storage import jsonvalues

if TYPE_CHECKING:
    from starlette.requests import Request

# Defaults of SERVICE_MAX_BATCH and SERVICE_MAX_JSON_DEPTH, for callers that pass no limits.
DEFAULT_MAX_BATCH = 100


@dataclass(frozen=True)
class Limits:
    """The envelope's limits (Settings.max_batch, Settings.max_json_depth)."""

    max_batch: int = DEFAULT_MAX_BATCH
    max_json_depth: int = jsonvalues.DEFAULT_MAX_DEPTH


@dataclass
class CallContext:
    """What a handler knows about the call besides its params."""

    caller: Caller = ANONYMOUS
    # "jsonrpc" on /tasks and /system, "a2a" on / (the protocol marker of results).
    surface: str = "jsonrpc"
    # From X-LLM-API-KEY: this request only; repr=False keeps it out of any logged repr.
    llm_api_key: str | None = field(default=None, repr=False)
    llm_provider: str | None = None
    # The caller's W3C `traceparent` header when valid (agent/foundations/tracing.py parse_traceparent), else None.
    traceparent: str | None = None
    request: Request | None = field(default=None, repr=False)
    # The envelope's limits from the settings (agent.surfaces.edge.call_context fills them for every surface).
    limits: Limits = field(default_factory=Limits)
    # The params come from a request text jsonvalues.loads found nothing suspect in, parsed within
    # a depth limit no deeper than what may be stored: the value gate would find nothing in them.
    values_checked: bool = False
    # A quota refusal a surface turned into its own error on the way (the A2A SDK's request
    # context builder): the HTTP answer is then the quota's 429 (agent/surfaces/a2a/quota.py).
    refusal: QuotaExceeded | None = None
    # Told of every call answered: (method, outcome, seconds); Metrics.rpc_call (agent/surfaces/edge.py).
    observe: Callable[[str, str, float], None] | None = field(default=None, repr=False)


    def execution_call(self) -> dict[str, Any]:
        """What an execution started by this call remembers of it: who, their LLM key for this
        request only, and the trace to continue (the engine's `call`)."""
        return {"user_id": self.caller.user_id, "llm_api_key": self.llm_api_key, "llm_provider": self.llm_provider,
                "traceparent": self.traceparent}


Handler = Callable[[Any, CallContext], Awaitable[Any]]


@dataclass
class StreamReply:
    """A result to send first, then further JSON events, as `text/event-stream`."""

    first: Any
    events: AsyncIterator[Any]
    # Releases what `events` holds when the stream is never sent (a streaming call in a batch).
    close: Callable[[], None] | None = None



def typed(read: Callable[[Any], Any], operation: Callable[[Any, CallContext], Awaitable[Any]]) -> Handler:
    """A handler that reads the params with `read` and calls `operation` with the result. Not a
    coroutine itself (one frame less on every call): a params error raises where the caller
    awaits the handler, as the operation's own errors do."""
    def handler(params: Any, ctx: CallContext) -> Awaitable[Any]:
        return operation(read(params), ctx)

    return handler


def without_params(operation: Callable[[CallContext], Awaitable[Any]]) -> Handler:
    """A handler for an operation that takes no parameters: whatever params come are ignored."""
    def handler(_params: Any, ctx: CallContext) -> Awaitable[Any]:
        return operation(ctx)

    return handler
