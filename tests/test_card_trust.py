"""Trust in agent cards (issue 45, item 5; executors/card_trust.py, docs/agents.md "Trust").

Our card is signed with SERVICE_CARD_SIGNING_KEY (JWS over the JCS-canonical card, by the
a2a-sdk's signer), in both of its JSON forms; with SERVICE_AGENT_TRUSTED_KEYS set, a remote card
must carry a valid signature by a trusted key: an unsigned, unknown-key or tampered card is refused
with a clear error, by verify_card and by a2a_agent_executor's card fetch.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from hypothesis import HealthCheck, given, settings, strategies as st
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from taskgrove.agent.surfaces.a2a.card import build_card, card_json
from taskgrove.executors.card_trust import (
    UntrustedCard,
    parse_trusted_keys,
    sign_card,
    verify_card,
)
from tests.deadlines import HEAVY_WORK_TIMEOUT
from tests.processes import Service
from tests.servers import serve


def _pems(key: Any) -> tuple[str, str]:
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


EC_PRIVATE, EC_PUBLIC = _pems(ec.generate_private_key(ec.SECP256R1()))
OTHER_PRIVATE, OTHER_PUBLIC = _pems(ec.generate_private_key(ec.SECP256R1()))
TRUSTED = {"ours": EC_PUBLIC.encode()}


@pytest.fixture(scope="module")
def card() -> dict[str, Any]:
    from taskgrove.agent.foundations.settings import Settings

    return build_card(Settings.from_env({"SERVICE_PUBLIC_URL": "http://127.0.0.1:9"}))


def test_a_signed_card_verifies_in_both_forms(card: dict[str, Any]) -> None:
    signed = sign_card(card, EC_PRIVATE, "ours")
    (signature,) = signed["signatures"]
    assert set(signature) >= {"protected", "signature"}
    verify_card(signed, TRUSTED)
    verify_card(card_json(signed), TRUSTED)  # the 0.3 form parses to the same card


@pytest.mark.parametrize("make", [lambda: rsa.generate_private_key(65537, 2048), ed25519.Ed25519PrivateKey.generate])
def test_rsa_and_ed25519_keys_sign_too(card: dict[str, Any], make: Any) -> None:
    private, public = _pems(make())
    verify_card(sign_card(card, private, "k"), {"k": public.encode()})


def test_unsigned_unknown_key_and_tampered_cards_are_refused(card: dict[str, Any]) -> None:
    with pytest.raises(UntrustedCard, match="is not signed"):
        verify_card(card, TRUSTED)
    with pytest.raises(UntrustedCard, match="signed by 'stranger', not by a trusted key"):
        verify_card(sign_card(card, OTHER_PRIVATE, "stranger"), TRUSTED)
    # A trusted kid, but another key made the signature.
    with pytest.raises(UntrustedCard, match="does not match its content"):
        verify_card(sign_card(card, OTHER_PRIVATE, "ours"), TRUSTED)
    tampered = sign_card(card, EC_PRIVATE, "ours")
    tampered["supportedInterfaces"][0]["url"] = "http://evil.example/"
    with pytest.raises(UntrustedCard, match="tampered"):
        verify_card(tampered, TRUSTED)
    verify_card(card, {})  # no trusted keys: nothing is checked


def test_trusted_keys_setting_forms_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "ours.pem"
    path.write_text(EC_PUBLIC)
    assert parse_trusted_keys(f"ours={path}") == {"ours": EC_PUBLIC.encode()}
    assert parse_trusted_keys(json.dumps({"ours": EC_PUBLIC, "file": str(path)}))["file"] == EC_PUBLIC.encode()
    assert parse_trusted_keys("  ") == {} and parse_trusted_keys(None) == {}
    for bad, why in [("ours", "kid=path"), ("ours=/nonexistent.pem", "neither PEM text nor a readable file"),
                     ('{"ours": 1}', "JSON object"), ("{", "not valid JSON"),
                     (json.dumps({"ours": "-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----"}), "ours")]:
        with pytest.raises(ValueError, match=why):
            parse_trusted_keys(bad)


# --- property tests: every new input --------------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=20)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.text(max_size=200))
def test_any_trusted_keys_setting_is_read_or_refused_with_a_value_error(spec: str) -> None:
    try:
        keys = parse_trusted_keys(spec)
    except ValueError:
        return
    assert isinstance(keys, dict)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(st.text(max_size=20), _json, max_size=6))
def test_any_card_json_is_verified_or_refused_as_untrusted(card: dict[str, Any]) -> None:
    with pytest.raises(UntrustedCard):
        verify_card(card, TRUSTED)  # nothing random carries a signature by our key


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
          deadline=None)
@given(field=st.sampled_from(["name", "description", "version"]), text=st.text(min_size=1, max_size=40))
def test_any_change_to_a_signed_card_is_refused(card: dict[str, Any], field: str, text: str) -> None:
    signed = sign_card(card, EC_PRIVATE, "ours")
    changed = copy.deepcopy(signed)
    changed[field] = signed[field] + text
    with pytest.raises(UntrustedCard):
        verify_card(changed, TRUSTED)


# --- on the wire ------------------------------------------------------------------------------------

async def test_the_served_card_is_signed_with_the_configured_key(app_factory: Any, tmp_path: Path) -> None:
    key_file = tmp_path / "card.pem"
    key_file.write_text(EC_PRIVATE)
    async with app_factory(env={"SERVICE_CARD_SIGNING_KEY": str(key_file), "SERVICE_CARD_SIGNING_KID": "ours"}) as client:
        for headers in ({"A2A-Version": "1.0"}, {}):
            served = (await client.http.get("/.well-known/agent-card.json", headers=headers)).json()
            assert served["signatures"]
            verify_card(served, TRUSTED)


@pytest.fixture(scope="module")
def signed_remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("signed-remote")
    service = Service(tmp, {"SERVICE_DATABASE_URL": f"sqlite:///{tmp / 'remote.db'}",
                            "SERVICE_CARD_SIGNING_KEY": EC_PRIVATE, "SERVICE_CARD_SIGNING_KID": "ours"},
                      "signed-remote").start()
    try:
        yield service
    finally:
        service.stop()


def _ask(url: str) -> dict[str, Any]:
    tid = f"ask-{uuid.uuid4().hex[:8]}"
    return {"id": tid, "name": "ask", "schemas": {"method": "a2a_agent_executor"},
            "inputs": {"agent_url": url, "data": {"tasks": [
                {"id": f"r-{uuid.uuid4().hex[:8]}", "name": "r", "schemas": {"method": "noop_executor"}}]}}}


async def test_the_executor_trusts_a_signed_card_and_refuses_a_tampered_or_unsigned_one(
        signed_remote: Service, app_factory: Any) -> None:
    async with httpx.AsyncClient(timeout=HEAVY_WORK_TIMEOUT) as http:
        good = (await http.get(f"{signed_remote.url}/.well-known/agent-card.json")).json()
    tampered = {**good, "description": good.get("description", "") + " (and more)"}
    unsigned = {k: v for k, v in good.items() if k != "signatures"}

    def card_app(body: dict[str, Any]) -> Starlette:
        async def card_route(_request: Any) -> JSONResponse:
            return JSONResponse(body)
        return Starlette(routes=[Route("/.well-known/agent-card.json", card_route)])

    env = {"SERVICE_AGENT_TRUSTED_KEYS": json.dumps({"ours": EC_PUBLIC})}
    async with app_factory(env=env) as client:
        done = await client.result("tasks.create", [_ask(signed_remote.url)])
        assert done["status"] == "completed", done["error"]
        for body, why in [(tampered, "tampered"), (unsigned, "is not signed")]:
            async with serve(card_app(body)) as url:
                failed = await client.result("tasks.create", [_ask(url)])
            assert failed["status"] == "failed"
            assert why in failed["error"] and "the agent card of" in failed["error"], failed["error"]
            assert failed["attempt"] == 1
