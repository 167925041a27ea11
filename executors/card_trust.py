"""Trust in agent cards: our card signed, a remote card verified (docs/agents.md, "Trust").

An A2A card may carry `signatures`: JWS (RFC 7515) over the card's canonical JSON (RFC 8785 JCS,
the card without `signatures` and without empty values), each with a `kid` in its protected
header. The a2a-sdk has the signer and the verifier (a2a.utils.signing); this module gives them
keys from the settings and says clearly what is wrong with a card:

- `sign_card(card, key, kid)`: our card (its 1.0 JSON form, agent/surfaces/a2a/card.py) with a
  signature by `SERVICE_CARD_SIGNING_KEY` (a PEM private key, or the path of a PEM file) under
  `SERVICE_CARD_SIGNING_KID`. The same signature serves the 0.3 form: a client canonicalizes the
  card as the SDK parses it, and both forms parse to the same card.
- `verify_card(card_json, trusted_keys)`: with trusted keys configured (`SERVICE_AGENT_TRUSTED_KEYS`:
  kid -> PEM public key or path), a card must carry a valid signature by one of them; an unsigned
  card, a card signed by an unknown key, and a card changed after it was signed (tampered) are
  refused with `UntrustedCard` naming which. The directory (agents.add, refresh) and the
  a2a_agent_executor's card fetch call it (`card_verifier` for the SDK's card resolver).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# Algorithms a signature may use: asymmetric only (a shared secret would let any holder forge).
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "ES512", "EdDSA")


class UntrustedCard(ValueError):
    """A card that trusted keys do not vouch for: unsigned, signed by an unknown key, or tampered."""


def read_key(value: str) -> bytes:
    """A PEM key given as its text or as the path of a file holding it."""
    text = value.strip()
    if text.startswith("-----BEGIN"):
        return text.encode()
    path = Path(text).expanduser()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"the key is neither PEM text nor a readable file ({path}): {exc.strerror}") from None
    if not data.lstrip().startswith(b"-----BEGIN"):
        raise ValueError(f"{path} does not hold a PEM key")
    return data


def _private_key(pem: bytes) -> Any:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        return load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a PEM private key without a password: {exc}") from None


def _public_key(pem: bytes) -> Any:
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        return load_pem_public_key(pem)
    except ValueError:
        return _private_key(pem).public_key()  # a private key names its public one


def algorithm_of(key: Any) -> str:
    """The JWS algorithm for a key: RS256 (RSA), ES256/384/512 (EC by curve), EdDSA (Ed25519)."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        return "RS256"
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        return {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}.get(key.curve.name, "ES256")
    if isinstance(key, (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)):
        return "EdDSA"
    raise ValueError(f"a {type(key).__name__} cannot sign an agent card (RSA, EC or Ed25519 keys can)")


def parse_trusted_keys(spec: str | None) -> dict[str, bytes]:
    """`SERVICE_AGENT_TRUSTED_KEYS`: a JSON object {kid: PEM or path}, or `kid=path,kid=path`.
    Each key is read and checked now, so a bad setting stops the start with its reason."""
    if spec is None or not spec.strip():
        return {}
    text = spec.strip()
    if text.startswith("{"):
        try:
            pairs = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc.msg}") from None
        if not isinstance(pairs, dict) or not all(isinstance(v, str) for v in pairs.values()):
            raise ValueError("give a JSON object of key id -> PEM public key (or its file)")
        items = list(pairs.items())
    else:
        items = []
        for entry in filter(None, (e.strip() for e in text.split(","))):
            kid, sep, where = entry.partition("=")
            if not sep or not kid.strip() or not where.strip():
                raise ValueError(f"{entry!r}: give kid=path-of-a-PEM-public-key")
            items.append((kid.strip(), where.strip()))
    keys: dict[str, bytes] = {}
    for kid, value in items:
        if not kid:
            raise ValueError("a trusted key needs a key id")
        try:
            pem = read_key(value)
            algorithm_of(_public_key(pem))
        except ValueError as exc:
            raise ValueError(f"trusted key {kid!r}: {exc}") from None
        keys[kid] = pem
    return keys


def sign_card(card: Mapping[str, Any], key: str | bytes, kid: str) -> dict[str, Any]:
    """`card` (the 1.0 JSON form) with one more signature by `key` (PEM, or the path of a PEM
    file) under `kid`; the algorithm follows the key's type."""
    from a2a.client.card_resolver import parse_agent_card
    from a2a.utils.signing import create_agent_card_signer
    from google.protobuf.json_format import MessageToDict

    pem = key if isinstance(key, bytes) else read_key(key)
    private = _private_key(pem)
    signer = create_agent_card_signer(private, {"kid": kid, "alg": algorithm_of(private), "jku": None,
                                                "typ": "JOSE"})
    signed = signer(parse_agent_card(copy.deepcopy(dict(card))))
    return {**card, "signatures": [MessageToDict(s) for s in signed.signatures]}


def _kid_of(signature: Any) -> str | None:
    """The `kid` of a signature's protected header, or None when it cannot be read."""
    protected = getattr(signature, "protected", None)
    if protected is None and isinstance(signature, Mapping):
        protected = signature.get("protected")
    if not isinstance(protected, str):
        return None
    try:
        header = json.loads(base64.urlsafe_b64decode(protected + "=" * (-len(protected) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    kid = header.get("kid") if isinstance(header, dict) else None
    return kid if isinstance(kid, str) else None


def card_verifier(trusted_keys: Mapping[str, bytes], where: str = "the agent card") -> Callable[[Any], None]:
    """A check of a parsed card (the SDK's AgentCard) against `trusted_keys`, for
    A2ACardResolver.get_agent_card(signature_verifier=...); raises UntrustedCard."""
    from a2a.utils.signing import SignatureVerificationError, create_signature_verifier

    keys = {kid: _public_key(pem) for kid, pem in trusted_keys.items()}

    def provide(kid: str | None, _jku: str | None) -> Any:
        return keys[kid] if kid in keys else b""  # an unknown kid fails this signature only

    verify = create_signature_verifier(provide, list(ALGORITHMS))

    def check(card: Any) -> None:
        if not card.signatures:
            raise UntrustedCard(f"{where} is not signed, and trusted keys are configured "
                                "(SERVICE_AGENT_TRUSTED_KEYS): an unsigned card is refused")
        kids = [_kid_of(s) for s in card.signatures]
        if not any(kid in keys for kid in kids):
            named = ", ".join(repr(k) for k in kids if k) or "no key id"
            raise UntrustedCard(f"{where} is signed by {named}, not by a trusted key "
                                f"({', '.join(sorted(keys))})")
        try:
            verify(card)
        except SignatureVerificationError:
            raise UntrustedCard(f"the signature of {where} does not match its content: the card was changed "
                                "after it was signed (tampered), or signed with another key") from None

    return check


def verify_card(card_json: Mapping[str, Any], trusted_keys: Mapping[str, bytes],
                where: str = "the agent card") -> None:
    """Refuse (UntrustedCard) a card, as fetched (0.3 or 1.0 JSON), that no trusted key vouches
    for. Nothing is checked without trusted keys. A card the SDK cannot parse is refused too."""
    if not trusted_keys:
        return
    from a2a.client.card_resolver import parse_agent_card
    from google.protobuf.json_format import ParseError

    try:
        card = parse_agent_card(copy.deepcopy(dict(card_json)))
    except (ParseError, TypeError, ValueError) as exc:
        raise UntrustedCard(f"{where} cannot be read as an A2A card: {exc}") from None
    card_verifier(trusted_keys, where)(card)


_PARSED: dict[str, dict[str, bytes]] = {}


def trusted_keys_of(settings: Any) -> dict[str, bytes]:
    """The trusted keys of the settings (`agent_trusted_keys`), read once per distinct value."""
    spec = getattr(settings, "agent_trusted_keys", None)
    if not spec:
        return {}
    if spec not in _PARSED:
        _PARSED[spec] = parse_trusted_keys(spec)
    return _PARSED[spec]


def card_check(settings: Any, url: str) -> Callable[[Any], None] | None:
    """For a2a_agent_executor's card resolver (A2ACardResolver's `signature_verifier`): with
    SERVICE_AGENT_TRUSTED_KEYS set, the check that refuses a card no trusted key vouches for; the
    task then fails at once with the reason (ExecutorError, no retry can fix it). None without keys."""
    from taskgrove.executors.base import ExecutorError

    keys = trusted_keys_of(settings)
    if not keys:
        return None
    check = card_verifier(keys, f"the agent card of {url}")

    def refuse_untrusted(card: Any) -> None:
        try:
            check(card)
        except UntrustedCard as exc:
            raise ExecutorError(str(exc), retryable=False) from None

    return refuse_untrusted
