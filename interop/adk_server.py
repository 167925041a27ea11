"""Google ADK as a server: an ADK agent exposed with `to_a2a`, for taskgrove's a2a_agent_executor.

Runs in the `adk` venv (interop/pins/adk.txt). The agent is a small `BaseAgent` that answers
without a model (`shout: <the text it got, upper-cased>`), so nothing needs a key. The block
between the docs/interop.md markers is that page's snippet, word for word.

    python interop/adk_server.py PORT
"""

from __future__ import annotations

import sys

# docs/interop.md: adk-server
from collections.abc import AsyncGenerator

import uvicorn
from google.adk.a2a.utils.agent_to_a2a import to_a2a
from google.adk.agents import BaseAgent
from google.adk.agents.invocation_context import InvocationContext
from google.adk.events import Event
from google.genai import types


class Shouter(BaseAgent):
    """Answers every message with its text upper-cased (no model needed)."""

    async def _run_async_impl(self, ctx: InvocationContext) -> AsyncGenerator[Event, None]:
        said = " ".join(p.text for p in (ctx.user_content.parts or []) if p.text) if ctx.user_content else ""
        yield Event(author=self.name, invocation_id=ctx.invocation_id,
                    content=types.Content(role="model", parts=[types.Part(text=f"shout: {said.upper()}")]))


def serve(port: int) -> None:
    app = to_a2a(Shouter(name="shouter", description="Upper-cases what it is told"), host="127.0.0.1", port=port)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
# docs/interop.md: end


if __name__ == "__main__":
    serve(int(sys.argv[1]))
