"""The A2A gRPC transport: the a2a-sdk's gRPC servicers on SERVICE_GRPC_PORT, off by default.

Both wires' services, 1.0 (`lf.a2a.v1.A2AService`, the SDK's GrpcHandler) and 0.3 (`a2a.v1.A2AService`,
its CompatGrpcHandler), listen on one port, SERVICE_API_HOST:SERVICE_GRPC_PORT, with server
reflection, and call the very request handler POST `/` and `/a2a` call (agent.surfaces.a2a.front builds it
once): the same executor, stores, push sender and rules. What differs is only how a call says
who it is and how a refusal is said:

- the caller comes from the call's metadata, as from HTTP headers: `authorization: Bearer <JWT>`
  (no token while JWT is on: UNAUTHENTICATED), `x-llm-api-key`; the SDK's stores then scope agent
  tasks and push configs by that user, as on the other transports;
- `a2a-version` on the 1.0 service must be 1.x (absent is fine): VersionNotSupportedError;
- A2A errors get the status codes of the 1.0 specification's table (section "Error code
  mappings"; the SDK says FAILED_PRECONDITION where it says UNIMPLEMENTED) with the ErrorInfo
  detail the SDK adds; an exception that is not an A2A error is INTERNAL with a message of ours,
  never its text, and its traceback goes to the log;
- the database going away (storage/outage.py, asked first; the SDK's internal error of a call
  that met it, as on HTTP) is `UNAVAILABLE` with an ErrorInfo `DATABASE_UNAVAILABLE` naming the
  reason and a RetryInfo with the wait (agent/surfaces/a2a/unavailable.py), never INTERNAL.

A push config's `headers`/`method` come through `metadata.push_notification_config` (as from the
official 1.0 client on JSON; the JSON-only fields beside the standard config have no protobuf
field), and a send with a push config is always answered at once (BLOCKING_KEY stays False: a
protobuf bool cannot tell `returnImmediately: false` from unset); the Idempotency-Key header of
message/send is an HTTP header, not read here.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import grpc.aio
from a2a.compat.v0_3 import a2a_v0_3_pb2, a2a_v0_3_pb2_grpc
from a2a.compat.v0_3.grpc_handler import CompatGrpcHandler
from a2a.extensions.common import HTTP_EXTENSION_HEADER, get_requested_extensions
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import RequestHandler
from a2a.server.request_handlers.grpc_handler import GrpcHandler, GrpcServerCallContextBuilder
from a2a.types import a2a_pb2, a2a_pb2_grpc
from a2a.utils import errors as sdk_errors
from a2a.utils.grpc_status import status_to_grpc
from a2a.utils.proto_utils import validation_errors_to_bad_request
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_reflection.v1alpha import reflection

from taskgrove.agent.surfaces.a2a.caller_context import BLOCKING_KEY, CALL_KEY, PUSH_KEY, SECRET_HEADERS, WIRE_KEY, CallerUser
from taskgrove.agent.surfaces.a2a.envelope import WIRE_0_3, WIRE_1_0
from taskgrove.agent.foundations.auth import AuthError
from taskgrove.agent.surfaces.edge import header_context
from taskgrove.agent.foundations.errors import DatabaseUnavailable, QuotaExceeded, RpcError, database_unavailable
from taskgrove.agent.surfaces.a2a import unavailable
from taskgrove.storage.outage import met_so_far, watching
from taskgrove.agent.foundations.calls import CallContext

if TYPE_CHECKING:  # pragma: no cover
    from taskgrove.agent.surfaces.a2a.a2a_needs import A2AServices

log = logging.getLogger(__name__)

SERVICE_1_0 = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"].full_name
SERVICE_0_3 = a2a_v0_3_pb2.DESCRIPTOR.services_by_name["A2AService"].full_name
VERSION_METADATA = "a2a-version"
INTERNAL_DETAIL = "The request failed on the server; see the service log"
# The called method's name (`SendStreamingMessage`), set by CallGuard: the servicer context
# does not carry it, and the handler plans a streamed tree differently (agent.surfaces.a2a.message_tree).
METHOD: ContextVar[str] = ContextVar("taskgrove_grpc_method", default="")
# The call's own context (set by the context builder): a quota refusal met inside the SDK is
# noted on it (agent.surfaces.a2a.message_tree), and abort() answers that refusal instead of the SDK's error.
CALL: ContextVar["CallContext | None"] = ContextVar("taskgrove_grpc_call", default=None)

Code: TypeAlias = grpc.StatusCode
# The A2A 1.0 specification's gRPC status for each A2A error (JSON-RPC errors without an A2A
# meaning, such as InvalidParams, map as the SDK maps them).
SPEC_CODES: dict[type[sdk_errors.A2AError], Code] = {
    sdk_errors.TaskNotFoundError: Code.NOT_FOUND,
    sdk_errors.TaskNotCancelableError: Code.FAILED_PRECONDITION,
    sdk_errors.PushNotificationNotSupportedError: Code.UNIMPLEMENTED,
    sdk_errors.UnsupportedOperationError: Code.UNIMPLEMENTED,
    sdk_errors.ContentTypeNotSupportedError: Code.INVALID_ARGUMENT,
    sdk_errors.InvalidAgentResponseError: Code.INTERNAL,
    sdk_errors.ExtendedAgentCardNotConfiguredError: Code.FAILED_PRECONDITION,
    sdk_errors.ExtensionSupportRequiredError: Code.FAILED_PRECONDITION,
    sdk_errors.VersionNotSupportedError: Code.UNIMPLEMENTED,
    sdk_errors.InvalidParamsError: Code.INVALID_ARGUMENT,
    sdk_errors.InvalidRequestError: Code.INVALID_ARGUMENT,
    sdk_errors.MethodNotFoundError: Code.UNIMPLEMENTED,
    sdk_errors.InternalError: Code.INTERNAL,
}


class Refused(sdk_errors.A2AError):
    """A refusal before the request handler runs that is no A2A error (UNAUTHENTICATED, or
    RESOURCE_EXHAUSTED with the quota's details when `quota` is given)."""

    def __init__(self, code: Code, message: str, quota: QuotaExceeded | None = None) -> None:
        super().__init__(message=message)
        self.code = code
        self.quota = quota


def metadata_of(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's text metadata as lower-case headers (the first value of a repeated key)."""
    headers: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, str):
            headers.setdefault(key.lower(), value)
    return headers


class CallerGrpcContextBuilder(GrpcServerCallContextBuilder):
    """Our caller from the call's metadata, in the state our handler and executor read
    (the gRPC form of agent.surfaces.a2a.caller_context.CallerContextBuilder)."""

    def __init__(self, services: "A2AServices", wire: str) -> None:
        self._services = services
        self._wire = wire

    def build(self, context: grpc.aio.ServicerContext) -> ServerCallContext:
        headers = metadata_of(context)
        version = headers.get(VERSION_METADATA, "").strip()
        if self._wire == WIRE_1_0 and version and not version.startswith("1"):
            raise sdk_errors.VersionNotSupportedError(
                message=f"A2A version {version!r} is not supported by this service: it speaks 1.0 here "
                        f"({SERVICE_1_0}) and 0.3 on {SERVICE_0_3}")
        try:
            call = header_context(headers, {}, self._services, "a2a")
        except RpcError as exc:  # an unusable x-llm-api-key
            raise sdk_errors.InvalidParamsError(message=exc.message) from None
        if isinstance(call, AuthError):
            raise Refused(Code.UNAUTHENTICATED, str(call))
        refusal = self._services.admission.admit_request(call, address=peer_host(context))
        if refusal is not None:
            raise Refused(Code.RESOURCE_EXHAUSTED, refusal.message, quota=refusal)
        CALL.set(call)
        state: dict[str, Any] = {
            "headers": {k: v for k, v in headers.items() if k not in SECRET_HEADERS},
            "method": METHOD.get(),
            CALL_KEY: call, PUSH_KEY: [], BLOCKING_KEY: False, WIRE_KEY: self._wire,
        }
        requested = headers.get(HTTP_EXTENSION_HEADER.lower())
        extensions = get_requested_extensions([requested] if requested else [])
        return ServerCallContext(user=CallerUser(call.caller), state=state, requested_extensions=extensions)


def peer_host(context: grpc.aio.ServicerContext) -> str | None:
    """The client's address (`ipv4:127.0.0.1:5000` -> `127.0.0.1`): whose request rate a call
    without a user counts against, as the client address over HTTP."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]") or None
    return rest.rpartition(":")[0] or None


def quota_refusal(error: sdk_errors.A2AError) -> QuotaExceeded | None:
    """The quota refusal behind `error`: the request rate (Refused) or the pending-task quota met
    inside the SDK (noted on the call's context); taken once."""
    if isinstance(error, Refused):
        return error.quota
    call = CALL.get()
    if call is None or call.refusal is None:
        return None
    refusal, call.refusal = call.refusal, None
    return refusal


async def abort_quota(refusal: QuotaExceeded, context: grpc.aio.ServicerContext) -> None:
    """RESOURCE_EXHAUSTED with what refused (ErrorInfo naming the setting) and when to try again
    (RetryInfo), the gRPC form of HTTP 429 + Retry-After."""
    status = status_pb2.Status(code=Code.RESOURCE_EXHAUSTED.value[0], message=refusal.message)
    info, retry = any_pb2.Any(), any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(
        reason="QUOTA_EXCEEDED", domain="a2a-protocol.org",
        metadata={"reason": refusal.reason, "setting": refusal.setting, "retry_after": str(refusal.retry_after)}))
    retry.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=refusal.retry_after)))
    status.details.extend([info, retry])
    rich = status_to_grpc(status)
    context.set_trailing_metadata(rich.trailing_metadata)
    await context.abort(rich.code, rich.details)


async def abort_unavailable(refusal: DatabaseUnavailable, context: grpc.aio.ServicerContext) -> None:
    """UNAVAILABLE with why (ErrorInfo DATABASE_UNAVAILABLE naming the reason) and when to try
    again (RetryInfo), the gRPC form of HTTP 503 + Retry-After."""
    status = status_pb2.Status(code=Code.UNAVAILABLE.value[0], message=refusal.message)
    info, retry = any_pb2.Any(), any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(
        reason=unavailable.REASON, domain="a2a-protocol.org",
        metadata={"reason": refusal.reason, "retry_after": str(refusal.retry_after)}))
    retry.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=refusal.retry_after)))
    status.details.extend([info, retry])
    rich = status_to_grpc(status)
    context.set_trailing_metadata(rich.trailing_metadata)
    await context.abort(rich.code, rich.details)


async def abort_if_unavailable(error: sdk_errors.A2AError, context: grpc.aio.ServicerContext) -> None:
    """The SDK's internal error of a call that met the database going away: UNAVAILABLE instead."""
    refusal = unavailable.met(met_so_far())
    if refusal is not None and isinstance(error, sdk_errors.InternalError):
        await abort_unavailable(refusal, context)  # raises: the call ends here


async def abort(error: sdk_errors.A2AError, context: grpc.aio.ServicerContext) -> None:
    """The 1.0 error status: the specification's code, the message, ErrorInfo (and field
    violations for invalid params) in `grpc-status-details-bin`, as the SDK's clients read it."""
    await abort_if_unavailable(error, context)
    refusal = quota_refusal(error)
    if refusal is not None:
        await abort_quota(refusal, context)  # raises: the call ends here
    if isinstance(error, Refused):
        await context.abort(error.code, error.message)  # raises: the call ends here
    code = SPEC_CODES.get(type(error), Code.INTERNAL)
    data = getattr(error, "data", None)
    fields = data.get("errors") if isinstance(error, sdk_errors.InvalidParamsError) and isinstance(data, dict) else None
    message = error.message
    if fields:  # the SDK's "Validation failed" says nothing without the details: name the fields
        message += ": " + "; ".join(f"{f['field']}: {f['message']}" for f in fields)
    status = status_pb2.Status(code=code.value[0], message=message)
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=sdk_errors.A2A_ERROR_REASONS.get(type(error), "UNKNOWN_ERROR"),
                                          domain="a2a-protocol.org"))
    status.details.append(info)
    if fields:
        violations = any_pb2.Any()
        violations.Pack(validation_errors_to_bad_request(fields))
        status.details.append(violations)
    rich = status_to_grpc(status)
    context.set_trailing_metadata(rich.trailing_metadata)
    await context.abort(rich.code, rich.details)


class Handler10(GrpcHandler):
    async def abort_context(self, error: sdk_errors.A2AError, context: grpc.aio.ServicerContext) -> None:
        await abort(error, context)


class Handler03(CompatGrpcHandler):
    async def abort_context(self, error: sdk_errors.A2AError, context: grpc.aio.ServicerContext) -> None:
        await abort_if_unavailable(error, context)
        refusal = quota_refusal(error)
        if refusal is not None:
            await abort_quota(refusal, context)  # raises: the call ends here
        if isinstance(error, Refused):
            await context.abort(error.code, error.message)  # raises: the call ends here
        await super().abort_context(error, context)


class CallGuard(grpc.aio.ServerInterceptor):
    """Around every call: its method name in METHOD, and an exception that is not an A2A error
    (those the servicers turn into statuses) ends the call with INTERNAL and a message of ours;
    gRPC's default would send UNKNOWN with the exception's text."""

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails],
                                                             Awaitable[grpc.RpcMethodHandler]],
                                handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _guard_unary(method, handler.unary_unary), handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _guard_stream(method, handler.unary_stream), handler.request_deserializer,
                handler.response_serializer)
        return handler  # the A2A services have no client-streaming methods


async def _internal(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    refusal = database_unavailable(exc)
    if refusal is not None:  # retryable, not a bug: no traceback (storage/outage.py logs it once)
        await abort_unavailable(refusal, context)
    log.error("gRPC %s failed", METHOD.get(), exc_info=exc)
    await context.abort(Code.INTERNAL, INTERNAL_DETAIL)


def _guard_unary(method: str, behaviour: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]) -> Any:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        METHOD.set(method)
        with watching():  # the outages the call meets (abort_if_unavailable)
            try:
                return await behaviour(request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 (the last net: answered INTERNAL, logged)
                await _internal(context, exc)

    return guarded


def _guard_stream(method: str, behaviour: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]) -> Any:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        METHOD.set(method)
        with watching():  # the outages the call meets (abort_if_unavailable)
            try:
                async for item in behaviour(request, context):
                    yield item
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 (as _guard_unary)
                await _internal(context, exc)

    return guarded


def build_server(services: "A2AServices", request_handler: RequestHandler) -> tuple[grpc.aio.Server, int]:
    """Both services on SERVICE_API_HOST:SERVICE_GRPC_PORT, and the port bound."""
    settings = services.settings
    server = grpc.aio.server(interceptors=[CallGuard()])
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(
        Handler10(request_handler, CallerGrpcContextBuilder(services, WIRE_1_0)), server)
    a2a_v0_3_pb2_grpc.add_A2AServiceServicer_to_server(
        Handler03(request_handler, CallerGrpcContextBuilder(services, WIRE_0_3)), server)
    reflection.enable_server_reflection((SERVICE_1_0, SERVICE_0_3, reflection.SERVICE_NAME), server)
    host = settings.api_host if ":" not in settings.api_host else f"[{settings.api_host}]"
    port = server.add_insecure_port(f"{host}:{settings.grpc_port}")
    if not port:
        raise RuntimeError(f"gRPC: cannot listen on {host}:{settings.grpc_port} (SERVICE_GRPC_PORT)")
    return server, port


@contextlib.asynccontextmanager
async def serving(services: "A2AServices", request_handler: RequestHandler) -> AsyncIterator[None]:
    """The gRPC server while the app runs. On shutdown open calls (a stream following a tree)
    get SERVICE_SHUTDOWN_GRACE_SECONDS, as HTTP connections do, then are cancelled."""
    server, port = build_server(services, request_handler)
    await server.start()
    log.info("A2A gRPC transport on %s:%d", services.settings.api_host, port)
    try:
        yield
    finally:
        await server.stop(services.settings.shutdown_grace_seconds)
