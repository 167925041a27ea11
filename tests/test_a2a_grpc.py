"""The A2A gRPC transport (SERVICE_GRPC_PORT) against a real `taskgrove serve`, driven by the
official a2a-sdk client with its gRPC transport (and the raw stubs where a test needs a status
or metadata the client hides).

Same handler as JSON-RPC and HTTP+JSON: a tree sent over gRPC is read back on POST `/`; the same
rules: JWT from the `authorization` metadata, callers see only their own agent tasks, A2A errors
with the specification's status codes, never UNKNOWN with an exception's text.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import httpx
import pytest
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.client.client import ClientCallContext
from a2a.compat.v0_3 import a2a_v0_3_pb2, a2a_v0_3_pb2_grpc
from a2a.helpers.proto_helpers import new_data_part
from a2a.types import a2a_pb2_grpc
from a2a.types.a2a_pb2 import (
    AuthenticationInfo,
    CancelTaskRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.constants import TransportProtocol
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError
from google.protobuf.json_format import MessageToDict, ParseDict
from google.rpc import error_details_pb2, status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskgrove.agent.surfaces.a2a.grpc_server import serving
from taskgrove.agent.app import build_app
from taskgrove.agent.foundations.auth import mint_token
from taskgrove.agent.foundations.settings import Settings
from tests.deadlines import HEAVY_WORK_TIMEOUT
from tests.processes import Service
from tests.servers import free_port, receiver
from tests.test_a2a_wire import tree


# One worker runs this module (make test's --dist loadgroup): its module-scoped services are then
# started once, not once on each worker that gets some of its tests.
pytestmark = pytest.mark.xdist_group("test_a2a_grpc")

SECRET = "grpc-test-secret-" + "x" * 16
Code = grpc.StatusCode


def grpc_service(work: Path, name: str, **env: str) -> Service:
    service = Service(work, {"SERVICE_DATABASE_URL": f"sqlite:///{work / (name + '.db')}",
                             "SERVICE_GRPC_PORT": str(free_port()), **env}, name)
    service.grpc = f"127.0.0.1:{service.env['SERVICE_GRPC_PORT']}"  # type: ignore[attr-defined]
    return service


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = grpc_service(tmp_path_factory.mktemp("grpc"), "plain").start()
    yield service
    service.stop()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = grpc_service(tmp_path_factory.mktemp("grpc-jwt"), "jwt", SERVICE_JWT_SECRET=SECRET).start()
    yield service
    service.stop()


@asynccontextmanager
async def sdk_client(service: Service, *, streaming: bool, polling: bool = False) -> AsyncIterator[Client]:
    """The official client, resolving the card over HTTP and choosing its gRPC interface."""
    async with httpx.AsyncClient(timeout=30) as http:
        config = ClientConfig(streaming=streaming, polling=polling, httpx_client=http,
                              supported_protocol_bindings=[TransportProtocol.GRPC],
                              grpc_channel_factory=grpc.aio.insecure_channel)
        client = await ClientFactory(config).create_from_url(service.url)
        try:
            yield client
        finally:
            await client.close()


@asynccontextmanager
async def stub(service: Service) -> AsyncIterator[a2a_pb2_grpc.A2AServiceStub]:
    async with grpc.aio.insecure_channel(service.grpc) as channel:  # type: ignore[attr-defined]
        yield a2a_pb2_grpc.A2AServiceStub(channel)


def data_request(tasks: list[dict[str, Any]], *, immediately: bool = False) -> SendMessageRequest:
    message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[new_data_part({"tasks": tasks})])
    request = SendMessageRequest(message=message)
    if immediately:
        request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
    return request


def bearer(user: str) -> ClientCallContext:
    token = mint_token(Settings.from_env({"SERVICE_JWT_SECRET": SECRET}), user)
    return ClientCallContext(service_parameters={"authorization": f"Bearer {token}"})


async def collect(client: Client, request: SendMessageRequest,
                  context: ClientCallContext | None = None) -> list[StreamResponse]:
    return [event async for event in client.send_message(request, context=context)]


def status_details(error: grpc.aio.AioRpcError) -> list[Any]:
    """The google.rpc.Status details a 1.0 error carries (ErrorInfo, BadRequest)."""
    raw = dict(error.trailing_metadata() or ()).get("grpc-status-details-bin")
    status = status_pb2.Status.FromString(raw) if raw else status_pb2.Status()
    found = []
    for detail in status.details:
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest):
            if detail.Is(kind.DESCRIPTOR):
                message = kind()
                detail.Unpack(message)
                found.append(message)
    return found


# --- the card ---------------------------------------------------------------------------------

def test_card_declares_grpc_in_both_forms(plain: Service) -> None:
    v10 = httpx.get(plain.url + "/.well-known/agent-card.json", headers={"A2A-Version": "1.0"},
                    timeout=HEAVY_WORK_TIMEOUT).json()
    v03 = httpx.get(plain.url + "/.well-known/agent-card.json", timeout=HEAVY_WORK_TIMEOUT).json()
    grpc_address = plain.grpc  # type: ignore[attr-defined]
    assert [i for i in v10["supportedInterfaces"] if i["protocolBinding"] == "GRPC"] == [
        {"url": grpc_address, "protocolBinding": "GRPC", "protocolVersion": "1.0"},
        {"url": grpc_address, "protocolBinding": "GRPC", "protocolVersion": "0.3"}]
    assert "additionalInterfaces" not in v10
    assert v03["additionalInterfaces"] == [{"transport": "GRPC", "url": grpc_address}]
    assert v03["url"] == plain.url and v03["preferredTransport"] == "JSONRPC"


# --- sends, get, cancel -----------------------------------------------------------------------

async def test_a_data_part_tree_runs_and_reads_back_on_every_transport(plain: Service) -> None:
    tasks = tree()
    root_id = tasks[0]["id"]
    async with sdk_client(plain, streaming=False) as client:
        (response,) = await collect(client, data_request(tasks))
        task = response.task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert task.context_id == root_id
        results = MessageToDict(task.artifacts[0].parts[0].data)
        assert {t["name"]: t["status"] for t in results["tasks"]} == \
            {"root": "completed", "child-a": "completed", "child-b": "completed"}
        again = await client.get_task(GetTaskRequest(id=task.id))
    assert again.status.state == TaskState.TASK_STATE_COMPLETED
    assert again.artifacts == task.artifacts
    # One request handler behind all three transports: the gRPC task is there on JSON-RPC.
    async with httpx.AsyncClient(timeout=HEAVY_WORK_TIMEOUT) as http:
        answer = (await http.post(plain.url + "/", headers={"A2A-Version": "1.0"}, json={
            "jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task.id}})).json()
    assert answer["result"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert (await plain.task(root_id))["status"] == "completed"


async def test_streaming_send_reports_progress_and_ends_with_the_results(plain: Service) -> None:
    async with sdk_client(plain, streaming=True) as client:
        # 1 s, not 0.3: three updates at most 0.1 s apart even if the loop stalls (test_a2a_client's twin).
        events = await collect(client, data_request(tree(seconds=1.0)))
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task"
    assert events[0].task.status.state == TaskState.TASK_STATE_WORKING
    working = [e for e in events if e.HasField("status_update")
               and e.status_update.status.state == TaskState.TASK_STATE_WORKING]
    assert len(working) >= 3
    assert kinds[-2:] == ["artifact_update", "status_update"]
    artifact = events[-2].artifact_update
    assert artifact.last_chunk is True  # a whole artifact: every client keeps it (issue 27, item 1)
    assert {t["status"] for t in MessageToDict(artifact.artifact.parts[0].data)["tasks"]} == {"completed"}
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_cancel_stops_a_running_tree(plain: Service) -> None:
    tasks = tree(seconds=60)
    root_id, sleeper = tasks[0]["id"], tasks[2]["id"]
    async with sdk_client(plain, streaming=False) as client:
        (response,) = await collect(client, data_request(tasks, immediately=True))
        running = response.task
        assert running.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
        await plain.wait_status(sleeper, ("in_progress",))
        cancelled = await client.cancel_task(CancelTaskRequest(id=running.id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        assert (await plain.tree_statuses(root_id)) == \
            {root_id: "cancelled", tasks[1]["id"]: "completed", sleeper: "cancelled"}
        with pytest.raises(TaskNotCancelableError):  # FAILED_PRECONDITION, read back as the A2A error
            await client.cancel_task(CancelTaskRequest(id=running.id))


async def test_push_notifications_of_a_grpc_send_are_1_0_stream_responses(plain: Service) -> None:
    tasks = tree(seconds=0.2)
    request = data_request(tasks)
    request.message.metadata.update({"push_notification_config": {"headers": {"X-Custom": "yes"}, "method": "PUT"}})
    async with receiver() as rec, sdk_client(plain, streaming=False) as client:
        request.configuration.task_push_notification_config.CopyFrom(TaskPushNotificationConfig(
            url=f"{rec.url}/hook", token="tok-42", authentication=AuthenticationInfo(scheme="Bearer", credentials="c-7")))
        (response,) = await collect(client, request)
        assert response.task.status.state == TaskState.TASK_STATE_WORKING  # a push config: answered at once
        await rec.wait_for(lambda reqs: any(
            r["json"].get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_COMPLETED" for r in reqs))
        configs = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=response.task.id))
    assert [c.url for c in configs.configs] == [f"{rec.url}/hook"]
    for sent in rec.requests:
        assert (sent["method"], sent["path"]) == ("PUT", "/hook")
        assert sent["headers"]["x-custom"] == "yes" and sent["headers"]["authorization"] == "Bearer c-7"
        assert sent["headers"]["x-a2a-notification-token"] == "tok-42"
        ParseDict(sent["json"], StreamResponse())  # a 1.0 body, as a 1.0 receiver reads it
    (artifact,) = [r["json"]["artifactUpdate"] for r in rec.requests if "artifactUpdate" in r["json"]]
    assert artifact["artifact"]["parts"][0]["data"]["root_task_id"] == tasks[0]["id"]


# --- refusals ---------------------------------------------------------------------------------

async def test_unknown_task_is_not_found_with_error_info(plain: Service) -> None:
    async with sdk_client(plain, streaming=False) as client:
        with pytest.raises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id="no-such-task"))
    async with stub(plain) as raw:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw.GetTask(GetTaskRequest(id="no-such-task"))
    assert caught.value.code() == Code.NOT_FOUND
    (info,) = status_details(caught.value)
    assert info.reason == "TASK_NOT_FOUND" and info.domain == "a2a-protocol.org"


@pytest.mark.parametrize(("parts", "code", "words"), [
    ([], Code.INVALID_ARGUMENT, "parts"),  # the SDK's own check of the message
    ([Part(text="run something")], Code.INVALID_ARGUMENT, "application/json"),  # no LLM: text refused (-32005)
    ([new_data_part({"tasks": "not a list"})], Code.INVALID_ARGUMENT, "tasks"),
])
async def test_bad_messages_get_invalid_argument_naming_the_problem(plain: Service, parts: list[Part],
                                                                    code: Code, words: str) -> None:
    message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=parts)
    async with stub(plain) as raw:
        for call in (raw.SendMessage, raw.SendStreamingMessage):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                answer = call(SendMessageRequest(message=message))
                if hasattr(answer, "__aiter__"):
                    [event async for event in answer]
                else:
                    await answer
            assert caught.value.code() == code, caught.value
            assert words in caught.value.details()
            details = status_details(caught.value)
            assert details[0].reason in ("INVALID_PARAMS", "CONTENT_TYPE_NOT_SUPPORTED")
            if not parts:  # the SDK's validation: the field also as a BadRequest violation
                assert [v.field for v in details[1].field_violations] == ["message.parts"]


async def test_an_unsupported_version_is_unimplemented_as_the_spec_says(plain: Service) -> None:
    async with stub(plain) as raw:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw.SendMessage(data_request(tree()), metadata=[("a2a-version", "99.0")])
        assert caught.value.code() == Code.UNIMPLEMENTED
        assert status_details(caught.value)[0].reason == "VERSION_NOT_SUPPORTED"
        answer = await raw.SendMessage(data_request(tree()), metadata=[("a2a-version", "1.0")])
    assert answer.task.status.state == TaskState.TASK_STATE_COMPLETED


async def test_an_unusable_llm_key_metadata_is_invalid_argument(plain: Service) -> None:
    async with stub(plain) as raw:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw.GetTask(GetTaskRequest(id="any"), metadata=[("x-llm-api-key", "openai:")])
    assert caught.value.code() == Code.INVALID_ARGUMENT
    assert caught.value.details().startswith("X-LLM-API-KEY header is empty")


async def test_a_finished_task_takes_no_follow_up_unimplemented(plain: Service) -> None:
    async with stub(plain) as raw:
        done = (await raw.SendMessage(data_request(tree()))).task
        follow_up = data_request(tree())
        follow_up.message.task_id = done.id
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw.SendMessage(follow_up)
    assert caught.value.code() == Code.UNIMPLEMENTED  # UnsupportedOperationError (spec table)
    assert "takes no further message" in caught.value.details()


async def test_an_exception_that_is_no_a2a_error_is_internal_without_its_text(make_settings: Any) -> None:
    """The last net (CallGuard), on a server whose request handler fails as no A2A code would."""

    class Failing:
        async def on_get_task(self, *_: Any) -> Any:
            raise RuntimeError("secret detail from deep inside")

        async def on_message_send_stream(self, *_: Any) -> AsyncIterator[Any]:
            raise KeyError("another secret")
            yield  # an async generator, as the SDK's handler is

    port = free_port()
    services = build_app(make_settings({"SERVICE_API_HOST": "127.0.0.1", "SERVICE_GRPC_PORT": str(port)})).state.services
    async with serving(services, Failing()), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        raw = a2a_pb2_grpc.A2AServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await raw.GetTask(GetTaskRequest(id="t"))
        with pytest.raises(grpc.aio.AioRpcError) as streamed:
            [event async for event in raw.SendStreamingMessage(data_request(tree()))]
    for caught in (unary, streamed):
        assert caught.value.code() == Code.INTERNAL
        assert caught.value.details() == "The request failed on the server; see the service log"


# --- authentication and users -----------------------------------------------------------------

async def test_jwt_on_a_call_without_a_token_is_unauthenticated(guarded: Service) -> None:
    async with stub(guarded) as raw:
        for metadata in ((), (("authorization", "Bearer not-a-jwt"),), (("authorization", "Basic abc"),)):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await raw.SendMessage(data_request(tree()), metadata=metadata)
            assert caught.value.code() == Code.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                [event async for event in raw.SendStreamingMessage(data_request(tree()), metadata=metadata)]
            assert caught.value.code() == Code.UNAUTHENTICATED
    assert "Missing token" in caught.value.details() or "Malformed" in caught.value.details()


async def test_jwt_on_each_user_sees_only_their_own_agent_tasks(guarded: Service) -> None:
    async with sdk_client(guarded, streaming=False) as client:
        (response,) = await collect(client, data_request(tree()), bearer("alice"))
        task = response.task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        mine = await client.get_task(GetTaskRequest(id=task.id), context=bearer("alice"))
        assert mine.id == task.id
        with pytest.raises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id=task.id), context=bearer("bob"))
    async with sdk_client(guarded, streaming=True) as client:
        events = await collect(client, data_request(tree()), bearer("bob"))
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


# --- the 0.3 service on the same port ---------------------------------------------------------

async def test_the_0_3_grpc_service_runs_a_tree(plain: Service) -> None:
    message = a2a_v0_3_pb2.Message(role=a2a_v0_3_pb2.ROLE_USER, message_id=uuid.uuid4().hex)
    message.content.add().data.data.update({"tasks": tree()})
    async with grpc.aio.insecure_channel(plain.grpc) as channel:  # type: ignore[attr-defined]
        raw = a2a_v0_3_pb2_grpc.A2AServiceStub(channel)
        answer = await raw.SendMessage(a2a_v0_3_pb2.SendMessageRequest(request=message))
        assert answer.task.status.state == a2a_v0_3_pb2.TASK_STATE_COMPLETED
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw.GetTask(a2a_v0_3_pb2.GetTaskRequest(name="tasks/no-such-task"))
    assert caught.value.code() == Code.NOT_FOUND


# --- any input --------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
payloads = st.dictionaries(st.sampled_from(["tasks", "name", "x", ""]), json_values, max_size=3)
ANSWERED = {Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.UNIMPLEMENTED, Code.FAILED_PRECONDITION}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=payloads, task_id=st.one_of(st.just(""), st.text(max_size=12)), text=st.one_of(st.none(), st.text()))
def test_any_message_is_answered_or_refused_with_an_a2a_status(plain: Service, data: dict[str, Any],
                                                                task_id: str, text: str | None) -> None:
    """Whatever a message holds, the answer is a task or an A2A refusal: never INTERNAL or UNKNOWN."""
    parts = [new_data_part(data)] + ([Part(text=text)] if text is not None else [])
    message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=parts, task_id=task_id)

    async def send() -> None:
        async with stub(plain) as raw:
            try:
                answer = await raw.SendMessage(SendMessageRequest(message=message), timeout=60)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() in ANSWERED, (exc.code(), exc.details(), json.dumps(data)[:200])
                assert "Traceback" not in (exc.details() or "")
            else:
                assert answer.task.id

    asyncio.run(send())


# --- shutdown ---------------------------------------------------------------------------------

async def test_sigterm_with_an_open_stream_exits_0_promptly(tmp_path: Path) -> None:
    service = grpc_service(tmp_path, "term").start()
    async with stub(service) as raw:
        stream = raw.SendStreamingMessage(data_request(tree(seconds=600)))
        first = await stream.read()
        assert first.task.status.state == TaskState.TASK_STATE_WORKING
        started = time.monotonic()
        code = await asyncio.to_thread(service.stop)  # SERVICE_SHUTDOWN_GRACE_SECONDS=2 (tests/processes.py)
        took = time.monotonic() - started
        stream.cancel()
    assert code == 0, service.log()
    assert took < 15, took


# --- quotas (agent/services/admission.py): RESOURCE_EXHAUSTED, the gRPC form of HTTP 429 -------------------

def quota_details(error: grpc.aio.AioRpcError) -> tuple[error_details_pb2.ErrorInfo, error_details_pb2.RetryInfo]:
    raw = dict(error.trailing_metadata() or ()).get("grpc-status-details-bin")
    info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
    for detail in status_pb2.Status.FromString(raw).details:
        detail.Unpack(info) if detail.Is(info.DESCRIPTOR) else detail.Unpack(retry)
    return info, retry


async def test_over_the_request_rate_a_call_is_resource_exhausted_with_retry_info(tmp_path: Path) -> None:
    service = grpc_service(tmp_path, "rate", SERVICE_JWT_SECRET=SECRET, SERVICE_RATE_LIMIT_PER_USER="0.2",
                           SERVICE_RATE_LIMIT_BURST="2").start()
    try:
        async with stub(service) as raw:
            alice = (("authorization", bearer("alice").service_parameters["authorization"]),)
            for _ in range(2):  # the burst
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await raw.GetTask(GetTaskRequest(id="none"), metadata=alice)
                assert caught.value.code() == Code.NOT_FOUND
            for call in (raw.GetTask(GetTaskRequest(id="none"), metadata=alice),
                         raw.SendMessage(data_request(tree()), metadata=alice)):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call
                assert caught.value.code() == Code.RESOURCE_EXHAUSTED, caught.value
                assert "SERVICE_RATE_LIMIT_PER_USER" in caught.value.details()
                info, retry = quota_details(caught.value)
                assert info.reason == "QUOTA_EXCEEDED" and info.metadata["setting"] == "SERVICE_RATE_LIMIT_PER_USER"
                assert retry.retry_delay.seconds >= 1
            bob = (("authorization", bearer("bob").service_parameters["authorization"]),)
            with pytest.raises(grpc.aio.AioRpcError) as caught:  # another user: still within his own rate
                await raw.GetTask(GetTaskRequest(id="none"), metadata=bob)
            assert caught.value.code() == Code.NOT_FOUND
    finally:
        service.stop()


async def test_over_the_pending_quota_a_tree_is_resource_exhausted_and_nothing_is_stored(tmp_path: Path) -> None:
    service = grpc_service(tmp_path, "pending", SERVICE_JWT_SECRET=SECRET, SERVICE_MAX_PENDING_PER_USER="4").start()
    try:
        async with stub(service) as raw:
            alice = (("authorization", bearer("alice").service_parameters["authorization"]),)
            await raw.SendMessage(data_request(tree(seconds=600), immediately=True), metadata=alice)  # 3 unfinished
            refused = tree()

            async def streamed() -> list[Any]:
                return [e async for e in raw.SendStreamingMessage(data_request(refused), metadata=alice)]

            async def sent() -> Any:
                return await raw.SendMessage(data_request(refused), metadata=alice)

            for call in (sent, streamed):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call()
                assert caught.value.code() == Code.RESOURCE_EXHAUSTED, caught.value
                info, retry = quota_details(caught.value)
                assert info.metadata["setting"] == "SERVICE_MAX_PENDING_PER_USER" and retry.retry_delay.seconds >= 1
        token = bearer("alice").service_parameters["authorization"]
        answer = httpx.post(f"{service.url}/tasks", headers={"Authorization": token}, timeout=30, json={
            "jsonrpc": "2.0", "id": 1, "method": "tasks.get", "params": {"task_id": refused[0]["id"]}}).json()
        assert answer["result"] is None, answer  # nothing of the refused tree was stored
    finally:
        service.stop()
