"""Who is calling, carried into the SDK: our `CallContext` becomes the SDK's `ServerCallContext`.

POST `/` authenticates once (agent.surfaces.edge.call_context) and leaves the result on `request.state`.
The SDK builds its call context from the request through `CallerContextBuilder`, whose user is
our caller: the SDK's stores scope agent tasks and push configs by `user.user_name`, so each user
sees only their own agent tasks.
"""

from __future__ import annotations

from typing import Any

from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.routes import DefaultServerCallContextBuilder
from starlette.requests import Request

from taskgrove.agent.foundations.auth import Caller
from taskgrove.agent.foundations.calls import CallContext

# Keys on request.state (set by the POST / endpoint) and on ServerCallContext.state.
CALL_KEY = "taskgrove_call"
PUSH_KEY = "taskgrove_push"
# The A2A wire a request speaks when its method name does not tell (HTTP+JSON routes: "1.0").
WIRE_KEY = "taskgrove_wire"
# True when the request itself said to wait (0.3 `blocking: true`, 1.0 `returnImmediately: false`).
BLOCKING_KEY = "taskgrove_blocking"


class CallerUser(User):
    """Our caller as the SDK's user; anonymous callers share the owner scope ''."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    @property
    def is_authenticated(self) -> bool:
        return self.caller.authenticated

    @property
    def user_name(self) -> str:
        return self.caller.user_id or ""


def request_call(request: Request) -> CallContext:
    call = getattr(request.state, CALL_KEY, None)
    if not isinstance(call, CallContext):
        # Every route to the SDK passes our endpoint, which authenticates first; reaching this
        # means a route bypassed it, and guessing "anonymous" would bypass JWT.
        raise RuntimeError("agent request reached the SDK without being authenticated by POST /")
    return call


# Credentials stay out of the SDK's call context: it is logged (at debug level) by the SDK.
SECRET_HEADERS = frozenset({"authorization", "cookie", "x-llm-api-key"})


class CallerContextBuilder(DefaultServerCallContextBuilder):
    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        headers = context.state.get("headers") or {}
        context.state["headers"] = {k: v for k, v in headers.items() if k.lower() not in SECRET_HEADERS}
        context.state[CALL_KEY] = request_call(request)
        context.state[PUSH_KEY] = list(getattr(request.state, PUSH_KEY, None) or [])
        context.state[BLOCKING_KEY] = getattr(request.state, BLOCKING_KEY, False) is True
        context.state[WIRE_KEY] = getattr(request.state, WIRE_KEY, None)
        return context

    def build_user(self, request: Request) -> User:
        return CallerUser(request_call(request).caller)


def wire_for(context: ServerCallContext) -> str:
    """The wire of the request behind `context`: set by the transport, else told by the method name."""
    from taskgrove.agent.surfaces.a2a.envelope import wire_of

    return context.state.get(WIRE_KEY) or wire_of(context.state.get("method"))


def call_of(context: ServerCallContext) -> CallContext:
    """Our call context inside SDK code (executor, request context builder)."""
    call: Any = context.state.get(CALL_KEY)
    if not isinstance(call, CallContext):
        raise RuntimeError("SDK call context carries no taskgrove caller")
    return call
