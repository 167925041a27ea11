"""Per-user, per-provider LLM keys, encrypted at rest in the `llm_keys` table.

Why encryption here and not in the caller: the only way into the table is this class, so no code
path can write a plaintext key by mistake. Keys are encrypted with Fernet (AES-128-CBC plus
HMAC-SHA256) under a key derived from the server secret (`SERVICE_SECRET_KEY`) with HKDF-SHA256.
The encrypted plaintext also names its user and provider, and decryption checks them, so a
ciphertext copied into another user's row is refused instead of silently becoming their key.

Without a server secret nothing can be stored (`KeyStoreNotConfigured`); reading which providers
a user has and deleting rows still work, since neither needs the secret.

`storage` imports nothing from the rest of the service: the secret is handed in as a string.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from taskgrove.storage.models import llm_keys_table as K
from taskgrove.storage.clock import now_iso

if TYPE_CHECKING:  # pragma: no cover
    from cryptography.fernet import Fernet

# Changing either value makes every stored key unreadable: they are part of the key derivation.
_HKDF_SALT = b"taskgrove/llm-keys"
_HKDF_INFO = b"fernet-v1"


class KeyStoreError(Exception):
    """A stored key cannot be written or read; the message is safe to show (never a key)."""


class KeyStoreNotConfigured(KeyStoreError):
    """No server secret is configured, so keys cannot be encrypted."""


def derive_fernet_key(secret: str) -> bytes:
    """The Fernet key (urlsafe base64 of 32 bytes) derived from the server secret."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=_HKDF_SALT, info=_HKDF_INFO).derive(
        secret.encode("utf-8")
    )
    return base64.urlsafe_b64encode(raw)


class KeyStore:
    """Read and write encrypted LLM keys; one instance per service, built by `Services.build`."""

    def __init__(self, engine: AsyncEngine, secret: str | None) -> None:
        self.engine = engine
        self._secret = secret or None
        self._fernet: "Fernet | None" = None

    @property
    def configured(self) -> bool:
        """True when a server secret exists, i.e. keys can be stored and read back."""
        return self._secret is not None

    def _cipher(self) -> "Fernet":
        if self._secret is None:
            raise KeyStoreNotConfigured(
                "SERVICE_SECRET_KEY is not set: the server has no secret to encrypt stored LLM keys "
                "with. Set it (a long random value) to store keys, or send a key per request in "
                "the X-LLM-API-KEY header."
            )
        if self._fernet is None:
            from cryptography.fernet import Fernet

            self._fernet = Fernet(derive_fernet_key(self._secret))
        return self._fernet

    def encrypt(self, user_id: str, provider: str, key: str) -> bytes:
        payload = json.dumps({"user_id": user_id, "provider": provider, "key": key}).encode("utf-8")
        return self._cipher().encrypt(payload)

    def decrypt(self, user_id: str, provider: str, ciphertext: bytes) -> str:
        from cryptography.fernet import InvalidToken

        where = f"user '{user_id}', provider '{provider}'"
        try:
            payload = json.loads(self._cipher().decrypt(bytes(ciphertext)))
        except (InvalidToken, ValueError):
            raise KeyStoreError(
                f"The stored LLM key for {where} cannot be decrypted with the current "
                "SERVICE_SECRET_KEY (was the secret changed?); store the key again"
            ) from None
        if not isinstance(payload, dict) or payload.get("user_id") != user_id \
                or payload.get("provider") != provider or not isinstance(payload.get("key"), str):
            raise KeyStoreError(f"The stored LLM key for {where} does not belong to that row; store it again")
        return payload["key"]

    async def set(self, user_id: str, provider: str, key: str) -> None:
        """Store (or replace) the key of `user_id` for `provider`."""
        ciphertext = self.encrypt(user_id, provider, key)
        where = and_(K.c.user_id == user_id, K.c.provider == provider)
        for _attempt in range(2):  # a concurrent first insert of the same row: update it instead
            stamp = now_iso()
            try:
                async with self.engine.begin() as conn:
                    result = await conn.execute(update(K).where(where).values(ciphertext=ciphertext, updated_at=stamp))
                    if result.rowcount:
                        return
                    await conn.execute(insert(K).values(user_id=user_id, provider=provider, ciphertext=ciphertext,
                                                        created_at=stamp, updated_at=stamp))
                    return
            except IntegrityError:
                continue
        raise KeyStoreError(f"Could not store the LLM key for user '{user_id}', provider '{provider}'")

    async def get(self, user_id: str, provider: str) -> str | None:
        """The plaintext key of `user_id` for `provider`, or None when none is stored."""
        async with self.engine.connect() as conn:
            row = (await conn.execute(
                select(K.c.ciphertext).where(and_(K.c.user_id == user_id, K.c.provider == provider))
            )).first()
        if row is None:
            return None
        return self.decrypt(user_id, provider, row.ciphertext)

    async def providers(self, user_id: str) -> list[str]:
        """The providers `user_id` has a stored key for, sorted (no decryption needed)."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(select(K.c.provider).where(K.c.user_id == user_id).order_by(K.c.provider))
            return [row.provider for row in rows]

    async def delete(self, user_id: str, provider: str | None = None) -> int:
        """Delete one provider's key, or every key of the user when `provider` is None; the count."""
        condition = K.c.user_id == user_id
        if provider is not None:
            condition = and_(condition, K.c.provider == provider)
        async with self.engine.begin() as conn:
            result = await conn.execute(delete(K).where(condition))
            return int(result.rowcount or 0)
