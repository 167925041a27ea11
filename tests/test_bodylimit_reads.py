"""agent.surfaces.bodylimit.BodyLimit driven with ASGI messages directly: a body in one message, one in
several, an announced size over the drain limit, a client that leaves."""

from __future__ import annotations

from typing import Any

from taskgrove.agent.surfaces.bodylimit import BodyLimit


async def _run(messages: list[dict[str, Any]], length: int | None = None) -> tuple[list[dict[str, Any]], bytes | None, int]:
    """What BodyLimit(max_bytes=10) sends, the body the app got (None: not called), messages read."""
    queue = list(messages)
    read = 0
    sent: list[dict[str, Any]] = []
    got: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        read += 1
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def app(_scope: Any, inner: Any, _send: Any) -> None:
        got.append((await inner())["body"])

    headers = [] if length is None else [(b"content-length", str(length).encode())]
    scope = {"type": "http", "path": "/tasks", "headers": headers}
    await BodyLimit(app, max_bytes=10)(scope, receive, send)
    return sent, (got[0] if got else None), read


def _body(data: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.request", "body": data, "more_body": more}


async def test_bodies_within_the_limit_are_handed_on_whole() -> None:
    assert (await _run([_body(b"[1, 2]")], 6))[1:] == (b"[1, 2]", 1)
    assert (await _run([_body(b"[1,", True), _body(b" 2]")]))[1:] == (b"[1, 2]", 2)


async def test_over_the_limit_is_413_in_one_message_or_several() -> None:
    for messages in ([_body(b"x" * 11)], [_body(b"x" * 6, True), _body(b"x" * 6)]):
        sent, got, _ = await _run(messages)
        assert sent[0]["status"] == 413 and got is None


async def test_an_announced_size_over_the_drain_limit_is_413_without_reading_on() -> None:
    sent, got, read = await _run([_body(b"x", True)] * 100, length=41)
    assert sent[0]["status"] == 413 and got is None and read <= 1
    sent, got, read = await _run([{"type": "http.disconnect"}], length=41)
    assert sent[0]["status"] == 413 and got is None


async def test_a_client_that_leaves_is_not_answered() -> None:
    assert await _run([{"type": "http.disconnect"}]) == ([], None, 1)
    assert await _run([_body(b"x", True), {"type": "http.disconnect"}]) == ([], None, 2)
