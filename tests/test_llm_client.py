"""llm/client.py against the fake OpenAI-compatible server: resolution, keys, usage, errors, laziness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from taskgrove.agent.foundations.settings import Settings
from taskgrove.llm.client import (
    LLMAuthError,
    LLMClient,
    LLMConnectionError,
    LLMKeyMissingError,
    LLMProviderError,
    LLMRateLimitError,
    LLMUnknownProviderError,
    detect_provider,
    parse_key_header,
    redact,
)

ROOT = Path(__file__).resolve().parents[1]
USER = [{"role": "user", "content": "hello there"}]


def fake_settings(fake, **env: str) -> Settings:
    return Settings(llm_base_url=fake.base_url, llm_max_retries=0, llm_timeout=30.0, environ=dict(env))


# -- pure helpers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        ("sk-abc123", (None, "sk-abc123")),
        ("openai:sk-abc123", ("openai", "sk-abc123")),
        ("Anthropic:sk-ant-xyz", ("anthropic", "sk-ant-xyz")),
        ("google:AIzaKEY", ("gemini", "AIzaKEY")),
        ("  groq:gsk_1  ", ("groq", "gsk_1")),
        ("tenant:secret:with:colons", (None, "tenant:secret:with:colons")),  # unknown prefix: all key
        ("mistral:part:two", ("mistral", "part:two")),
    ],
)
def test_parse_key_header(value, expected):
    assert parse_key_header(value) == expected


@pytest.mark.parametrize("value", ["", "   ", "openai:", "openai:  "])
def test_parse_key_header_rejects_empty(value):
    with pytest.raises(ValueError, match="X-LLM-API-KEY"):
        parse_key_header(value)


@pytest.mark.parametrize(
    "model, provider",
    [
        ("gpt-4o-mini", "openai"), ("o3-mini", "openai"), ("claude-3-5-sonnet-latest", "anthropic"),
        ("gemini-2.0-flash", "gemini"), ("mistral-large-latest", "mistral"), ("deepseek-chat", "deepseek"),
        ("command-r-plus", "cohere"), ("groq/llama-3.1-8b-instant", "groq"), ("google/gemini-pro", "gemini"),
        ("llama-3.1-8b", None), (None, None),
    ],
)
def test_detect_provider(model, provider):
    assert detect_provider(model) == provider


def test_resolution_order():
    client = LLMClient(Settings(llm_provider="anthropic", environ={"ANTHROPIC_MODEL": "claude-x"}))
    assert client.resolve_provider() == "anthropic"                      # SERVICE_LLM_PROVIDER
    assert client.resolve_provider("google") == "gemini"                 # argument, alias
    assert client.resolve_provider(model="gpt-4o") == "openai"           # model name wins over default
    assert LLMClient(Settings()).resolve_provider() == "openai"          # first vendor
    assert client.resolve_model("anthropic") == "claude-x"               # <VENDOR>_MODEL
    assert client.resolve_model("anthropic", "claude-y") == "claude-y"   # argument
    assert client.resolve_model("openai") == "gpt-4o-mini"               # vendor default
    with pytest.raises(LLMUnknownProviderError, match="unknown LLM provider 'acme'"):
        client.resolve_provider("acme")


def test_redact_never_leaks_keys():
    msg = redact("Incorrect API key provided: sk-proj-abcdef123456 and my-own-secret", "my-own-secret")
    assert "abcdef123456" not in msg and "my-own-secret" not in msg


# -- keys ---------------------------------------------------------------------------------------


async def test_missing_key_names_variable_and_header():
    client = LLMClient(Settings(environ={}), key_lookup=None)
    with pytest.raises(LLMKeyMissingError) as err:
        await client.complete(USER, provider="anthropic")
    assert "ANTHROPIC_API_KEY" in str(err.value) and "X-LLM-API-KEY" in str(err.value)


async def test_key_precedence_header_then_stored_then_env(fake_llm):
    stored: dict[tuple[str | None, str], str] = {("u1", "openai"): "sk-stored"}
    calls: list[tuple[str | None, str]] = []

    async def lookup(user_id, provider):
        calls.append((user_id, provider))
        return stored.get((user_id, provider))

    client = LLMClient(fake_settings(fake_llm, OPENAI_API_KEY="sk-env"), key_lookup=lookup)
    await client.complete(USER, api_key="sk-header", user_id="u1")
    await client.complete(USER, user_id="u1")
    await client.complete(USER, user_id="u2")
    auth = [r["authorization"] for r in fake_llm.requests]
    assert auth == ["Bearer sk-header", "Bearer sk-stored", "Bearer sk-env"]
    assert ("u1", "openai") in calls and ("u2", "default") in calls  # provider key, then "default"


# -- calls --------------------------------------------------------------------------------------


async def test_complete_returns_text_usage_and_accumulates(fake_llm):
    client = LLMClient(fake_settings(fake_llm))
    first = await client.complete(USER, model="my-model", temperature=0.2, max_tokens=50)
    assert first.text == "echo: hello there"
    assert first.usage == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    assert (first.model, first.provider) == ("my-model", "openai")
    sent = fake_llm.requests[-1]
    assert sent["model"] == "my-model" and sent["temperature"] == 0.2 and sent["max_tokens"] == 50
    await client.complete(USER)
    assert client.usage == {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}


async def test_streaming_chunks_and_usage(fake_llm):
    client = LLMClient(fake_settings(fake_llm))
    chunks: list[str] = []

    async def on_chunk(piece: str) -> None:
        chunks.append(piece)

    result = await client.complete([{"role": "user", "content": "one two three"}], stream=True, on_chunk=on_chunk)
    assert result.text == "echo: one two three" == "".join(chunks)
    assert len(chunks) == 4
    assert result.usage["total_tokens"] == 15
    assert fake_llm.requests[-1]["stream"] is True


async def test_on_chunk_errors_propagate_unchanged(fake_llm):
    def boom(piece: str) -> None:
        raise RuntimeError("callback broke")

    with pytest.raises(RuntimeError, match="callback broke"):
        await LLMClient(fake_settings(fake_llm)).complete(USER, stream=True, on_chunk=boom)


@pytest.mark.parametrize(
    "marker, error, words",
    [
        ("[[error:401]]", LLMAuthError, ["rejected the API key", "OPENAI_API_KEY"]),
        ("[[error:429]]", LLMRateLimitError, ["rate limit"]),
        ("[[error:500]]", LLMProviderError, ["failed", "500"]),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_provider_errors_are_mapped_without_the_key(fake_llm, marker, error, words, stream):
    secret = "sk-very-secret-key-1234567890"
    client = LLMClient(fake_settings(fake_llm))
    with pytest.raises(error) as err:
        await client.complete([{"role": "user", "content": marker}], api_key=secret, stream=stream)
    text = str(err.value)
    assert all(w in text for w in words), text
    assert secret not in text and "1234567890" not in text


async def test_unreachable_base_url_is_a_connection_error():
    client = LLMClient(Settings(llm_base_url="http://127.0.0.1:9/v1", llm_max_retries=0, environ={}))
    with pytest.raises(LLMConnectionError, match="could not connect"):
        await client.complete(USER)


# -- laziness and no internet -------------------------------------------------------------------


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    full_env.update(env)
    full_env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=120)


def test_importing_llm_modules_does_not_import_litellm():
    proc = _run("""
        import sys
        import taskgrove.llm, taskgrove.llm.client, taskgrove.llm.generate, taskgrove.executors.llm
        print("litellm" in sys.modules, any(m.startswith("litellm.") for m in sys.modules))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


def test_no_network_beyond_the_configured_base_url(fake_llm):
    """Import litellm (via the client), stream, call, generate: only loopback is ever contacted."""
    proc = _run("""
        import asyncio, json, socket
        attempts = []
        def local(host):
            return str(host) in ("127.0.0.1", "localhost", "::1")
        real_gai, real_connect = socket.getaddrinfo, socket.socket.connect
        def gai(host, *a, **k):
            if not local(host):
                attempts.append(str(host)); raise socket.gaierror("blocked by test")
            return real_gai(host, *a, **k)
        def connect(self, address):
            if isinstance(address, tuple) and not local(address[0]):
                attempts.append(str(address)); raise OSError("blocked by test")
            return real_connect(self, address)
        socket.getaddrinfo, socket.socket.connect = gai, connect

        import os
        from taskgrove.agent.foundations.settings import Settings
        from taskgrove.llm.client import LLMClient
        from taskgrove.llm.generate import generate_tree
        async def main():
            client = LLMClient(Settings(llm_base_url=os.environ["FAKE_URL"], llm_max_retries=0, environ={}))
            await client.complete([{"role": "user", "content": "hi"}])
            await client.complete([{"role": "user", "content": "hi"}], stream=True)
            await generate_tree("[[tree:valid]] do it", client=client,
                                executors=[{"id": "llm_executor"}, {"id": "aggregate_results_executor"}])
        asyncio.run(main())
        print(json.dumps({"attempts": attempts, "flag": os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP")}))
    """, FAKE_URL=fake_llm.base_url)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"attempts": [], "flag": "True"}
    assert len(fake_llm.requests) == 3
