"""The `cursor` of `tasks.list` (keyset pagination): the sort key of a page's last row, opaque.

A page ordered newest first continues below the last row's (created_at, id), which no insert or
delete shifts (an offset does: a page by offset skips or repeats rows when tasks arrive, and
reading it costs every row before it). The cursor is that key as URL-safe base64 of a small JSON
array with a version; whatever else a client sends (made up, cut, edited) is a -32602 naming
`cursor`, never an internal error. An edited but well-formed key only moves the page: it reads
nothing the caller could not list anyway.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from taskgrove.agent.foundations.errors import invalid_params

VERSION = 1
MAX_CURSOR = 1200  # characters: a key is ~120, at most ~1100 (64 characters of id, each escaped)
# A stored timestamp (storage/models.py): fixed width, UTC.
_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00\Z")
_ID_MAX = 64  # tasks.id's width


def encode(created_at: str, task_id: str) -> str:
    """The cursor of the page after the row (created_at, task_id)."""
    text = json.dumps([VERSION, created_at, task_id], separators=(",", ":"), ensure_ascii=True)
    return base64.urlsafe_b64encode(text.encode("ascii")).decode("ascii").rstrip("=")


def decode(cursor: Any) -> tuple[str, str] | None:
    """(created_at, id) of the row a page continues after; None for the first page (null or "")."""
    if cursor is None or cursor == "":
        return None
    if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR:
        raise _bad()
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw.decode("ascii"))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise _bad() from None
    if not (isinstance(key, list) and len(key) == 3 and key[0] == VERSION and isinstance(key[1], str)
            and isinstance(key[2], str) and _STAMP.match(key[1]) and 0 < len(key[2]) <= _ID_MAX
            and "\x00" not in key[2] and key[2].isprintable()):
        raise _bad()
    return key[1], key[2]


def _bad() -> Exception:
    return invalid_params("cursor is not one this service gave out: pass the next_cursor of the previous "
                          "page, or null (or \"\") for the first page")
