"""Settings.from_env: defaults, every SERVICE_* variable of SPEC.md, database URL spellings, and
start-up errors that name the variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from taskgrove.agent.cli import main
from taskgrove.agent.foundations.settings import Settings, SettingsError


def test_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env({})
    assert s.api_protocol == "a2a"
    assert s.enable_docs is True and s.enable_system_routes is True
    assert s.api_host == "0.0.0.0" and s.api_port == 8000
    assert s.jwt_secret is None and s.jwt_enabled is False
    assert s.extensions is None and s.llm_provider is None
    assert s.database_url == "sqlite+aiosqlite:///" + str(Path(tmp_path) / "taskgrove.db")
    assert s.base_url == "http://localhost:8000"
    assert s.grpc_port is None and s.grpc_address is None  # gRPC is off unless SERVICE_GRPC_PORT is set


@pytest.mark.parametrize("env,address", [
    ({"SERVICE_GRPC_PORT": "50051"}, "localhost:50051"),
    ({"SERVICE_GRPC_PORT": "50051", "SERVICE_API_HOST": "10.0.0.7"}, "10.0.0.7:50051"),
    ({"SERVICE_GRPC_PORT": "50051", "SERVICE_API_HOST": "::1"}, "[::1]:50051"),
    ({"SERVICE_GRPC_PORT": "443", "SERVICE_PUBLIC_URL": "https://agents.example.com/taskgrove/"},
     "agents.example.com:443"),
])
def test_grpc_address_is_the_card_host_with_the_grpc_port(env, address):
    assert Settings.from_env(env).grpc_address == address


def test_every_service_variable_is_read():
    s = Settings.from_env({
        "SERVICE_API_PROTOCOL": "graphql",
        "SERVICE_ENABLE_DOCS": "false",
        "SERVICE_ENABLE_SYSTEM_ROUTES": "0",
        "SERVICE_API_HOST": "127.0.0.1",
        "SERVICE_API_PORT": "9123",
        "SERVICE_JWT_SECRET": "s3cret",
        "SERVICE_EXTENSIONS": "stdio, http,,core ",
        "SERVICE_LLM_PROVIDER": "anthropic",
        "SERVICE_DATABASE_URL": "sqlite:////tmp/x.db",
    })
    assert s.api_protocol == "graphql"
    assert s.enable_docs is False and s.enable_system_routes is False
    assert s.api_host == "127.0.0.1" and s.api_port == 9123
    assert s.jwt_secret == "s3cret" and s.jwt_enabled is True
    assert s.extensions == ("stdio", "http", "core")
    assert s.llm_provider == "anthropic"
    assert s.database_url == "sqlite+aiosqlite:////tmp/x.db"
    assert s.base_url == "http://127.0.0.1:9123"


@pytest.mark.parametrize("raw,expected", [
    ("true", True), ("TRUE", True), ("1", True), ("yes", True), ("on", True), (" True ", True),
    ("false", False), ("0", False), ("no", False), ("off", False), ("False", False),
])
def test_boolean_spellings(raw, expected):
    s = Settings.from_env({"SERVICE_ENABLE_DOCS": raw, "SERVICE_ENABLE_SYSTEM_ROUTES": raw})
    assert s.enable_docs is expected and s.enable_system_routes is expected


@pytest.mark.parametrize("raw", ["a2a", "A2A", " graphql "])
def test_protocol_spellings(raw):
    assert Settings.from_env({"SERVICE_API_PROTOCOL": raw}).api_protocol == raw.strip().lower()


def test_empty_values_mean_unset():
    s = Settings.from_env({"SERVICE_JWT_SECRET": "", "SERVICE_EXTENSIONS": " ", "SERVICE_LLM_PROVIDER": "",
                           "SERVICE_API_PORT": "", "SERVICE_API_HOST": "", "SERVICE_API_PROTOCOL": ""})
    assert s.jwt_secret is None and s.extensions is None and s.llm_provider is None
    assert s.api_port == 8000 and s.api_host == "0.0.0.0" and s.api_protocol == "a2a"


@pytest.mark.parametrize("raw,expected", [
    ("sqlite:///relative.db", "sqlite+aiosqlite:///relative.db"),
    ("sqlite:////abs/path/tg.db", "sqlite+aiosqlite:////abs/path/tg.db"),
    ("sqlite+aiosqlite:///x.db", "sqlite+aiosqlite:///x.db"),
    ("postgresql://user:pw@db:5432/tg", "postgresql+asyncpg://user:pw@db:5432/tg"),
    ("postgresql+asyncpg://user@db/tg", "postgresql+asyncpg://user@db/tg"),
    ("postgres://user@db/tg", "postgresql+asyncpg://user@db/tg"),
    ("  postgresql://db/tg  ", "postgresql+asyncpg://db/tg"),
])
def test_database_url_spellings(raw, expected):
    assert Settings.from_env({"SERVICE_DATABASE_URL": raw}).database_url == expected


def test_database_url_override_and_with_are_normalised_too():
    s = Settings.from_env({}, database_url="postgresql://db/tg")
    assert s.database_url == "postgresql+asyncpg://db/tg"
    assert s.with_(database_url="sqlite:///y.db").database_url == "sqlite+aiosqlite:///y.db"
    assert s.with_(api_port=1).api_port == 1 and s.api_port == 8000  # frozen: with_ returns a copy


def test_from_env_without_argument_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv("SERVICE_API_PORT", "8765")
    monkeypatch.setenv("SERVICE_LLM_PROVIDER", "openai")
    s = Settings.from_env()
    assert s.api_port == 8765 and s.llm_provider == "openai"


def test_settings_are_frozen():
    s = Settings.from_env({})
    with pytest.raises(AttributeError):
        s.api_port = 1  # type: ignore[misc]


@pytest.mark.parametrize("env,pattern", [
    ({"SERVICE_API_PORT": "eighty"}, r"SERVICE_API_PORT must be an integer, got 'eighty'"),
    ({"SERVICE_API_PORT": "0"}, r"SERVICE_API_PORT must be between 1 and 65535, got 0"),
    ({"SERVICE_API_PORT": "70000"}, r"SERVICE_API_PORT must be between 1 and 65535, got 70000"),
    ({"SERVICE_GRPC_PORT": "grpc"}, r"SERVICE_GRPC_PORT must be an integer, got 'grpc'"),
    ({"SERVICE_GRPC_PORT": "0"}, r"SERVICE_GRPC_PORT must be between 1 and 65535, got 0"),
    ({"SERVICE_API_PORT": "80.5"}, r"SERVICE_API_PORT must be an integer, got '80.5'"),
    ({"SERVICE_ENABLE_DOCS": "maybe"}, r"SERVICE_ENABLE_DOCS must be true or false, got 'maybe'"),
    ({"SERVICE_ENABLE_SYSTEM_ROUTES": "2"}, r"SERVICE_ENABLE_SYSTEM_ROUTES must be true or false, got '2'"),
    ({"SERVICE_API_PROTOCOL": "soap"}, r"SERVICE_API_PROTOCOL must be one of a2a, graphql, got 'soap'"),
    ({"SERVICE_DATABASE_URL": "mysql://db/tg"}, r"SERVICE_DATABASE_URL must start with .*, got 'mysql://db/tg'"),
    ({"SERVICE_DATABASE_URL": "taskgrove.db"}, r"SERVICE_DATABASE_URL must start with .*, got 'taskgrove.db'"),
])
def test_bad_values_raise_settings_error_naming_the_variable(env, pattern):
    with pytest.raises(SettingsError) as raised:
        Settings.from_env(env)
    assert re.fullmatch(pattern, str(raised.value)), str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_cli_reports_a_bad_value_at_start_up(monkeypatch, capsys):
    monkeypatch.setenv("SERVICE_API_PORT", "not-a-port")
    with pytest.raises(SystemExit) as raised:
        main(["serve"])
    assert str(raised.value) == "taskgrove: configuration error: SERVICE_API_PORT must be an integer, got 'not-a-port'"


async def test_system_routes_can_be_switched_off(app_factory):
    async with app_factory(env={"SERVICE_ENABLE_SYSTEM_ROUTES": "false"}) as client:
        response = await client.http.post("/system", json={"jsonrpc": "2.0", "method": "system.health", "id": 1})
        assert response.status_code in (404, 405)
        assert (await client.http.post("/tasks", json={"jsonrpc": "2.0", "method": "tasks.list", "id": 1})).json() \
            == {"jsonrpc": "2.0", "id": 1, "result": []}
    async with app_factory() as client:
        health = await client.result("system.health", path="/system")
        assert health["status"] == "healthy"


INPUT_LIMITS = {
    "SERVICE_MAX_REQUEST_BYTES": ("max_request_bytes", 16 * 1024 * 1024, "2048"),
    "SERVICE_MAX_JSON_DEPTH": ("max_json_depth", 100, "32"),
    "SERVICE_MAX_TREE_TASKS": ("max_tree_tasks", 10_000, "500"),
    "SERVICE_MAX_BATCH": ("max_batch", 100, "7"),
    "SERVICE_MAX_WS_MESSAGE_BYTES": ("max_ws_message_bytes", 64 * 1024, "4096"),
    "SERVICE_GRAPHQL_MAX_DEPTH": ("graphql_max_depth", 10, "6"),
    "SERVICE_GRAPHQL_MAX_ALIASES": ("graphql_max_aliases", 30, "3"),
    "SERVICE_GRAPHQL_MAX_TOKENS": ("graphql_max_tokens", 5000, "800"),
    "SERVICE_GRAPHQL_MAX_LIST_ITEMS": ("graphql_max_list_items", 5000, "50"),
}


def test_input_limits_have_defaults_and_are_read():
    defaults = Settings.from_env({})
    for variable, (name, default, raw) in INPUT_LIMITS.items():
        assert getattr(defaults, name) == default, variable
        assert getattr(Settings.from_env({variable: raw}), name) == int(raw), variable
    assert defaults.jwt_require_subject is False
    assert Settings.from_env({"SERVICE_JWT_REQUIRE_SUBJECT": "true"}).jwt_require_subject is True


@pytest.mark.parametrize("variable, raw", [("SERVICE_MAX_JSON_DEPTH", "1000"), ("SERVICE_MAX_JSON_DEPTH", "2"),
                                           ("SERVICE_MAX_BATCH", "0"), ("SERVICE_MAX_TREE_TASKS", "x"),
                                           ("SERVICE_MAX_REQUEST_BYTES", "10")])
def test_input_limits_out_of_range_stop_start_up(variable, raw):
    with pytest.raises(SettingsError, match=variable):
        Settings.from_env({variable: raw})
