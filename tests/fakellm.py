"""A fake OpenAI-compatible chat server on 127.0.0.1 for tests: nothing reaches the internet.

Point the service at it with `Settings(llm_base_url=fake.base_url)` (or SERVICE_LLM_BASE_URL).
The reply is chosen by a marker found in the newest user message that contains one:

- no marker: echo, `echo: <last user message>` (usage 10/5/15)
- `[[tree:valid]]`: a valid tree (llm_executor root + two llm_executor children + aggregate child),
  wrapped in prose and a ```json fence
- `[[tree:malformed]]`: broken JSON first; a valid tree once the repair request arrives
- `[[tree:repair]]`: a tree naming an unknown executor first; a valid tree on repair
- `[[tree:invalid]]`: a tree with two roots, every time
- `[[error:401]]`, `[[error:429]]`, `[[error:500]]`: that HTTP error
- `[[slow]]`: 40 words, streamed one per 0.1 s (non-streaming: the whole answer after 4 s)

Tests can also script replies: `fake.script("[[mine]]", [reply, ...])`; each request with that
marker takes the next reply (the last one repeats). A script named `model:<name>` answers every
request for that model first, whatever its messages (one model failing, another not). A reply is a string (the content) or a dict
with `content`, `status`, `usage`, `delay` (seconds before answering), `chunk_delay`,
`retry_after` (the Retry-After header of an error answer), `hold` (a gate's name: the answer waits
until the test calls `fake.release(name)`, so a test acts while a call is in flight, without timing).
Every request body (plus its `authorization` and `traceparent` headers, its `path` and
`received_at`, time.monotonic()) is appended to `fake.requests`. `/v1/messages` answers the same
replies in Anthropic's Messages format (for litellm's own HTTP path: ANTHROPIC_API_BASE=<root>).

Fixtures: `fake_llm_server` (one server per test session) and `fake_llm` (the same server, reset
for each test). tests/conftest.py registers this module as a plugin, so every test can use them.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

DEFAULT_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
MARKER = re.compile(r"\[\[([a-z0-9:_\-]+)\]\]")

VALID_TREE = [
    {"id": "root", "name": "aggregate_results_executor", "parent_id": None, "priority": 1,
     "inputs": {}, "dependencies": [{"id": "a", "required": True}, {"id": "b", "required": True}]},
    {"id": "a", "name": "llm_executor", "parent_id": "root", "priority": 1,
     "inputs": {"prompt": "Summarise topic A"}, "dependencies": []},
    {"id": "b", "name": "llm_executor", "parent_id": "root", "priority": 2,
     "inputs": {"prompt": "Summarise topic B"}, "dependencies": [{"id": "a", "required": False}]},
]
UNKNOWN_EXECUTOR_TREE = [dict(VALID_TREE[0]), dict(VALID_TREE[1], name="web_scraper_executor"), VALID_TREE[2]]
TWO_ROOTS_TREE = [dict(t) for t in VALID_TREE[:2]] + [dict(VALID_TREE[2], parent_id=None)]


def fenced(tree: Any) -> str:
    return "Here is the task tree you asked for:\n```json\n" + json.dumps(tree, indent=2) + "\n```\nDone."


def _is_repair(body: dict[str, Any]) -> bool:
    return any(m.get("role") == "assistant" for m in body.get("messages", []))


class FakeLLM:
    """The server's state and behaviour; thread-safe because the server runs in another thread."""

    def __init__(self, default_marker: str | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.scripts: dict[str, list[Any]] = {}
        self.gates: dict[str, threading.Event] = {}
        self.lock = threading.Lock()
        self.base_url = ""
        # The reply for messages without a marker (standalone use: `--default "[[tree:valid]]"`
        # makes every plain-language request plannable, as the TCK runs need).
        self.default_marker = default_marker

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.scripts.clear()
            for gate in self.gates.values():  # a call a test left held goes on (and is not counted)
                gate.set()
            self.gates.clear()

    def _gate(self, name: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(name, threading.Event())

    def release(self, name: str) -> None:
        """Let the calls held at gate `name` (a reply with `hold`) be answered, now and later."""
        self._gate(name).set()

    def script(self, marker: str, replies: list[Any]) -> None:
        with self.lock:
            self.scripts[marker] = list(replies)

    # -- choosing a reply -------------------------------------------------------------------

    def _marker(self, body: dict[str, Any]) -> str | None:
        for message in reversed(body.get("messages", [])):
            if message.get("role") != "user":
                continue
            content = message.get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            with self.lock:
                for marker in self.scripts:
                    if marker in text and not marker.startswith("model:"):
                        return marker
            found = MARKER.findall(text)
            if found:
                return f"[[{found[-1]}]]"
        return None

    def reply_for(self, body: dict[str, Any]) -> dict[str, Any]:
        by_model = f"model:{body.get('model')}"
        marker = by_model if by_model in self.scripts else self._marker(body) or self.default_marker
        with self.lock:
            queue = self.scripts.get(marker or "")
            if queue:
                reply = queue.pop(0) if len(queue) > 1 else queue[0]
                return reply if isinstance(reply, dict) else {"content": reply}
        repair = _is_repair(body)
        if marker == "[[tree:valid]]":
            return {"content": fenced(VALID_TREE)}
        if marker == "[[tree:malformed]]":
            return {"content": fenced(VALID_TREE) if repair else 'Sure! [{"id": "root", "name": oops'}
        if marker == "[[tree:repair]]":
            return {"content": fenced(VALID_TREE if repair else UNKNOWN_EXECUTOR_TREE)}
        if marker == "[[tree:invalid]]":
            return {"content": json.dumps(TWO_ROOTS_TREE)}
        if marker and marker.startswith("[[error:"):
            status = int(marker[len("[[error:"):-2])
            return {"status": status, "content": f"fake error {status}"}
        if marker == "[[slow]]":
            return {"content": " ".join(f"word{i}" for i in range(40)), "chunk_delay": 0.1, "delay": 4.0}
        last = next((m for m in reversed(body.get("messages", [])) if m.get("role") == "user"), {})
        return {"content": f"echo: {last.get('content', '')}"}

    # -- HTTP ---------------------------------------------------------------------------------

    async def _received(self, request: Request) -> tuple[dict[str, Any], dict[str, Any]]:
        """The request's body (recorded) and its reply, once the reply's gate (if any) opens."""
        body = await request.json()
        with self.lock:
            self.requests.append(dict(body, authorization=request.headers.get("authorization"),
                                      traceparent=request.headers.get("traceparent"), path=request.url.path,
                                      received_at=time.monotonic()))
        reply = self.reply_for(body)
        if reply.get("hold"):
            await asyncio.to_thread(self._gate(str(reply["hold"])).wait, 60)
        return body, reply

    @staticmethod
    def _error(reply: dict[str, Any], status: int, anthropic: bool = False) -> Response:
        kinds = {401: "invalid_api_key", 429: "rate_limit_exceeded"}
        error = {"message": reply.get("content", "error"), "type": kinds.get(status, "server_error"),
                 "code": kinds.get(status)}
        if anthropic:
            anthropic_kinds = {401: "authentication_error", 429: "rate_limit_error"}
            error = {"type": anthropic_kinds.get(status, "api_error"), "message": reply.get("content", "error")}
        headers = {"Retry-After": str(reply["retry_after"])} if "retry_after" in reply else None
        return JSONResponse({"type": "error", "error": error} if anthropic else {"error": error},
                            status_code=status, headers=headers)

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API (litellm's own HTTP client speaks it for `anthropic/` models;
        point ANTHROPIC_API_BASE here): the same replies as chat, without streaming."""
        body, reply = await self._received(request)
        status = int(reply.get("status", 200))
        if status != 200:
            return self._error(reply, status, anthropic=True)
        if body.get("stream"):
            return self._error({"content": "this fake does not stream on /v1/messages"}, 400, anthropic=True)
        usage = dict(reply.get("usage") or DEFAULT_USAGE)
        return JSONResponse({
            "id": "msg_fake", "type": "message", "role": "assistant", "model": body.get("model", "fake-model"),
            "content": [{"type": "text", "text": str(reply.get("content", ""))}], "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]},
        })

    async def chat(self, request: Request) -> Response:
        body, reply = await self._received(request)
        status = int(reply.get("status", 200))
        if status != 200:
            return self._error(reply, status)
        content = str(reply.get("content", ""))
        usage = dict(reply.get("usage") or DEFAULT_USAGE)
        model = body.get("model", "fake-model")
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunk_delay = float(reply.get("chunk_delay", 0.0))
            return StreamingResponse(self._sse(content, usage, model, include_usage, chunk_delay),
                                     media_type="text/event-stream")
        if reply.get("delay"):
            await asyncio.sleep(float(reply["delay"]))
        return JSONResponse({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": usage,
        })

    async def _sse(self, content: str, usage: dict[str, int], model: str, include_usage: bool,
                   chunk_delay: float) -> Any:
        def event(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> str:
            data = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()),
                    "model": model, "choices": choices, **(extra or {})}
            return f"data: {json.dumps(data)}\n\n"

        yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        for piece in re.findall(r"\S+\s*", content) or [content]:
            if chunk_delay:
                await asyncio.sleep(chunk_delay)
            yield event([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
        yield event([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        if include_usage:
            yield event([], {"usage": usage})
        yield "data: [DONE]\n\n"

    def app(self) -> Starlette:
        routes = [Route(path, self.chat, methods=["POST"]) for path in ("/v1/chat/completions", "/chat/completions")]
        routes.append(Route("/v1/messages", self.messages, methods=["POST"]))
        return Starlette(routes=routes)


class FakeLLMServer(FakeLLM):
    """FakeLLM served by uvicorn in a daemon thread on a free loopback port."""

    def start(self, port: int = 0) -> "FakeLLMServer":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60  # tests/deadlines.py's EVENT_WAIT (this file also runs standalone)
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake LLM server did not start")
            time.sleep(0.01)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)


@pytest.fixture(scope="session")
def fake_llm_server() -> Iterator[FakeLLMServer]:
    # The first LLM call of a process imports litellm: seconds of CPU, tens of seconds on a busy
    # machine, inside whatever the test measured or waited for (a tasks.create waits 30 s for its
    # tree). Tests of LLM work start with it imported; that the import stays lazy, off the start-up
    # path and off the network is proven in subprocesses (tests/test_llm_client.py,
    # tests/test_generate_rpc.py).
    import taskgrove.llm.client  # noqa: F401  (first: it keeps litellm off the network)
    import litellm  # noqa: F401

    server = FakeLLMServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fake_llm(fake_llm_server: FakeLLMServer) -> FakeLLMServer:
    fake_llm_server.reset()
    return fake_llm_server


def main(argv: list[str] | None = None) -> None:
    """Standalone: `python tests/fakellm.py [--port N] [--default MARKER]`; prints the base URL, serves
    until interrupted. Point a service at it with SERVICE_LLM_BASE_URL=<printed url> (make tck does)."""
    import argparse

    parser = argparse.ArgumentParser(description="fake OpenAI-compatible LLM server on 127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="port (default: any free one)")
    parser.add_argument("--default", dest="default_marker", default=None,
                        help='reply for messages without a marker, e.g. "[[tree:valid]]"')
    args = parser.parse_args(argv)
    server = FakeLLMServer(args.default_marker).start(args.port)
    print(server.base_url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
