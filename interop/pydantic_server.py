"""pydantic-ai as a server: an `Agent` on its `TestModel` (no key) served by fasta2a's `agent_to_a2a`.

Runs in the `pydantic` venv (interop/pins/pydantic.txt). fasta2a answers a send with `submitted`
and stamps its statuses without a UTC offset (`2026-11-24T18:35:08.229795`): the shapes taskgrove's
a2a_agent_executor must accept. `TestModel(custom_output_text=...)` makes the answer known.

    python interop/pydantic_server.py PORT
"""

from __future__ import annotations

import sys

import uvicorn
from fasta2a.pydantic_ai import agent_to_a2a
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

ANSWER = "pydantic-ai says: the report is ready"

if __name__ == "__main__":
    port = int(sys.argv[1])
    agent = Agent(TestModel(custom_output_text=ANSWER), name="reporter")
    app = agent_to_a2a(agent, url=f"http://127.0.0.1:{port}")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
