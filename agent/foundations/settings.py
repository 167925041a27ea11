"""Every SERVICE_* variable, parsed once into one frozen object.

The process environment is read in exactly one place (`Settings.from_env`); everything else receives
a `Settings` instance, so tests can build as many differently configured apps as they like.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from taskgrove.storage import jsonvalues


class SettingsError(ValueError):
    """A configuration value is unusable; the message names the variable."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(f"{name} must be true or false, got {raw!r}")


def _int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise SettingsError(f"{name} must be between {low} and {high}, got {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {raw!r}") from None
    if not low <= value <= high:
        raise SettingsError(f"{name} must be between {low} and {high}, got {value}")
    return value


def _optional_float(env: Mapping[str, str], name: str, low: float, high: float) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    return _float(env, name, 0.0, low, high)


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
MAX_DURATION_SECONDS = 100 * 365 * 86_400.0


def parse_duration(raw: str) -> float:
    """`30d`, `12h`, `15m`, `90s` or plain seconds (`3600`, `0.5`) as seconds; ValueError otherwise.
    One reading for every duration a person writes (SERVICE_RETENTION, tasks.purge's older_than)."""
    text = raw.strip().lower()
    unit = _DURATION_UNITS.get(text[-1:], None) if text else None
    number = text[:-1] if unit is not None else text
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        raise ValueError(f"must be a duration like 30d, 12h, 15m, 90s or plain seconds, got {raw!r}") from None
    if not 0 < seconds <= MAX_DURATION_SECONDS:  # also refuses nan (every comparison false) and inf
        raise ValueError(f"must be a duration above 0 and at most 100 years, got {raw!r}")
    return seconds


def _optional_duration(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip().lower() in ("", "off", "none", "0"):
        return None
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise SettingsError(f"{name} {exc}") from None


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = (env.get(name) or "").strip().lower() or default
    if value not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _caps(env: Mapping[str, str], name: str) -> dict[str, int]:
    """`llm_executor=4,rest_executor=16` -> {"llm_executor": 4, "rest_executor": 16}."""
    caps: dict[str, int] = {}
    for item in _list(env, name) or ():
        executor, sep, number = item.partition("=")
        try:
            cap = int(number)
        except ValueError:
            cap = 0
        if not sep or not executor.strip() or cap < 1:
            raise SettingsError(f"{name} must look like 'llm_executor=4,rest_executor=16', got {item!r}")
        caps[executor.strip()] = cap
    return caps


_PER = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_rate(text: str) -> float | None:
    """`5/s`, `60/m`, `1000/h` or a bare number (per second) -> events per second; None if malformed.

    One reading for every rate the service accepts (settings and a task's `rate_limit`)."""
    number, sep, unit = text.strip().partition("/")
    try:
        value = float(number)
    except ValueError:
        return None
    per = _PER.get(unit.strip().lower() or "s") if sep or not unit else None
    if per is None or not 0 < value < float("inf"):
        return None
    return value / per


def _rates(env: Mapping[str, str], name: str) -> dict[str, float]:
    """`openai=60/m,search=5/s` -> {"openai": 1.0, "search": 5.0} (per second)."""
    rates: dict[str, float] = {}
    for item in _list(env, name) or ():
        key, sep, rate = item.partition("=")
        per_second = parse_rate(rate) if sep else None
        if not key.strip() or per_second is None:
            raise SettingsError(f"{name} must look like 'openai=60/m,search=5/s', got {item!r}")
        rates[key.strip()] = per_second
    return rates


def _weights(env: Mapping[str, str], name: str) -> dict[str, float]:
    """`alice=2,bob=0.5` -> {"alice": 2.0, "bob": 0.5}."""
    weights: dict[str, float] = {}
    for item in _list(env, name) or ():
        user, sep, number = item.partition("=")
        try:
            weight = float(number)
        except ValueError:
            weight = 0.0
        if not sep or not user.strip() or not 0 < weight <= 1000:
            raise SettingsError(f"{name} must look like 'alice=2,bob=0.5' (weights above 0, at most 1000), "
                                f"got {item!r}")
        weights[user.strip()] = weight
    return weights


def _list(env: Mapping[str, str], name: str) -> tuple[str, ...] | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def _traces_exporter(env: Mapping[str, str]) -> tuple[str, ...]:
    """OTEL_TRACES_EXPORTER as a list of exporters; unset means none (traces are off by default
    here, unlike the OpenTelemetry default of otlp). OTLP is spoken over HTTP (protobuf) only."""
    names = tuple(n.lower() for n in _list(env, "OTEL_TRACES_EXPORTER") or ())
    unknown = [n for n in names if n not in ("otlp", "console", "none")]
    if unknown:
        raise SettingsError(f"OTEL_TRACES_EXPORTER must name otlp, console or none, got {unknown[0]!r}")
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    if "otlp" in names and protocol != "http/protobuf":
        raise SettingsError(f"OTEL_EXPORTER_OTLP_PROTOCOL must be http/protobuf (OTLP over HTTP), got {protocol!r}")
    return tuple(n for n in names if n != "none")


def _optional(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    return raw if raw not in (None, "") else None


def _db_connections(env: Mapping[str, str], name: str) -> dict[str, dict[str, Any]]:
    """`{"name": {"url": "...", "allow_write": false}}` for database_executor; {} when unset."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise SettingsError(f"{name} must be a JSON object, could not parse it: {exc}") from None
    if not isinstance(parsed, dict):
        raise SettingsError(f"{name} must be a JSON object of named connections")
    connections: dict[str, dict[str, Any]] = {}
    for key, spec in parsed.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("url"), str) or not spec["url"]:
            raise SettingsError(f'{name}: connection {key!r} must be an object with a "url" string')
        if not isinstance(spec.get("allow_write", False), bool):
            raise SettingsError(f"{name}: connection {key!r} allow_write must be true or false")
        connections[key] = {"url": spec["url"], "allow_write": spec.get("allow_write", False)}
    return connections


def normalize_database_url(raw: str, name: str = "SERVICE_DATABASE_URL") -> str:
    """Turn any accepted spelling into the async SQLAlchemy URL we connect with."""
    url = raw.strip()
    if url.startswith("sqlite+aiosqlite://"):
        return url
    if url.startswith("sqlite://"):
        return "sqlite+aiosqlite://" + url[len("sqlite://"):]
    if url.startswith("postgresql+asyncpg://"):
        return url
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix):]
    raise SettingsError(
        f"{name} must start with sqlite:///, sqlite+aiosqlite:///, postgresql:// or "
        f"postgresql+asyncpg://, got {raw!r}"
    )


PROTOCOLS = ("a2a", "graphql")


@dataclass(frozen=True)
class Settings:
    api_protocol: str = "a2a"
    enable_docs: bool = True
    enable_system_routes: bool = True
    # The MCP surface at /mcp (streamable HTTP, agent/surfaces/mcp/).
    enable_mcp: bool = True
    # Run due schedules (engine/schedule_loop.py); off: schedules.* still answer, this instance runs no slot.
    enable_scheduler: bool = True
    # The dashboard at /ui (static ES modules in agent/surfaces/ui/static/, calling /tasks, /system and /ws).
    enable_ui: bool = True
    api_host: str = "0.0.0.0"
    api_port: int = 8000
    # The A2A gRPC transport (agent/surfaces/a2a/grpc_server.py) listens on api_host:grpc_port; None: not served.
    grpc_port: int | None = None
    jwt_secret: str | None = None
    jwt_algorithms: tuple[str, ...] = ("HS256",)
    extensions: tuple[str, ...] | None = None
    llm_provider: str | None = None
    llm_base_url: str | None = None
    # Seconds one LLM call may take, and how often a failed call is retried (llm/client.py).
    llm_timeout: float = 120.0
    llm_max_retries: int = 2
    # The circuit breaker per LLM provider and model (llm/breaker.py): open after this many failures
    # in a row (0: no breaker), half-open after the delay.
    llm_breaker_failures: int = 5
    llm_breaker_reset_seconds: float = 30.0
    database_url: str = field(
        default_factory=lambda: "sqlite+aiosqlite:///" + str(Path.cwd() / "taskgrove.db")
    )
    # Public address put in the agent card; derived from host and port when unset.
    public_url: str | None = None
    # Engine: how many tasks one instance runs at the same time.
    max_concurrency: int = 16
    # How long tasks.create waits for the tree to finish before answering its current state.
    create_wait_timeout: float = 30.0
    # Program names command_executor may run; empty means the executor refuses every command.
    command_allowlist: tuple[str, ...] = ()
    # Webhooks, push notifications and rest_executor may reach private/loopback addresses.
    allow_private_urls: bool = False
    # database_executor: named connections from SERVICE_DB_CONNECTIONS (URLs hold passwords: no repr).
    database_connections: Mapping[str, Mapping[str, Any]] = field(
        default_factory=dict, repr=False, hash=False
    )
    # database_executor may connect to a URL given in task inputs (SERVICE_DB_ALLOW_INPUT_URL).
    database_allow_input_url: bool = False
    # Server secret from which the key that encrypts stored LLM keys is derived.
    secret_key: str | None = None
    # --- trust in agent cards (docs/agents.md, "Trust"; executors/card_trust.py) ---
    # Our card is signed with this PEM private key (its text or a file path) under this key id.
    card_signing_key: str | None = field(default=None, repr=False)
    card_signing_kid: str = "taskgrove"
    # Keys that vouch for remote cards (JSON {kid: PEM or path}, or kid=path,...): when set, a remote
    # card must carry a valid signature by one of them.
    agent_trusted_keys: str | None = None
    # --- durable execution (docs/failures.md) ---
    # Retry policy of tasks that do not give their own `retry` (engine/retry_policy.py).
    default_max_attempts: int = 1
    default_backoff: str = "exponential"
    default_retry_base_seconds: float = 1.0
    default_retry_max_seconds: float = 300.0
    default_retry_jitter: bool = True
    # Seconds one attempt may run when the task gives no timeout_seconds; None: no limit.
    default_timeout_seconds: float | None = None
    # How long a claim or an execution stays an instance's without renewal (renewed every third).
    lease_seconds: float = 30.0
    # An outcome (result) larger or deeper than this fails its task alone instead of being stored.
    max_result_bytes: int = 16 * 1024 * 1024
    max_result_depth: int = 100
    # Largest checkpoint one executor may store for its task.
    max_checkpoint_bytes: int = 1024 * 1024
    # Log lines kept per attempt (task logs, agent/engine/logbook.py): bytes of text; 0 keeps none.
    max_log_bytes: int = 64 * 1024
    # /metrics (Prometheus text); it follows JWT when JWT is on unless metrics_public.
    enable_metrics: bool = True
    metrics_public: bool = False
    # `taskgrove serve` logging: "text" or "json" (one object per line), and the level.
    log_format: str = "text"
    log_level: str = "INFO"
    # On SIGTERM: seconds running tasks may take to finish before the rest are handed back.
    shutdown_grace_seconds: float = 30.0
    # How long the first answer to a request with an Idempotency-Key header is kept for resends.
    idempotency_seconds: float = 86_400.0
    # Retention (docs/retention.md): trees that ended longer ago than this many seconds are deleted
    # by a background sweeper; None (the default): nothing is ever deleted by age.
    retention_seconds: float | None = None
    # A schedule's ended runs beyond its newest this many are deleted by the sweeper, even within
    # the retention (only when retention is on; tasks.purge always applies it).
    schedule_keep_runs: int = 100
    # Per-executor caps on concurrent executions in this instance, e.g. {"llm_executor": 4}.
    executor_concurrency: Mapping[str, int] = field(default_factory=dict, hash=False)
    # An attempt cut off by the platform (crash, lost lease, shutdown past its grace) runs again
    # without using up the task's retries, at most this many times per task; then the task fails.
    max_interruptions: int = 3
    # sleep_executor parks (a durable timer: no slot, survives restarts) for sleeps at least this
    # long; shorter ones sleep in process, which costs less than the two writes of a park.
    park_sleep_seconds: float = 5.0
    # --- sharing the service (docs/sharing.md) ---
    # Fair share: a user's weight (default 1); a user of weight 2 gets twice the slots under contention.
    user_weights: Mapping[str, float] = field(default_factory=dict, hash=False)
    # Deployment-wide limits per concurrency key (tasks of a key in progress at once, all instances).
    concurrency_limits: Mapping[str, int] = field(default_factory=dict, hash=False)
    # Deployment-wide rates per rate-limit key, in attempts per second (all instances).
    rate_limits: Mapping[str, float] = field(default_factory=dict, hash=False)
    # Most tasks one user may have pending or in progress; a create past it is refused (429). 0: no limit.
    max_pending_per_user: int = 20_000
    # Requests per second one user may send on any surface, with a burst; 0: no limit.
    rate_limit_per_user: float = 200.0
    rate_limit_burst: int = 400
    # Users with the `admin` role are not held to the two quotas above.
    quota_exempt_admins: bool = True
    # Each user's daily LLM budget (docs/costs.md), in US dollars and in tokens, per UTC day;
    # None: no limit. An admin's config.budget.set replaces them for one user.
    user_daily_budget_usd: float | None = None
    user_daily_budget_tokens: int | None = None
    # --- input limits (docs/limits.md; issue 11 item 7, issue 18) ---
    # Largest request body on any HTTP surface (HTTP 413 beyond), and the per-message limit of
    # GraphQL WebSocket messages (closed with 1009 beyond).
    max_request_bytes: int = 16 * 1024 * 1024
    # Deepest JSON nesting accepted in a request (storage.jsonvalues says why 100, and why at most 500).
    max_json_depth: int = jsonvalues.DEFAULT_MAX_DEPTH
    # Most tasks one tasks.create, tasks.copy or tasks.clone may write.
    max_tree_tasks: int = 10_000
    # Most calls in one JSON-RPC batch.
    max_batch: int = 100
    # Largest /ws client message (an error message beyond; the connection stays open).
    max_ws_message_bytes: int = 64 * 1024
    # Refuse tokens that name no user (neither user_id nor sub); recommended in production.
    jwt_require_subject: bool = False
    # GraphQL cost limits: selection depth, aliases and tokens per document, list items per request.
    graphql_max_depth: int = 10
    graphql_max_aliases: int = 30
    graphql_max_tokens: int = 5000
    graphql_max_list_items: int = 5000
    # Traces (agent/foundations/tracing.py, docs/observability.md): the exporters OTEL_TRACES_EXPORTER names
    # (otlp = OTLP over HTTP, console; empty or none: traces off) and the service's name in them.
    # The exporters' own variables (OTEL_EXPORTER_OTLP_*, OTEL_BSP_*, ...) are read by the SDK.
    traces_exporter: tuple[str, ...] = ()
    traces_service_name: str = "taskgrove"
    # --- the directory of agents (docs/agents.md) ---
    # Card URLs seeded as shared agents at start; cards are fetched again every refresh seconds.
    agents: tuple[str, ...] = ()
    agent_refresh_seconds: float = 3600.0
    # An agent's breaker opens after this many failed calls in a row (0: never) and lets one probe
    # through after the cool-down; tasks for an open agent wait, holding no slot.
    agent_breaker_failures: int = 5
    agent_breaker_cooldown_seconds: float = 30.0
    # Tasks delegated to one agent in progress at once (concurrency key `agent:<name>`).
    agent_concurrency: int = 8
    # Every variable as read, for vendor-specific LLM variables (<VENDOR>_API_KEY, <VENDOR>_MODEL).
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        env = dict(os.environ if env is None else env)
        protocol = env.get("SERVICE_API_PROTOCOL", "a2a").strip().lower() or "a2a"
        if protocol not in PROTOCOLS:
            raise SettingsError(f"SERVICE_API_PROTOCOL must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        db_raw = env.get("SERVICE_DATABASE_URL")
        values: dict[str, Any] = dict(
            api_protocol=protocol,
            enable_docs=_bool(env, "SERVICE_ENABLE_DOCS", True),
            enable_system_routes=_bool(env, "SERVICE_ENABLE_SYSTEM_ROUTES", True),
            enable_mcp=_bool(env, "SERVICE_ENABLE_MCP", True),
            enable_scheduler=_bool(env, "SERVICE_ENABLE_SCHEDULER", True),
            enable_ui=_bool(env, "SERVICE_ENABLE_UI", True),
            api_host=env.get("SERVICE_API_HOST", "0.0.0.0").strip() or "0.0.0.0",
            api_port=_int(env, "SERVICE_API_PORT", 8000, 1, 65535),
            grpc_port=_int(env, "SERVICE_GRPC_PORT", 0, 1, 65535) or None,
            jwt_secret=_optional(env, "SERVICE_JWT_SECRET"),
            jwt_algorithms=_list(env, "SERVICE_JWT_ALGORITHMS") or ("HS256",),
            extensions=_list(env, "SERVICE_EXTENSIONS"),
            llm_provider=_optional(env, "SERVICE_LLM_PROVIDER"),
            llm_base_url=_optional(env, "SERVICE_LLM_BASE_URL"),
            llm_timeout=_float(env, "SERVICE_LLM_TIMEOUT", 120.0, 0.1, 3600.0),
            llm_max_retries=_int(env, "SERVICE_LLM_MAX_RETRIES", 2, 0, 10),
            llm_breaker_failures=_int(env, "SERVICE_LLM_BREAKER_FAILURES", 5, 0, 1000),
            llm_breaker_reset_seconds=_float(env, "SERVICE_LLM_BREAKER_RESET_SECONDS", 30.0, 0.0, 86_400.0),
            public_url=_optional(env, "SERVICE_PUBLIC_URL"),
            max_concurrency=_int(env, "SERVICE_MAX_CONCURRENCY", 16, 1, 10_000),
            create_wait_timeout=_float(env, "SERVICE_CREATE_WAIT_TIMEOUT", 30.0, 0.0, 86_400.0),
            command_allowlist=_list(env, "SERVICE_COMMAND_ALLOWLIST") or (),
            allow_private_urls=_bool(env, "SERVICE_ALLOW_PRIVATE_URLS", False),
            database_connections=_db_connections(env, "SERVICE_DB_CONNECTIONS"),
            database_allow_input_url=_bool(env, "SERVICE_DB_ALLOW_INPUT_URL", False),
            secret_key=_optional(env, "SERVICE_SECRET_KEY"),
            card_signing_key=_optional(env, "SERVICE_CARD_SIGNING_KEY"),
            card_signing_kid=_optional(env, "SERVICE_CARD_SIGNING_KID") or "taskgrove",
            agent_trusted_keys=_optional(env, "SERVICE_AGENT_TRUSTED_KEYS"),
            default_max_attempts=_int(env, "SERVICE_DEFAULT_MAX_ATTEMPTS", 1, 1, 100),
            default_backoff=_choice(env, "SERVICE_DEFAULT_BACKOFF", "exponential", ("fixed", "exponential", "linear")),
            default_retry_base_seconds=_float(env, "SERVICE_DEFAULT_RETRY_BASE_SECONDS", 1.0, 0.0, 604_800.0),
            default_retry_max_seconds=_float(env, "SERVICE_DEFAULT_RETRY_MAX_SECONDS", 300.0, 0.0, 604_800.0),
            default_retry_jitter=_bool(env, "SERVICE_DEFAULT_RETRY_JITTER", True),
            default_timeout_seconds=_optional_float(env, "SERVICE_DEFAULT_TIMEOUT_SECONDS", 0.001, 604_800.0),
            lease_seconds=_float(env, "SERVICE_LEASE_SECONDS", 30.0, 1.0, 3600.0),
            max_result_bytes=_int(env, "SERVICE_MAX_RESULT_BYTES", 16 * 1024 * 1024, 1024, 2**31 - 1),
            max_result_depth=_int(env, "SERVICE_MAX_RESULT_DEPTH", 100, 2, 10_000),
            max_checkpoint_bytes=_int(env, "SERVICE_MAX_CHECKPOINT_BYTES", 1024 * 1024, 64, 2**31 - 1),
            max_log_bytes=_int(env, "SERVICE_MAX_LOG_BYTES", 64 * 1024, 0, 2**31 - 1),
            executor_concurrency=_caps(env, "SERVICE_EXECUTOR_CONCURRENCY"),
            enable_metrics=_bool(env, "SERVICE_ENABLE_METRICS", True),
            metrics_public=_bool(env, "SERVICE_METRICS_PUBLIC", False),
            log_format=_choice(env, "SERVICE_LOG_FORMAT", "text", ("text", "json")),
            log_level=_choice(env, "SERVICE_LOG_LEVEL", "info", ("debug", "info", "warning", "error", "critical")).upper(),
            shutdown_grace_seconds=_float(env, "SERVICE_SHUTDOWN_GRACE_SECONDS", 30.0, 0.0, 3600.0),
            idempotency_seconds=_float(env, "SERVICE_IDEMPOTENCY_SECONDS", 86_400.0, 1.0, 30 * 86_400.0),
            max_interruptions=_int(env, "SERVICE_MAX_INTERRUPTIONS", 3, 0, 100),
            retention_seconds=_optional_duration(env, "SERVICE_RETENTION"),
            schedule_keep_runs=_int(env, "SERVICE_SCHEDULE_KEEP_RUNS", 100, 1, 1_000_000),
            park_sleep_seconds=_float(env, "SERVICE_PARK_SLEEP_SECONDS", 5.0, 0.0, 86_400.0),
            user_weights=_weights(env, "SERVICE_USER_WEIGHTS"),
            concurrency_limits=_caps(env, "SERVICE_CONCURRENCY_LIMITS"),
            rate_limits=_rates(env, "SERVICE_RATE_LIMITS"),
            max_pending_per_user=_int(env, "SERVICE_MAX_PENDING_PER_USER", 20_000, 0, 100_000_000),
            rate_limit_per_user=_float(env, "SERVICE_RATE_LIMIT_PER_USER", 200.0, 0.0, 1_000_000.0),
            rate_limit_burst=_int(env, "SERVICE_RATE_LIMIT_BURST", 400, 1, 10_000_000),
            quota_exempt_admins=_bool(env, "SERVICE_QUOTA_EXEMPT_ADMINS", True),
            user_daily_budget_usd=_optional_float(env, "SERVICE_USER_DAILY_BUDGET_USD", 0.0, 1e9),
            user_daily_budget_tokens=_int(env, "SERVICE_USER_DAILY_BUDGET_TOKENS", 0, 0, 10**15) or None,
            # input limits
            max_request_bytes=_int(env, "SERVICE_MAX_REQUEST_BYTES", 16 * 1024 * 1024, 1024, 2**31 - 1),
            max_json_depth=_int(env, "SERVICE_MAX_JSON_DEPTH", jsonvalues.DEFAULT_MAX_DEPTH, 4,
                                jsonvalues.STORED_MAX_DEPTH),
            max_tree_tasks=_int(env, "SERVICE_MAX_TREE_TASKS", 10_000, 1, 1_000_000),
            max_batch=_int(env, "SERVICE_MAX_BATCH", 100, 1, 100_000),
            max_ws_message_bytes=_int(env, "SERVICE_MAX_WS_MESSAGE_BYTES", 64 * 1024, 256, 2**31 - 1),
            jwt_require_subject=_bool(env, "SERVICE_JWT_REQUIRE_SUBJECT", False),
            graphql_max_depth=_int(env, "SERVICE_GRAPHQL_MAX_DEPTH", 10, 1, 100),
            graphql_max_aliases=_int(env, "SERVICE_GRAPHQL_MAX_ALIASES", 30, 0, 10_000),
            graphql_max_tokens=_int(env, "SERVICE_GRAPHQL_MAX_TOKENS", 5000, 100, 1_000_000),
            graphql_max_list_items=_int(env, "SERVICE_GRAPHQL_MAX_LIST_ITEMS", 5000, 1, 10_000_000),
            traces_exporter=_traces_exporter(env),
            traces_service_name=_optional(env, "OTEL_SERVICE_NAME") or "taskgrove",
            agents=_list(env, "SERVICE_AGENTS") or (),
            agent_refresh_seconds=_float(env, "SERVICE_AGENT_REFRESH_SECONDS", 3600.0, 1.0, 30 * 86_400.0),
            agent_breaker_failures=_int(env, "SERVICE_AGENT_BREAKER_FAILURES", 5, 0, 1000),
            agent_breaker_cooldown_seconds=_float(env, "SERVICE_AGENT_BREAKER_COOLDOWN_SECONDS", 30.0, 0.0, 86_400.0),
            agent_concurrency=_int(env, "SERVICE_AGENT_CONCURRENCY", 8, 1, 100_000),
            environ=env,
        )
        if db_raw is not None and db_raw.strip():
            values["database_url"] = normalize_database_url(db_raw)
        values.update(overrides)
        if "database_url" in overrides:
            values["database_url"] = normalize_database_url(values["database_url"])
        return cls(**values)

    def with_(self, **changes: Any) -> "Settings":
        """A copy with some values changed (tests and the CLI use this)."""
        if "database_url" in changes:
            changes["database_url"] = normalize_database_url(changes["database_url"])
        return replace(self, **changes)

    @property
    def default_retry(self) -> dict[str, Any]:
        """The retry policy of a task that gives none (engine/retry_policy.py)."""
        return {"max_attempts": self.default_max_attempts, "backoff": self.default_backoff,
                "base_seconds": self.default_retry_base_seconds, "max_seconds": self.default_retry_max_seconds,
                "jitter": self.default_retry_jitter}

    @property
    def jwt_enabled(self) -> bool:
        return bool(self.jwt_secret)

    @property
    def base_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "localhost" if self.api_host in ("0.0.0.0", "::", "") else self.api_host
        host = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
        return f"http://{host}:{self.api_port}"

    @property
    def grpc_address(self) -> str | None:
        """`host:port` of the gRPC transport as the agent card names it: the host of base_url (the
        public address when SERVICE_PUBLIC_URL is set), the port SERVICE_GRPC_PORT; None when off."""
        if self.grpc_port is None:
            return None
        host = urlsplit(self.base_url).hostname or "localhost"
        return f"[{host}]:{self.grpc_port}" if ":" in host else f"{host}:{self.grpc_port}"
