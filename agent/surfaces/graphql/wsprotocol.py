"""GraphQL over WebSocket, strict: a message that breaks the protocol closes the socket with the
protocol's close code, never an exception that drops the connection.

Why: strawberry's handlers index messages as dicts (`message["type"]`), so `[]`, `"x"` or a
subscribe whose payload is not an object raised TypeError and the connection was dropped without
a close frame. Each message is checked here first: `graphql-transport-ws` closes with 4400 and a
reason in our words (its specification's code for an invalid message); the legacy `graphql-ws`
protocol, which has no such code, answers a `connection_error` message and stays open. Anything
unexpected inside a handler is logged and closed with 1011 (internal error).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from typing import Any

from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import BaseGraphQLTransportWSHandler
from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler

from taskgrove.agent.surfaces.graphql.request import payload_problem
from taskgrove.agent.surfaces.graphql.resolvers import GraphQLContext
from taskgrove.storage import jsonvalues

log = logging.getLogger(__name__)

CLOSE_INVALID_MESSAGE = 4400
CLOSE_INTERNAL_ERROR = 1011
TRANSPORT_TYPES = ("connection_init", "ping", "pong", "subscribe", "complete")
LEGACY_TYPES = ("connection_init", "connection_terminate", "start", "stop")


def message_problem(message: Any, types: tuple[str, ...], subscribe: str, max_depth: int) -> str | None:
    """Why one client message breaks the protocol, or None. `subscribe` names the message type
    that carries a GraphQL request (`subscribe`, or `start` in the legacy protocol)."""
    if not isinstance(message, Mapping):
        return "Every message must be a JSON object with a 'type'"
    kind = message.get("type")
    if not isinstance(kind, str) or kind not in types:
        return f"'type' must be one of {', '.join(types)}"
    found = jsonvalues.problem(dict(message), "message")
    if found is not None:
        return found
    payload = message.get("payload")
    if kind == "connection_init" and payload is not None and not isinstance(payload, Mapping):
        return "The connection_init payload must be an object or null"
    if kind in (subscribe, "complete", "stop") and (not isinstance(message.get("id"), str) or not message["id"]):
        return f"A '{kind}' message needs an 'id' (a non-empty string)"
    if kind == subscribe:
        problem = payload_problem(payload, max_depth)
        if problem is not None:
            return str(problem.data)
    return None


async def guarded(websocket: Any, handling: Awaitable[None]) -> None:
    """Await a protocol handler; anything it raises is logged and closes with 1011, never a drop."""
    try:
        await handling
    except Exception:
        log.exception("GraphQL WebSocket message failed")
        await websocket.close(code=CLOSE_INTERNAL_ERROR, reason="internal error")


class StrictTransportWS(BaseGraphQLTransportWSHandler[GraphQLContext, None]):
    async def handle_message(self, message: Any) -> None:
        reason = message_problem(message, TRANSPORT_TYPES, "subscribe",
                                 self.view.max_json_depth)  # type: ignore[attr-defined]  # our view (view.py)
        if reason is not None:
            await self.handle_invalid_message(reason[:120])  # close 4400; a close reason is short
            return
        await guarded(self.websocket, super().handle_message(message))


class StrictLegacyWS(BaseGraphQLWSHandler[GraphQLContext, None]):
    async def handle_message(self, message: Any) -> None:
        reason = message_problem(message, LEGACY_TYPES, "start",
                                 self.view.max_json_depth)  # type: ignore[attr-defined]  # our view (view.py)
        if reason is not None:
            await self.send_message({"type": "connection_error", "payload": {"message": reason}})
            return
        await guarded(self.websocket, super().handle_message(message))
