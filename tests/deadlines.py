"""How long tests wait, in one place (issue 46, item 6: the suite holds on a busy machine).

A test waits for an event (a status reached, a frame received, a server up), never for a time: a
deadline only turns a hang into a clear failure, so it is generous. Two cores shared with other
workers and jobs stretch a step that takes 50 ms on a quiet machine to seconds; the first LLM call
imports litellm (several seconds of CPU on its own).
"""

from __future__ import annotations

# Waiting for something that is expected to happen: polling a status, a WebSocket frame, a
# subscriber's event, a server's start-up. Returns as soon as it happens; only a hang waits it out.
EVENT_WAIT = 60.0

# Read timeout of HTTP clients whose request may start heavy work (a plan by the LLM, a first
# import of litellm): never httpx's default 5 s.
HEAVY_WORK_TIMEOUT = 120.0
