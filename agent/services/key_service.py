"""`config.llm_key.set/get/delete` and the stored-key lookup the LLM client uses.

Why its own module: the rules for *whose* key a call means (the caller by default when JWT is on,
an explicit `user_id` otherwise, admin for anyone else's) live here once, for the `/system`
methods and for the engine's `llm_key_lookup` alike; the params are read (provider names and the
key's own checks) by `SetLlmKey` and `LlmKeyRef` in agent/foundations/requests_services.py. Key values only
ever flow inwards: no result, error message or log line of this module contains one.
"""

from __future__ import annotations

import logging
from typing import Any

from taskgrove.agent.foundations.errors import SERVER_ERROR, RpcError, invalid_params, permission_denied
from taskgrove.agent.foundations.requests_services import ALL_PROVIDERS, DEFAULT_PROVIDER, LlmKeyRef, SetLlmKey
from taskgrove.agent.foundations.calls import CallContext, Handler
from taskgrove.agent.foundations.calls import typed
from taskgrove.llm.client import LLMError, normalize_provider, parse_key_header
from taskgrove.storage.keys import KeyStore, KeyStoreError

log = logging.getLogger(__name__)

# The user a key belongs to when no user is known (JWT off and the task names no user).
DEFAULT_USER = "default"
# Key prefixes that name exactly one vendor (a bare `sk-` is shared by several, so it is not here).
_KEY_PREFIXES = (
    ("sk-ant-", "anthropic"),
    ("sk-or-", "openrouter"),
    ("sk-proj-", "openai"),
    ("gsk_", "groq"),
    ("AIza", "gemini"),
)


def detect_key_provider(key: str) -> str | None:
    """The vendor a key's own prefix names, or None when the prefix is not distinctive."""
    for prefix, provider in _KEY_PREFIXES:
        if key.startswith(prefix):
            return provider
    return None


class KeyService:
    """The `config.llm_key.*` handlers over one `KeyStore`."""

    def __init__(self, store: KeyStore) -> None:
        self.store = store

    def methods(self) -> dict[str, Handler]:
        """The JSON-RPC table: each entry reads the params into its typed request once."""
        return {
            "config.llm_key.set": typed(SetLlmKey.from_params, self.set),
            "config.llm_key.get": typed(LlmKeyRef.from_params, self.get),
            "config.llm_key.delete": typed(LlmKeyRef.from_params, self.delete),
        }

    # --- whose keys -----------------------------------------------------------------------

    @staticmethod
    def _target_user(requested: str | None, ctx: CallContext, *, required: bool) -> str:
        """The user a call means: as given (if the caller may), else the caller, else `default`.

        `required` (set, delete): without a user in the request or in the token, refuse rather
        than silently changing the shared `default` user's keys.
        """
        caller = ctx.caller
        if requested is None:
            if caller.authenticated and caller.user_id is not None:
                return caller.user_id
            if required:
                why = "the token names no user" if caller.authenticated else "JWT authentication is off"
                raise invalid_params(f"user_id is required ({why}, so there is no caller to default to)")
            return DEFAULT_USER
        if not caller.can_access(requested):
            raise permission_denied(f"Only an admin may manage the LLM keys of user '{requested}'")
        return requested

    # --- the methods ----------------------------------------------------------------------

    async def set(self, request: SetLlmKey, ctx: CallContext) -> dict[str, Any]:
        key, provider = request.api_key, request.provider
        user_id = self._target_user(request.user_id, ctx, required=True)
        named, key = parse_key_header(key)  # `<provider>:<key>` names its provider too
        if named is not None and provider not in (None, named):
            raise invalid_params(f"api_key names provider '{named}' but provider is '{provider}'")
        provider = provider or named or detect_key_provider(key) or DEFAULT_PROVIDER
        try:
            await self.store.set(user_id, provider, key)
        except KeyStoreError as exc:
            raise RpcError(SERVER_ERROR, "LLM key storage is not available", str(exc)) from None
        log.info("stored LLM key for user %s, provider %s", user_id, provider)
        return {"success": True, "user_id": user_id, "provider": provider}

    async def get(self, request: LlmKeyRef, ctx: CallContext) -> dict[str, Any]:
        provider = request.provider
        user_id = self._target_user(request.user_id, ctx, required=False)
        stored = dict.fromkeys(await self.store.providers(user_id), True)
        if provider is not None:
            has_key = stored.get(provider, False)
            providers = {**stored, provider: has_key}
        else:
            has_key, providers = bool(stored), stored
        return {"has_key": has_key, "user_id": user_id, "provider": provider, "providers": providers}

    async def delete(self, request: LlmKeyRef, ctx: CallContext) -> dict[str, Any]:
        which = request.provider
        user_id = self._target_user(request.user_id, ctx, required=True)
        deleted = await self.store.delete(user_id, which)
        if deleted:
            log.info("deleted %d LLM key(s) of user %s, provider %s", deleted, user_id, which or ALL_PROVIDERS)
        return {"success": True, "user_id": user_id, "deleted": deleted > 0, "provider": which or ALL_PROVIDERS}

    # --- for the LLM client ---------------------------------------------------------------

    async def lookup(self, user_id: str | None, provider: str) -> str | None:
        """The stored key of `user_id` for `provider` (`llm.client.KeyLookup`); None if none.

        A task without a user (JWT off) uses the `default` user's keys. Without a server secret
        nothing can have been stored, so the lookup answers None without touching the database.
        """
        if not self.store.configured:
            return None
        name = provider if provider == DEFAULT_PROVIDER else normalize_provider(provider)
        if name is None:
            return None
        try:
            return await self.store.get(user_id or DEFAULT_USER, name)
        except KeyStoreError as exc:
            log.warning("%s", exc)  # the message names user and provider, never the key
            raise LLMError(str(exc)) from None  # safe to show: it says what to do
