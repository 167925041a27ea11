"""pydantic-ai as a server: an `Agent` on its `TestModel` (no key) served by fasta2a's `agent_to_a2a`.

Runs in the `pydantic` venv (interop/pins/pydantic.txt). fasta2a answers a send with `submitted`
and stamps its statuses without a UTC offset (`2026-11-24T18:35:08.229795`): the shapes taskgrove's
a2a_agent_executor must accept. `TestModel(custom_output_text=...)` makes the answer known. The
block between the docs/interop.md markers is that page's snippet, word for word.

    python interop/pydantic_server.py PORT
"""

from __future__ import annotations

import sys

# docs/interop.md: pydantic-server
import uvicorn
from fasta2a.pydantic_ai import agent_to_a2a
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel


def serve(port: int) -> None:
    # TestModel answers without a model key; use any real model ("openai:gpt-4o", ...) instead.
    agent = Agent(TestModel(custom_output_text="pydantic-ai says: the report is ready"), name="reporter")
    app = agent_to_a2a(agent, url=f"http://127.0.0.1:{port}")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
# docs/interop.md: end


if __name__ == "__main__":
    serve(int(sys.argv[1]))
