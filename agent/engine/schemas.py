"""JSON Schemas compiled once: executors' input schemas (engine/live_attempts.py), waits' answer schemas
(engine/waits.py)."""

from __future__ import annotations

import functools
import json
from typing import Any


@functools.lru_cache(maxsize=256)
def compiled_schema(schema_json: str) -> Any:
    """Checking a schema costs far more than using it: compile each distinct schema once."""
    import jsonschema  # here, not at start-up: ~40 ms and 2.6 MB that only running tasks need

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)
