"""tasks/cancel of a remote A2A task without a running executor: the remote task of a task that
was parked on its question (executors/a2a_questions.py) when that task was cancelled or its wait
timed out. agent/services/remote_questions.py calls it with what the task's checkpoint holds.
The same guards as every call of a2a_agent_executor: the SSRF guard on each request, no proxy or
.netrc credentials from the environment, the tolerant transport.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import CancelTaskRequest

from taskgrove.executors import tls
from taskgrove.executors.a2a_lenient import LenientTransport
from taskgrove.executors.a2a_remote import _card_location
from taskgrove.executors.a2a_states import state_name
from taskgrove.executors.netguard import ensure_public_url, request_guard

CANCEL_TIMEOUT = 10.0


async def cancel_remote_task(agent_url: str, remote_task_id: str, headers: Mapping[str, str],
                             allow_private: bool) -> str:
    """tasks/cancel of `remote_task_id` at the agent of `agent_url` (a base or card URL), through
    the SSRF guard; returns the remote task's state after it. Raises on any failure (the caller logs)."""
    await ensure_public_url(agent_url, allow_private)
    async with httpx.AsyncClient(headers=dict(headers), timeout=CANCEL_TIMEOUT, follow_redirects=True,
                                 event_hooks={"request": [request_guard(allow_private)]}, trust_env=False,
                                 transport=LenientTransport(httpx.AsyncHTTPTransport(
                                     verify=tls.shared_context(trust_env=False), trust_env=False))) as http:
        base, card_path = _card_location(agent_url)
        card = await A2ACardResolver(http, base).get_agent_card(relative_card_path=card_path)
        client = ClientFactory(ClientConfig(streaming=False, polling=True, httpx_client=http)).create(card)
        try:
            task = await client.cancel_task(CancelTaskRequest(id=remote_task_id))
        finally:
            with contextlib.suppress(Exception):
                await client.close()
    return state_name(task.status.state)
