"""Params of A2A methods checked before the SDK parses them, so a malformed request is -32602.

The SDK's 0.3 adapter answers a params validation failure with -32600 and the whole pydantic dump
(0.3 says invalid params are -32602), and its 1.0 dispatcher puts protobuf's parser text into the
error data and silently maps an unknown enum value (a `status` filter of `"NOPE"`, a `role` of
`"BAD"`) to "unspecified", which for ListTasks means "no filter". Here each wire's own model
validates the params first and the answer names the fields in our words.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from a2a.server.routes.jsonrpc_dispatcher import JSONRPC03Adapter, JsonRpcDispatcher  # (SDK import order)
from a2a.compat.v0_3 import conversions
from a2a.types.a2a_pb2 import Role, TaskState
from google.protobuf.json_format import ParseDict, ParseError
from pydantic import ValidationError

from taskgrove.agent.surfaces.a2a.envelope import MAX_DEPTH, EnvelopeError
from taskgrove.agent.foundations.errors import INVALID_PARAMS
from taskgrove.storage import jsonvalues

VERSION_NOT_SUPPORTED = -32009
MAX_FIELDS = 5  # a reply names at most this many bad fields
_PARSE_FIELD = re.compile(r"Failed to parse (\w+) field")


def check_params(method: str, message: dict[str, Any]) -> None:
    """Raise EnvelopeError(-32602) when the params do not fit the method's request type."""
    id_ = message.get("id")
    # check_request refused what else the gate refuses, so only the depth can be found here.
    found = jsonvalues.problem(message.get("params"), "params", MAX_DEPTH - 1)
    if found is not None:
        raise _invalid(f"{method}: {found} (a data part becomes a protobuf Struct, which has a depth limit)", id_)
    where = nul_in_names(message.get("params"), "params")
    if where is not None:
        raise _invalid(f"{method}: {where} must not contain NUL characters", id_)
    if method in JSONRPC03Adapter.METHOD_TO_MODEL:
        _check_v03(method, message, id_)
    elif method in JsonRpcDispatcher.METHOD_TO_MODEL:
        _check_v10(method, message.get("params"), id_)


V03_TO_V10 = {
    "message/send": "SendMessage", "message/stream": "SendStreamingMessage", "tasks/get": "GetTask",
    "tasks/cancel": "CancelTask", "tasks/resubscribe": "SubscribeToTask",
    "tasks/pushNotificationConfig/set": "CreateTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/get": "GetTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/list": "ListTaskPushNotificationConfigs",
    "tasks/pushNotificationConfig/delete": "DeleteTaskPushNotificationConfig",
    "agent/getAuthenticatedExtendedCard": "GetExtendedAgentCard",
}


def check_version(method: str, message: dict[str, Any], version: str | None) -> None:
    """A 0.3 method sent as A2A 1.x is VersionNotSupportedError (-32009), said as such.

    (The SDK raises the same error, but its 0.3 adapter turns every code 0.3 lacks into -32603.)
    """
    version = (version or "").strip()
    if method in JSONRPC03Adapter.METHOD_TO_MODEL and version.startswith("1"):
        detail = (f"{method} is an A2A 0.3 method but the request says A2A-Version {version}: "
                  f"use {V03_TO_V10.get(method, 'the 1.0 method')}, or send A2A-Version: 0.3")
        raise EnvelopeError(VERSION_NOT_SUPPORTED, "Version not supported", detail, message.get("id"))


def _invalid(detail: str, id_: Any) -> EnvelopeError:
    return EnvelopeError(INVALID_PARAMS, "Invalid params", detail, id_)


# Members whose strings are content (message parts, metadata), stored inside JSON values; every
# other string of A2A params names something (a task, a context, a push config) or is one.
CONTENT_KEYS = frozenset({"parts", "metadata", "data", "artifacts", "history"})


def nul_in_names(params: Any, root: str) -> str | None:
    """The path of the first string outside message content that holds a NUL character, else None.

    Why: such a string is a task, context or push-config id, which PostgreSQL cannot even compare
    (its text type has no NUL); /tasks refuses NUL in ids the same way (agent.foundations.params.string).
    """
    return first_outside_content(params, root, lambda item: isinstance(item, str) and "\x00" in item)


# How the SDK's 0.3 adapter turns each request into its 1.0 form: run here first, so that a value
# the 1.0 message cannot hold (a historyLength past int32) is -32602, not the adapter's -32603.
V03_CONVERSIONS: dict[str, Any] = {
    "message/send": conversions.to_core_send_message_request,
    "message/stream": conversions.to_core_send_message_request,
    "tasks/get": conversions.to_core_get_task_request,
    "tasks/cancel": conversions.to_core_cancel_task_request,
    "tasks/resubscribe": conversions.to_core_subscribe_to_task_request,
    "tasks/pushNotificationConfig/set": conversions.to_core_create_task_push_notification_config_request,
    "tasks/pushNotificationConfig/get": conversions.to_core_get_task_push_notification_config_request,
    "tasks/pushNotificationConfig/list": conversions.to_core_list_task_push_notification_config_request,
    "tasks/pushNotificationConfig/delete": conversions.to_core_delete_task_push_notification_config_request,
}
INT32 = (-(2**31), 2**31 - 1)


def _check_v03(method: str, message: dict[str, Any], id_: Any) -> None:
    model = JSONRPC03Adapter.METHOD_TO_MODEL[method]
    try:
        # The id was checked by the envelope rules (a fractional id is valid JSON-RPC, not valid here).
        request = model.model_validate({**message, "id": 0})  # type: ignore[attr-defined]
    except ValidationError as exc:
        raise _invalid(f"{method}: " + "; ".join(describe_v03(exc)), id_) from None
    convert = V03_CONVERSIONS.get(method)
    try:
        if convert is not None:
            convert(request)
    except (ValueError, TypeError, ParseError):
        where = out_of_range(message.get("params"), "params") or "params"
        raise _invalid(f"{method}: {where} does not fit the A2A request (whole numbers are from "
                       f"{INT32[0]} to {INT32[1]})", id_) from None


def out_of_range(params: Any, root: str) -> str | None:
    """The path of the first whole number outside int32 (the protobuf fields' type) outside
    message content, else None."""
    return first_outside_content(params, root, lambda item: isinstance(item, int) and not isinstance(item, bool)
                                 and not INT32[0] <= item <= INT32[1])


def first_outside_content(params: Any, root: str, bad: Callable[[Any], bool]) -> str | None:
    """The path of the first value outside message content (CONTENT_KEYS) that `bad` finds, else
    None; iterative, so any depth the envelope admitted is walked without recursion."""
    stack: list[tuple[Any, str]] = [(params, root)]
    while stack:
        item, path = stack.pop()
        if bad(item):
            return path
        if isinstance(item, dict):
            stack.extend((v, f"{path}.{k}") for k, v in item.items() if k not in CONTENT_KEYS)
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(item))
    return None


def describe_v03(exc: ValidationError) -> list[str]:
    """pydantic's errors as `params.message.messageId is required`, at most MAX_FIELDS of them.

    A union (a part may be text, file or data) reports every branch; the shortest paths say
    most, so duplicates and longer paths below an already named one are dropped.
    """
    named: list[str] = []
    for error in sorted(exc.errors(), key=lambda e: len(e["loc"])):
        loc = [str(p) for p in error["loc"] if not _is_branch_name(p)]
        path = ".".join(loc) or "params"
        if any(path == n.split(" ")[0] or path.startswith(n.split(" ")[0] + ".") for n in named):
            continue
        named.append(f"{path} {_reason(error)}")
        if len(named) == MAX_FIELDS:
            break
    return named


def _is_branch_name(part: Any) -> bool:
    """pydantic inserts model names (`TextPart`, `function-after[...]`) into union locations."""
    return isinstance(part, str) and (part[:1].isupper() or "[" in part)


def _reason(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return "is required"
    if kind in ("literal_error", "enum") and ctx.get("expected"):
        return f"must be one of {ctx['expected']}"
    if kind.startswith("string"):
        return "must be a string"
    if kind.startswith(("int", "float")):
        return "must be a number"
    if kind.startswith("bool"):
        return "must be true or false"
    if kind.startswith(("dict", "model")):
        return "must be an object"
    if kind.startswith("list"):
        return "must be an array"
    if kind == "extra_forbidden":
        return "is not a known field"
    return "has an invalid value"


ENUM_FIELDS: dict[str, list[tuple[tuple[str, ...], Any]]] = {
    "SendMessage": [(("message", "role"), Role)],
    "SendStreamingMessage": [(("message", "role"), Role)],
    "ListTasks": [(("status",), TaskState)],
}


def _check_v10(method: str, params: Any, id_: Any) -> None:
    model: Any = JsonRpcDispatcher.METHOD_TO_MODEL[method]  # a protobuf message class
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise _invalid(f"{method}: params must be an object", id_)
    try:
        ParseDict(params, model(), ignore_unknown_fields=True)
    except ParseError as exc:
        fields = ".".join(_PARSE_FIELD.findall(str(exc)))
        where = f"params.{fields}" if fields else "params"
        raise _invalid(f"{method}: {where} has the wrong type or value for the A2A 1.0 "
                       f"{model.DESCRIPTOR.name} message", id_) from None
    for path, enum in ENUM_FIELDS.get(method, []):
        value: Any = params
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            continue
        names = list(enum.keys())
        if (isinstance(value, str) and value not in names) or (isinstance(value, int) and value not in enum.values()) \
                or not isinstance(value, (str, int)) or isinstance(value, bool):
            allowed = ", ".join(n for n in names if not n.endswith("UNSPECIFIED"))
            raise _invalid(f"{method}: params.{'.'.join(path)} must be one of {allowed}, got {value!r}", id_)
