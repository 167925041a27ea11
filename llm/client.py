"""One small client over litellm: provider, model, key and base-URL resolution, usage, errors.

Why a wrapper at all: every LLM feature (tasks.generate, llm_executor, generate_executor,
crew_executor) must resolve keys the same way (header > stored per-user key > environment),
report token usage the same way, and turn provider failures into messages that never leak a key.

Why lazy: litellm takes seconds to import, so it is imported on the first call only, in a worker
thread (an import inside a coroutine would block the event loop for those seconds). Importing this
module must stay cheap; a test checks `litellm` is absent from `sys.modules` after importing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from taskgrove.llm import retry as llm_retry
from taskgrove.llm import usage as llm_usage
from taskgrove.llm.usage import CallUsage

# litellm fetches a model price map from GitHub at import unless told to use its bundled copy.
# Set it before the (lazy) import so the service never reaches the internet on its own.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

KeyLookup = Callable[[str | None, str], Awaitable[str | None]]


class Meter(Protocol):
    """Asked around each call (llm/budget.py explains it; agent/services/budget_service.py implements it):
    `before` returns the model to call (`usable(model)`: whether its circuit breaker lets a call
    through) or raises; `after` counts the call's usage."""

    async def before(self, provider: str, model: str, max_tokens: int, prompt_tokens: int,
                     price: Callable[[str, int, int], float | None], usable: Callable[[str], bool]) -> str: ...

    async def after(self, call: CallUsage) -> None: ...


class BreakerGate(Protocol):
    """The circuit breakers of a service (llm/breaker.py): asked before a call, told its outcome."""

    def usable(self, provider: str, model: str) -> bool: ...

    def check(self, provider: str, model: str) -> None: ...

    def record(self, provider: str, model: str, error: BaseException | None) -> None: ...


class LLMSettings(Protocol):
    """What the client reads from the service's settings (taskgrove.agent.foundations.settings.Settings has it)."""

    @property
    def llm_provider(self) -> str | None: ...
    @property
    def llm_base_url(self) -> str | None: ...
    @property
    def llm_timeout(self) -> float: ...
    @property
    def llm_max_retries(self) -> int: ...
    @property
    def environ(self) -> Mapping[str, str]: ...

ChunkCallback = Callable[[str], "Awaitable[None] | None"]
Message = Mapping[str, Any]


@dataclass(frozen=True)
class Provider:
    """A supported vendor: where its key and model come from and how litellm names it."""

    id: str
    key_var: str
    model_var: str
    default_model: str
    prefix: str  # litellm routing prefix, e.g. "anthropic/"
    needs_key: bool = True
    model_patterns: tuple[str, ...] = ()  # regexes on a bare model name -> this provider


# Order matters: the first entry is the default provider (SPEC: "default the first").
PROVIDERS: dict[str, Provider] = {
    p.id: p
    for p in (
        Provider("openai", "OPENAI_API_KEY", "OPENAI_MODEL", "gpt-4o-mini", "openai/",
                 model_patterns=(r"gpt-", r"chatgpt", r"o[1-9](-|$)", r"text-davinci", r"davinci")),
        Provider("anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_MODEL", "claude-3-5-haiku-latest",
                 "anthropic/", model_patterns=(r"claude",)),
        Provider("gemini", "GEMINI_API_KEY", "GEMINI_MODEL", "gemini-2.0-flash", "gemini/",
                 model_patterns=(r"gemini", r"gemma")),
        Provider("mistral", "MISTRAL_API_KEY", "MISTRAL_MODEL", "mistral-small-latest", "mistral/",
                 model_patterns=(r"mistral", r"mixtral", r"codestral", r"ministral", r"magistral",
                                 r"pixtral", r"open-mistral")),
        Provider("groq", "GROQ_API_KEY", "GROQ_MODEL", "llama-3.1-8b-instant", "groq/"),
        Provider("deepseek", "DEEPSEEK_API_KEY", "DEEPSEEK_MODEL", "deepseek-chat", "deepseek/",
                 model_patterns=(r"deepseek",)),
        Provider("cohere", "COHERE_API_KEY", "COHERE_MODEL", "command-r", "cohere_chat/",
                 model_patterns=(r"command",)),
        Provider("ollama", "OLLAMA_API_KEY", "OLLAMA_MODEL", "llama3.1", "ollama_chat/",
                 needs_key=False),
        Provider("openrouter", "OPENROUTER_API_KEY", "OPENROUTER_MODEL", "openai/gpt-4o-mini",
                 "openrouter/"),
    )
}
ALIASES: dict[str, str] = {"google": "gemini", "claude": "anthropic"}
# Extra key variables honoured after the main one (vendors' own SDKs use these names too).
_EXTRA_KEY_VARS: dict[str, tuple[str, ...]] = {"gemini": ("GOOGLE_API_KEY",)}
DEFAULT_PROVIDER = next(iter(PROVIDERS))


class LLMError(Exception):
    """Any failure of an LLM call; the message is safe to show (it never contains a key).
    `retryable`: whether another attempt of the task may do better (a budget's refusal may not)."""

    retryable = True


class LLMKeyMissingError(LLMError):
    """No key was found for the provider in the header, the user's stored keys or the environment."""


class LLMUnknownProviderError(LLMError, ValueError):
    """The requested provider is not one we support."""


class LLMAuthError(LLMError):
    """The provider refused the key (HTTP 401/403)."""


class LLMRateLimitError(LLMError):
    """The provider throttled the request (HTTP 429)."""


class LLMConnectionError(LLMError):
    """The provider (or the configured base URL) could not be reached."""


class LLMTimeoutError(LLMConnectionError):
    """The provider did not answer in time."""


class LLMBadRequestError(LLMError):
    """The provider rejected the request itself (unknown model, bad parameters, context too long)."""


class LLMProviderError(LLMError):
    """The provider failed on its side (HTTP 5xx) or returned something unusable."""


# Failures that say the provider is unwell for now (a timeout is a connection error): a call is
# retried after them (llm/retry.py) and its circuit breaker counts them (llm/breaker.py). A refused
# key or a bad request says nothing about the provider's health.
TRANSIENT = (LLMProviderError, LLMRateLimitError, LLMConnectionError)


@dataclass
class Completion:
    """The text of one answer, its token usage and where it came from."""

    text: str
    usage: dict[str, int]
    model: str
    provider: str
    cost_usd: float | None = None  # None: the model has no price in litellm's table


def empty_usage() -> dict[str, int]:
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def add_usage(total: dict[str, int], more: Mapping[str, int] | None) -> dict[str, int]:
    """Add `more` into `total` in place (and return it); missing keys count as zero."""
    if more:
        for k in ("prompt_tokens", "completion_tokens"):
            total[k] = total.get(k, 0) + int(more.get(k) or 0)
        total["total_tokens"] = total.get("total_tokens", 0) + int(
            more.get("total_tokens") or (int(more.get("prompt_tokens") or 0) + int(more.get("completion_tokens") or 0))
        )
    return total


def estimate_tokens(text: str) -> int:
    """Rough token count (about 4 characters per token).

    Used only when the provider has not reported usage yet (a cancelled or streaming call):
    an exact tokenizer may need a download for some models, and this must stay offline and cheap.
    """
    return (len(text) + 3) // 4 if text else 0


def normalize_provider(name: str | None) -> str | None:
    """Canonical provider id for `name` (case-insensitive, aliases resolved), or None if unknown."""
    if not name:
        return None
    value = name.strip().lower()
    value = ALIASES.get(value, value)
    return value if value in PROVIDERS else None


def detect_provider(model: str | None) -> str | None:
    """Guess the provider from a model name: `gpt-*` -> openai, `claude*` -> anthropic, ...

    A `<provider>/<model>` name names its provider explicitly. Returns None when unsure
    (e.g. `llama-*` is served by several vendors).
    """
    if not model:
        return None
    name = model.strip().lower()
    if "/" in name:
        head = normalize_provider(name.split("/", 1)[0])
        if head:
            return head
        name = name.rsplit("/", 1)[1]
    for provider in PROVIDERS.values():
        if any(re.match(p, name) for p in provider.model_patterns):
            return provider.id
    return None


def parse_key_header(value: str) -> tuple[str | None, str]:
    """Split an `X-LLM-API-KEY` value into (provider, key).

    `<key>` gives (None, key); `<provider>:<key>` gives (provider, key), but only when the part
    before the first colon is a known provider id or alias, because some vendors' keys contain
    colons themselves. Raises ValueError when no key is left.
    """
    raw = (value or "").strip()
    provider: str | None = None
    if ":" in raw:
        head, rest = raw.split(":", 1)
        known = normalize_provider(head)
        if known:
            provider, raw = known, rest.strip()
    if not raw:
        raise ValueError("X-LLM-API-KEY header is empty: send <API_KEY> or <provider>:<API_KEY>")
    return provider, raw


_KEYLIKE = re.compile(r"\b(sk|gsk|pk|rk|key|AIza)[-_][A-Za-z0-9*_\-]{6,}|\bAIza[A-Za-z0-9_\-]{10,}")


def redact(text: str, *secrets: str | None) -> str:
    """Remove secrets (and anything shaped like an API key) from a message meant for users."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return _KEYLIKE.sub("[redacted]", text)


_litellm: Any = None


async def _load_litellm() -> Any:
    """Import litellm once, in a thread, so the event loop keeps serving during the import."""
    global _litellm
    if _litellm is None:
        def _import() -> Any:
            import litellm

            litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banners on errors
            litellm.telemetry = False
            return litellm

        _litellm = await asyncio.to_thread(_import)
    return _litellm


class _CallbackFailed(Exception):
    """Carries an exception raised by `on_chunk` past the provider-error mapping."""

    def __init__(self, original: Exception) -> None:
        super().__init__(str(original))
        self.original = original


@dataclass
class _Call:
    """What is known about the call in flight, so cancel() can report usage so far."""

    prompt_tokens: int = 0
    text: list[str] = field(default_factory=list)


class LLMClient:
    """Resolves provider/model/key/base URL from settings and calls litellm.

    `key_lookup(user_id, provider)` returns the user's stored key (the auth store provides it).
    `usage` holds the running token total of every call made through this instance, so an executor
    making several calls reads its total here; `usage_so_far()` adds an estimate for a call in flight.
    `spend` is the same total with its cost and number of calls (llm/usage.py); `meter`, when
    given, is asked before every call (budgets) and told of every call as it ends (the stored sums).
    """

    def __init__(self, settings: LLMSettings, key_lookup: KeyLookup | None = None,
                 meter: Meter | None = None, breakers: BreakerGate | None = None,
                 traceparent: str | None = None) -> None:
        self.settings = settings
        self.key_lookup = key_lookup
        self.meter = meter
        self.breakers = breakers  # llm/breaker.py: one per provider and model, shared by the service
        # Sent as the `traceparent` header of every call (the attempt's span while traces are on),
        # so a traced LLM gateway puts its spans in the execution's trace.
        self.traceparent = traceparent
        self.usage: dict[str, int] = empty_usage()
        self.spend: dict[str, Any] = llm_usage.empty()
        self._call: _Call | None = None

    # -- resolution -------------------------------------------------------------------------

    def _env(self) -> Mapping[str, str]:
        # Settings is the one reader of the process environment (Settings.from_env fills `environ`).
        return getattr(self.settings, "environ", None) or {}

    def resolve_provider(self, provider: str | None = None, model: str | None = None) -> str:
        """Argument > provider named by the model > SERVICE_LLM_PROVIDER > first vendor (openai)."""
        if provider:
            known = normalize_provider(provider)
            if known is None:
                raise LLMUnknownProviderError(
                    f"unknown LLM provider {provider!r}; supported: {', '.join(PROVIDERS)} (alias google=gemini)"
                )
            return known
        detected = detect_provider(model)
        if detected:
            return detected
        configured = getattr(self.settings, "llm_provider", None)
        if configured:
            return self.resolve_provider(configured)
        return DEFAULT_PROVIDER

    def resolve_model(self, provider: str, model: str | None = None) -> str:
        """Argument > <VENDOR>_MODEL > the vendor's default model."""
        spec = PROVIDERS[provider]
        return model or self._env().get(spec.model_var) or spec.default_model

    async def resolve_key(self, provider: str, api_key: str | None = None, user_id: str | None = None) -> str | None:
        """Header key > stored key for (user, provider), then (user, "default") > <VENDOR>_API_KEY."""
        if api_key:
            return api_key
        if self.key_lookup is not None:
            for name in (provider, "default"):
                try:
                    stored = await self.key_lookup(user_id, name)
                except LLMError:  # a lookup that explains itself (e.g. the secret was changed)
                    raise
                except Exception as exc:  # the store's own error text may not be safe to show
                    raise LLMError(f"could not read the stored LLM key for provider {provider!r}: "
                                   f"{type(exc).__name__}") from None
                if stored:
                    return stored
        env = self._env()
        for var in (PROVIDERS[provider].key_var, *_EXTRA_KEY_VARS.get(provider, ())):
            if env.get(var):
                return env[var]
        return None

    def missing_key_error(self, provider: str) -> LLMKeyMissingError:
        var = PROVIDERS[provider].key_var
        return LLMKeyMissingError(
            f"no LLM API key for provider {provider!r}: set the {var} environment variable, store a key "
            f"with config.llm_key.set, or send the X-LLM-API-KEY header (<API_KEY> or {provider}:<API_KEY>)"
        )

    # -- calls ------------------------------------------------------------------------------

    def usage_so_far_in_flight(self) -> dict[str, int]:
        """Estimated usage of the call in flight (zero when none): its prompt plus text streamed so far."""
        if self._call is None:
            return empty_usage()
        return add_usage(empty_usage(), {"prompt_tokens": self._call.prompt_tokens,
                                         "completion_tokens": estimate_tokens("".join(self._call.text))})

    def usage_so_far(self) -> dict[str, int]:
        """Total usage of finished calls plus an estimate for the call in flight (for cancel)."""
        return add_usage(dict(self.usage), self.usage_so_far_in_flight())

    @property
    def unstored_spend(self) -> dict[str, Any] | None:
        """What this client's calls used that no meter stored: all of `spend` without a meter;
        None with one, whose `after` added each call to the stored sums as it ended. The engine
        adds it to the task's usage when the attempt ends (executors/base.py, `llm_usage`)."""
        return None if self.meter is not None else self.spend

    @property
    def partial_text(self) -> str:
        """Text received so far by a streaming call in flight ("" when none)."""
        return "".join(self._call.text) if self._call is not None else ""

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        provider: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        user_id: str | None = None,
        temperature: float = 0.7,
        max_tokens: int = 4000,
        stream: bool = False,
        on_chunk: ChunkCallback | None = None,
    ) -> Completion:
        """Send a chat completion and return its text and usage.

        With `stream=True` each text delta is passed to `on_chunk` (sync or async) as it arrives.
        Raises LLMKeyMissingError, LLMUnknownProviderError or another LLMError subclass.
        """
        provider_id = self.resolve_provider(provider, model)
        spec = PROVIDERS[provider_id]
        model_name = self.resolve_model(provider_id, model)
        key = await self.resolve_key(provider_id, api_key, user_id)
        base_url = getattr(self.settings, "llm_base_url", None)
        if not base_url and not key and spec.needs_key:
            raise self.missing_key_error(provider_id)
        litellm = await _load_litellm()
        prompt_tokens = sum(estimate_tokens(str(m.get("content") or "")) for m in messages)
        if self.meter is not None:  # budgets: may refuse the call, or switch to a fallback model
            def price(name: str, prompt: int, completion: int) -> float | None:
                return llm_usage.price(litellm, _routed(spec, name, base_url), prompt, completion)

            def usable(name: str) -> bool:
                return self.breakers is None or self.breakers.usable(provider_id, name)

            model_name = await self.meter.before(provider_id, model_name, max_tokens, prompt_tokens, price, usable)
        kwargs: dict[str, Any] = {
            "messages": [dict(m) for m in messages],
            "temperature": temperature,
            "max_tokens": max_tokens,
            "timeout": float(getattr(self.settings, "llm_timeout", 120.0)),
            "num_retries": 0, "max_retries": 0,  # one try each: _send_retrying retries (llm/retry.py)
        }
        kwargs.update(model=_routed(spec, model_name, base_url))
        if self.breakers is not None:
            self.breakers.check(provider_id, model_name)
        if base_url:
            # An OpenAI-compatible server (Ollama, vLLM, a test double): speak the OpenAI protocol.
            kwargs.update(api_base=base_url, api_key=key or "no-key")
        elif key:
            kwargs["api_key"] = key

        if self.traceparent:
            kwargs["extra_headers"] = {"traceparent": self.traceparent}
        self._call = _Call(prompt_tokens=prompt_tokens)
        try:
            text, usage = await self._send_retrying(litellm, kwargs, stream, on_chunk, provider_id)
        except asyncio.CancelledError:
            # Cancelled mid-call: the prompt (and any streamed text) was likely billed; keep the estimate.
            with contextlib.suppress(LLMError):  # a budget it exceeded must not replace the cancel
                await self._account(litellm, self.usage_so_far_in_flight(), provider_id, model_name,
                                    kwargs["model"])
            raise
        except LLMError:
            raise
        except _CallbackFailed as failed:  # the caller's on_chunk failed, not the provider
            raise failed.original from None
        except Exception as exc:
            if self._call.text:  # failed mid-stream: what was generated was likely billed
                with contextlib.suppress(LLMError):  # the provider's failure is the one to tell
                    await self._account(litellm, self.usage_so_far_in_flight(), provider_id, model_name,
                                        kwargs["model"])
            mapped = map_error(exc, provider_id, key)
            if self.breakers is not None:
                self.breakers.record(provider_id, model_name, mapped)
            raise mapped from None
        finally:
            self._call = None
        if self.breakers is not None:
            self.breakers.record(provider_id, model_name, None)
        call = await self._account(litellm, usage, provider_id, model_name, kwargs["model"])
        return Completion(text=text, usage=usage, model=model_name, provider=provider_id, cost_usd=call.cost_usd)

    async def _send_retrying(self, litellm: Any, kwargs: dict[str, Any], stream: bool,
                             on_chunk: ChunkCallback | None, provider: str) -> tuple[str, dict[str, int]]:
        """The call, tried again after a failure that says the provider is unwell for now (TRANSIENT:
        a 429, a 5xx, a timeout, a refused connection), at most SERVICE_LLM_MAX_RETRIES times, each
        after the answer's Retry-After (llm/retry.py); never once text has arrived (it was billed)."""
        retries = int(getattr(self.settings, "llm_max_retries", 2))
        tried = 0
        while True:
            try:
                return await self._send(litellm, kwargs, stream, on_chunk)
            except (LLMError, _CallbackFailed):
                raise
            except Exception as exc:
                assert self._call is not None
                wait = llm_retry.wait_seconds(exc, tried) if tried < retries and not self._call.text \
                    and isinstance(map_error(exc, provider), TRANSIENT) else None
                if wait is None:
                    raise
                tried += 1
                await asyncio.sleep(wait)

    async def _send(self, litellm: Any, kwargs: dict[str, Any], stream: bool,
                    on_chunk: ChunkCallback | None) -> tuple[str, dict[str, int]]:
        """One try of the call: its text and usage (estimated when the provider reported none)."""
        assert self._call is not None
        if stream:
            text, usage = await self._stream(litellm, kwargs, on_chunk)
        else:
            response = await litellm.acompletion(**kwargs)
            text = response.choices[0].message.content or ""
            usage = llm_usage.reported(response)
        if usage is None:
            usage = {"prompt_tokens": self._call.prompt_tokens, "completion_tokens": estimate_tokens(text)}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return text, usage

    async def _account(self, litellm: Any, usage: Mapping[str, int], provider: str, model: str,
                       routed: str) -> CallUsage:
        """Add one call's usage to the totals, priced from litellm's table, and tell the meter."""
        add_usage(self.usage, usage)
        prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        call = CallUsage(provider, model, prompt, completion, llm_usage.price(litellm, routed, prompt, completion))
        self.spend = llm_usage.add(self.spend, call.as_usage())
        if self.meter is not None:
            await self.meter.after(call)
        return call

    async def _stream(
        self, litellm: Any, kwargs: dict[str, Any], on_chunk: ChunkCallback | None
    ) -> tuple[str, dict[str, int] | None]:
        assert self._call is not None
        response = await litellm.acompletion(**kwargs, stream=True, stream_options={"include_usage": True})
        usage: dict[str, int] | None = None
        async for chunk in response:
            reported = llm_usage.reported(chunk)
            if reported and reported.get("total_tokens"):
                usage = reported
            choices = getattr(chunk, "choices", None) or []
            delta = getattr(choices[0], "delta", None) if choices else None
            piece = getattr(delta, "content", None) if delta is not None else None
            if piece:
                self._call.text.append(piece)
                if on_chunk is not None:
                    try:
                        maybe = on_chunk(piece)
                        if inspect.isawaitable(maybe):
                            await maybe
                    except Exception as exc:
                        raise _CallbackFailed(exc) from exc
        return "".join(self._call.text), usage


def _routed(spec: Provider, model: str, base_url: str | None) -> str:
    """litellm's name of the model: an OpenAI-compatible base URL is spoken to as OpenAI."""
    if base_url:
        return f"openai/{model}"
    return model if model.startswith(spec.prefix) else spec.prefix + model


def map_error(exc: BaseException, provider: str, key: str | None = None) -> LLMError:
    """Turn a litellm/openai exception into an LLMError with a clear message and no key in it."""
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    detail = redact(str(getattr(exc, "message", None) or exc), key)
    prefix = re.compile(r"^(litellm\.)?\w*(Error|Exception|Timeout):\s*")
    while prefix.match(detail):
        detail = prefix.sub("", detail, count=1)
    detail = re.sub(r"\b\w*Exception - ", "", detail).strip()
    if len(detail) > 300:
        detail = detail[:300] + "..."
    var = PROVIDERS[provider].key_var
    checks: list[tuple[tuple[str, ...], type[LLMError], str]] = [
        (("Timeout", "APITimeoutError", "TimeoutError", "ReadTimeout", "ConnectTimeout", "ServerTimeoutError"),
         LLMTimeoutError, f"LLM provider {provider!r} timed out"),
        (("AuthenticationError", "PermissionDeniedError"), LLMAuthError,
         f"LLM provider {provider!r} rejected the API key; check {var}, the stored key or the X-LLM-API-KEY header"),
        (("RateLimitError",), LLMRateLimitError, f"LLM provider {provider!r} rate limit exceeded; retry later"),
        (("APIConnectionError", "ConnectError", "ClientConnectorError", "ConnectionError"), LLMConnectionError, f"could not connect to LLM provider {provider!r}"),
        (("BadRequestError", "NotFoundError", "UnprocessableEntityError", "ContextWindowExceededError",
          "UnsupportedParamsError", "InvalidRequestError", "LiteLLMUnknownProvider"),
         LLMBadRequestError, f"LLM provider {provider!r} rejected the request"),
    ]
    # litellm reports a refused connection as InternalServerError("Connection error."); the real
    # cause sits further down the exception chain, so look there too.
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 8:
        chain.append(current)
        current = current.__cause__ or current.__context__
    for link in chain:
        mro = {cls.__name__ for cls in type(link).__mro__}
        for names, cls, text in checks:
            if mro.intersection(names):
                return cls(f"{text}: {detail}" if detail else text)
    if status in (401, 403):
        return LLMAuthError(f"LLM provider {provider!r} rejected the API key; check {var}: {detail}")
    if status == 429:
        return LLMRateLimitError(f"LLM provider {provider!r} rate limit exceeded: {detail}")
    text = f"LLM provider {provider!r} failed"
    if status:
        text += f" (HTTP {status})"
    return LLMProviderError(f"{text}: {detail or name}")
