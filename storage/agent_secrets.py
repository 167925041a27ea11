"""The credential headers of a directory agent, encrypted at rest (the `agents.credentials` column).

The scheme of storage/keys.py (LLM keys): Fernet under a key derived from SERVICE_SECRET_KEY with
HKDF-SHA256, with a salt of its own so that an LLM key's ciphertext can never be read as an
agent's credential; the plaintext names the agent's id and decryption checks it, so a ciphertext
copied to another agent's row is refused. Without a secret, no credential can be stored.
Messages never hold a header's value.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from taskgrove.storage.keys import KeyStoreError, KeyStoreNotConfigured

_SALT = b"taskgrove/agent-credentials"
_INFO = b"fernet-v1"


class AgentSecrets:
    """Encrypt and decrypt one agent's headers; one instance per service."""

    def __init__(self, secret: str | None) -> None:
        self._secret = secret or None
        self._fernet: object | None = None

    @property
    def configured(self) -> bool:
        return self._secret is not None

    def _cipher(self) -> Any:
        if self._secret is None:
            raise KeyStoreNotConfigured(
                "SERVICE_SECRET_KEY is not set: the server has no secret to encrypt an agent's credential "
                "with. Set it (a long random value) to add agents with headers or a credential.")
        if self._fernet is None:
            from cryptography.fernet import Fernet
            from cryptography.hazmat.primitives import hashes
            from cryptography.hazmat.primitives.kdf.hkdf import HKDF

            raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=_INFO).derive(self._secret.encode())
            self._fernet = Fernet(base64.urlsafe_b64encode(raw))
        return self._fernet

    def seal(self, agent_id: str, headers: dict[str, str]) -> bytes | None:
        if not headers:
            return None
        return self._cipher().encrypt(json.dumps({"agent_id": agent_id, "headers": headers}).encode())

    def open(self, agent_id: str, ciphertext: bytes | None) -> dict[str, str]:
        if not ciphertext:
            return {}
        from cryptography.fernet import InvalidToken

        try:
            payload = json.loads(self._cipher().decrypt(bytes(ciphertext)))
        except (InvalidToken, ValueError):
            raise KeyStoreError(f"the stored credential of agent '{agent_id}' cannot be decrypted with the current "
                                "SERVICE_SECRET_KEY (was the secret changed?); add the agent again") from None
        if not isinstance(payload, dict) or payload.get("agent_id") != agent_id \
                or not isinstance(payload.get("headers"), dict):
            raise KeyStoreError(f"the stored credential of agent '{agent_id}' does not belong to it; add it again")
        return {str(k): str(v) for k, v in payload["headers"].items()}
