"""An answer read into its model (client/answers.py), or the client's own exception: never
pydantic's. Shared by AsyncClient (client/aio.py) and its namespaces (client/automation.py)."""

from __future__ import annotations

import builtins
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from taskgrove.client.exceptions import INVALID_PARAMS, NotFound, ProtocolError

M = TypeVar("M", bound=BaseModel)


def read_one(model: type[M], value: Any) -> M:
    """The answer read into its model; ProtocolError when it does not fit (a service that speaks
    another version of the interface), never pydantic's own exception."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise ProtocolError(f"the service's answer does not fit {model.__name__}: {exc}"[:1000]) from None


def read_many(model: type[M], values: Any) -> builtins.list[M]:
    if not isinstance(values, list):
        raise ProtocolError(f"the service answered {type(values).__name__} where a list of {model.__name__} was due")
    return [read_one(model, value) for value in values]


def not_found(detail: str, method: str) -> NotFound:
    """What the service says for a missing task everywhere but tasks.get, which answers null (SPEC.md)."""
    return NotFound(detail, code=INVALID_PARAMS, data=detail, method=method)
