"""JSON-RPC error codes (SPEC.md, Errors) and the one exception every surface turns into an error."""

from __future__ import annotations

from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000
PERMISSION_DENIED = -32001


class RpcError(Exception):
    """Raised anywhere below a surface; the surface renders code, message and data."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def invalid_params(detail: str) -> RpcError:
    return RpcError(INVALID_PARAMS, detail, detail)


def task_not_found(task_id: str) -> RpcError:
    return invalid_params(f"Task '{task_id}' not found")


def permission_denied(detail: str = "Permission denied") -> RpcError:
    return RpcError(PERMISSION_DENIED, "Permission denied", detail)
