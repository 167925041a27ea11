"""What the SDK's types drop from an A2A request body, read from the raw JSON (both transports).

- `headers` and `method` of a push config (the 0.3 compat layer and the 1.0 types have no place
  for them), under the 0.3, 1.0 and snake_case spellings;
- whether the request itself said to wait (0.3 `blocking: true`, 1.0 `returnImmediately: false`):
  proto3 cannot tell an explicit `false` from an absent field, and the difference matters (see
  handler.TaskgroveRequestHandler.on_message_send).
"""

from __future__ import annotations

from typing import Any

from taskgrove.agent.surfaces.a2a.push import PushTarget, parse_target

PUSH_CONFIG_KEYS = ("push_notification_config", "pushNotificationConfig", "taskPushNotificationConfig")


def push_extras(payload: dict[str, Any]) -> list[PushTarget]:
    """`headers` and `method` of a push config in the raw body, which the SDK's types drop.

    Looked for in `params.configuration` (send), `params` (push-config set) and the body-level
    `configuration` SPEC.md lists, under the 0.3 and snake_case spellings.
    """
    given = payload.get("params")
    params = given if isinstance(given, dict) else {}
    holders = [params.get("configuration"), params, payload.get("configuration")]
    extras = []
    for holder in holders:
        if not isinstance(holder, dict):
            continue
        for key in PUSH_CONFIG_KEYS:
            raw = holder.get(key)
            # A config without headers or method is all in the SDK's standard config already.
            if isinstance(raw, dict) and raw.get("headers") is None and raw.get("method") is None:
                continue
            if raw is not None:
                extras.append(parse_target(raw, key))
    return extras


def explicitly_blocking(payload: dict[str, Any]) -> bool:
    """`configuration.blocking: true` (0.3) or `configuration.returnImmediately: false` (1.0), as sent."""
    params = payload.get("params")
    configuration = params.get("configuration") if isinstance(params, dict) else None
    if not isinstance(configuration, dict):
        return False
    return configuration.get("blocking") is True or configuration.get("returnImmediately") is False \
        or configuration.get("return_immediately") is False
