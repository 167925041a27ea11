"""Google ADK as a server that asks: an ADK agent served with `to_a2a` that stops for a person's answer.

Runs in the `adk` venv (interop/pins/adk.txt). ADK's human in the loop is a long-running tool: an
event whose function call is listed in `long_running_tool_ids` ends the A2A task in
`input-required`, its status message carrying the event's parts (here the question as text, and the
call as a data part). The answer is the next message of the same task and context, which ADK runs
in the same session; this agent, without a model (nothing needs a key), finds its own open call in
the session and takes the message's text as the answer: `refund approved: <answer>`.

taskgrove's a2a_agent_executor sees the question as a wait (`waiting.kind = agent_input`), and
`tasks.respond` sends the answer here (interop/orchestrate.py checks it).

    python interop/adk_asker.py PORT
"""

from __future__ import annotations

import sys
from collections.abc import AsyncGenerator

import uvicorn
from google.adk.a2a.utils.agent_to_a2a import to_a2a
from google.adk.agents import BaseAgent
from google.adk.agents.invocation_context import InvocationContext
from google.adk.events import Event
from google.genai import types

CALL = "ask_for_approval"


def _text(content: types.Content | None) -> str:
    return " ".join(p.text for p in (content.parts or []) if p.text) if content else ""


class Approver(BaseAgent):
    """Asks whether to refund what it was told about, then says what the answer was."""

    def _asked(self, ctx: InvocationContext) -> bool:
        """Whether this session already holds its question (so this message is the answer)."""
        return any(event.author == self.name and event.get_function_calls() for event in ctx.session.events)

    async def _run_async_impl(self, ctx: InvocationContext) -> AsyncGenerator[Event, None]:
        said = _text(ctx.user_content)
        if self._asked(ctx):
            yield Event(author=self.name, invocation_id=ctx.invocation_id,
                        content=types.Content(role="model", parts=[types.Part(text=f"refund approved: {said}")]))
            return
        call = types.FunctionCall(id=f"approval-{ctx.invocation_id}", name=CALL, args={"request": said})
        yield Event(author=self.name, invocation_id=ctx.invocation_id, long_running_tool_ids={call.id},
                    content=types.Content(role="model", parts=[types.Part(text=f"Approve the refund? ({said})"),
                                                              types.Part(function_call=call)]))


def serve(port: int) -> None:
    agent = Approver(name="approver", description="Refunds an order once a person approves it")
    uvicorn.run(to_a2a(agent, host="127.0.0.1", port=port), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    serve(int(sys.argv[1]))
