"""tasks.generate and the LLM executors through HTTP against the app; the LLM is tests/fakellm.py.

Nothing here reaches the internet: every app either points SERVICE_LLM_BASE_URL at the local fake
server, or has no base URL and no key (so the client refuses before any request).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from typing import Any

import jwt
import pytest


HEADER_KEY = "sk-header-secret-0123456789"
ENV_KEY = "sk-env-secret-0123456789"
SECRET = "generate-rpc-test-secret-0123456789abcdef"


def tree(*tasks: dict[str, Any]) -> str:
    return "```json\n" + json.dumps(list(tasks)) + "\n```"


def t(id_: str | None, name: str = "noop_executor", parent: str | None = None, deps: tuple[str, ...] = (),
      **extra: Any) -> dict[str, Any]:
    task = {"name": name, "parent_id": parent, "inputs": {"label": id_},
            "dependencies": [{"id": d, "required": True} for d in deps], **extra}
    if id_ is not None:
        task["id"] = id_
    return task


# A fan-in tree of always-available executors: two no-ops, the root aggregates them.
GOOD = [t("root", "aggregate_results_executor", deps=("a", "b"), priority=1),
        t("a", parent="root", priority=0), t("b", parent="root", deps=("a",), priority=2)]


def llm_env(fake: Any, **extra: str) -> dict[str, str]:
    return {"SERVICE_LLM_BASE_URL": fake.base_url, "SERVICE_LLM_MAX_RETRIES": "0", **extra}


# -- a valid tree: returned, saved, executed ---------------------------------------------------


async def test_generate_returns_validated_tree(app_factory, fake_llm):
    fake_llm.script("[[good]]", [tree(*GOOD)])
    async with app_factory(env=llm_env(fake_llm)) as c:
        out = await c.result("tasks.generate", {"requirement": "[[good]] add two numbers"})
        assert out["count"] == 3 and len(out["tasks"]) == 3
        root, a, b = out["tasks"]
        assert root["name"] == "aggregate_results_executor" and root["parent_id"] is None
        assert {a["name"], b["name"]} == {"noop_executor"} and a["parent_id"] == b["parent_id"] == root["id"]
        assert {d["id"] for d in root["dependencies"]} == {a["id"], b["id"]}
        assert b["dependencies"] == [{"id": a["id"], "required": True}]
        assert (a["priority"], b["priority"], a["inputs"]) == (0, 2, {"label": "a"})
        assert "root_task_id" not in out and "not saved" in out["message"]
        assert out["token_usage"]["total_tokens"] == 15
        assert await c.result("tasks.get", {"task_id": root["id"]}) is None  # not saved
    (request,) = fake_llm.requests
    system = request["messages"][0]["content"]
    assert "- noop_executor:" in system and "- aggregate_results_executor:" in system
    assert "- generate_executor:" not in system  # never offered to the model
    assert request["temperature"] == 0.7 and request["max_tokens"] == 4000


async def test_generate_passes_model_temperature_max_tokens(app_factory, fake_llm):
    fake_llm.script("[[good]]", [tree(*GOOD)])
    async with app_factory(env=llm_env(fake_llm)) as c:
        await c.result("tasks.generate", {"requirement": "[[good]]", "model": "my-model", "temperature": 0,
                                          "max_tokens": 123})
    request = fake_llm.requests[-1]
    assert (request["model"], request["temperature"], request["max_tokens"]) == ("my-model", 0, 123)


async def test_generate_with_save_creates_a_pending_tree_that_executes(app_factory, fake_llm):
    fake_llm.script("[[good]]", [tree(*GOOD)])
    async with app_factory(env=llm_env(fake_llm)) as c:
        out = await c.result("tasks.generate", {"requirement": "[[good]]", "save": True, "user_id": "alice"})
        root_id = out["root_task_id"]
        assert root_id == out["tasks"][0]["id"] and "tasks.execute" in out["message"]
        assert all(task["user_id"] == "alice" for task in out["tasks"])
        stored = await c.result("tasks.get", {"task_id": root_id})
        assert stored["status"] == "pending" and stored["user_id"] == "alice"  # saved, not started
        nested = await c.result("tasks.tree", {"task_id": root_id})
        assert len(nested["children"]) == 2
        started = await c.result("tasks.execute", {"task_id": root_id})
        assert started["success"] is True
        done = await c.wait_status(root_id, ("completed", "failed"))
        assert done["status"] == "completed", done
        assert done["result"]["count"] == 2
        for task in out["tasks"][1:]:
            assert (await c.result("tasks.get", {"task_id": task["id"]}))["status"] == "completed"


async def test_saved_tree_never_contains_the_key(app_factory, fake_llm):
    fake_llm.script("[[good]]", [tree(*GOOD)])
    async with app_factory(env=llm_env(fake_llm)) as c:
        answer = await c.call("tasks.generate", {"requirement": "[[good]]", "save": True},
                              headers={"X-LLM-API-KEY": HEADER_KEY})
        root_id = answer["result"]["root_task_id"]
        stored = await c.result("tasks.tree", {"task_id": root_id})
    assert HEADER_KEY not in json.dumps(answer) and HEADER_KEY not in json.dumps(stored)


# -- validation: each rule, the repair round ----------------------------------------------------

BAD = {
    "unknown executor": ([t("r"), t("a", name="web_scraper", parent="r")],
                         "name 'web_scraper' is not an available executor id"),
    "generate_executor not offered": ([t("r"), t("a", name="generate_executor", parent="r")],
                                      "name 'generate_executor' is not an available executor id"),
    "mixed ids": ([t("r"), t(None, parent="r")], "either all tasks have an id or none"),
    "missing parent": ([t("r"), t("a", parent="nope")], "parent_id 'nope' does not exist"),
    "missing dependency": ([t("r", deps=("ghost",)), t("a", parent="r")], "dependency 'ghost' does not exist"),
    "cycle": ([t("r"), t("a", parent="r", deps=("b",)), t("b", parent="r", deps=("a",))], "dependency cycle"),
    "two roots": ([t("r"), t("s")], "multiple root tasks"),
    "unreachable": ([t("r"), t("x", parent="y"), t("y", parent="x")], "not reachable from the root"),
}


@pytest.mark.parametrize("rule", list(BAD))
async def test_each_validation_rule_rejects_with_the_problem(app_factory, fake_llm, rule):
    bad, phrase = BAD[rule]
    fake_llm.script("[[bad]]", [tree(*bad)])  # the same bad tree on the repair round too
    async with app_factory(env=llm_env(fake_llm)) as c:
        error = await c.error("tasks.generate", {"requirement": "[[bad]] do it", "save": True})
        assert await c.result("tasks.list", {}) == []  # nothing saved
    assert error["code"] == -32602
    assert error["message"].startswith("Generated task tree is invalid")
    assert phrase in error["message"] and phrase in error["data"], error
    assert len(fake_llm.requests) == 2  # one repair round was tried


async def test_malformed_json_twice_is_rejected(app_factory, fake_llm):
    fake_llm.script("[[broken]]", ['Sure! [{"id": "root", "name": oops'])
    async with app_factory(env=llm_env(fake_llm)) as c:
        error = await c.error("tasks.generate", {"requirement": "[[broken]]"})
    assert error["code"] == -32602 and "not a JSON array of tasks" in error["message"]


async def test_repair_round_fixes_the_tree(app_factory, fake_llm):
    fake_llm.script("[[fixme]]", [tree(*BAD["two roots"][0]), tree(*GOOD)])
    async with app_factory(env=llm_env(fake_llm)) as c:
        out = await c.result("tasks.generate", {"requirement": "[[fixme]]", "save": True})
        assert out["count"] == 3 and "repair" in out["message"]
        assert (await c.result("tasks.get", {"task_id": out["root_task_id"]}))["status"] == "pending"
    assert out["token_usage"]["total_tokens"] == 30
    first, second = fake_llm.requests
    assert second["messages"][:2] == first["messages"]
    assert second["messages"][2]["role"] == "assistant"
    assert "multiple root tasks" in second["messages"][3]["content"]


async def test_builtin_malformed_then_repaired_marker(app_factory, fake_llm):
    async with app_factory(env=llm_env(fake_llm)) as c:
        out = await c.result("tasks.generate", {"requirement": "[[tree:malformed]]"})
    assert out["count"] == 3 and {t_["name"] for t_ in out["tasks"]} == {"aggregate_results_executor", "llm_executor"}


# -- parameter errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{}, {"requirement": ""}, {"requirement": "   "}, {"requirement": None}])
async def test_missing_requirement(app_factory, fake_llm, params):
    async with app_factory(env=llm_env(fake_llm)) as c:
        error = await c.error("tasks.generate", params)
    assert error["code"] == -32602 and "mandatory for tasks.generate" in error["message"]
    assert fake_llm.requests == []


@pytest.mark.parametrize("params, phrase", [
    ({"temperature": 2.5}, "temperature must be a number between 0.0 and 2.0"),
    ({"temperature": -0.1}, "temperature must be a number between 0.0 and 2.0"),
    ({"temperature": "hot"}, "temperature must be a number between 0.0 and 2.0"),
    ({"max_tokens": 0}, "max_tokens must be an integer"),
    ({"max_tokens": 1.5}, "max_tokens must be an integer"),
    ({"save": "yes"}, "save must be true or false"),
    ({"requirement": 42}, "requirement must be a string"),
    ({"llm_provider": "nosuchvendor"}, "unknown LLM provider 'nosuchvendor'"),
])
async def test_bad_parameters(app_factory, fake_llm, params, phrase):
    async with app_factory(env=llm_env(fake_llm)) as c:
        error = await c.error("tasks.generate", {"requirement": "[[good]]", **params})
    assert error["code"] == -32602 and phrase in error["message"], error
    assert fake_llm.requests == []


async def test_temperature_bounds_are_inclusive(app_factory, fake_llm):
    fake_llm.script("[[good]]", [tree(*GOOD)])
    async with app_factory(env=llm_env(fake_llm)) as c:
        for value in (0.0, 2.0):
            await c.result("tasks.generate", {"requirement": "[[good]]", "temperature": value})


# -- keys ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("env, params, variable", [
    ({}, {}, "OPENAI_API_KEY"),
    ({}, {"llm_provider": "anthropic"}, "ANTHROPIC_API_KEY"),
    ({"SERVICE_LLM_PROVIDER": "gemini"}, {}, "GEMINI_API_KEY"),
])
async def test_missing_key_names_the_variable(app_factory, env, params, variable):
    # No SERVICE_LLM_BASE_URL and no key anywhere: the client refuses before any network call.
    async with app_factory(env=env) as c:
        error = await c.error("tasks.generate", {"requirement": "plan a trip", **params})
    assert error["code"] == -32602 and variable in error["message"] and "X-LLM-API-KEY" in error["message"]


@pytest.mark.parametrize("status, phrase", [(500, "LLM generation failed"), (401, "rejected the API key")])
async def test_provider_failure_is_clear_and_never_shows_the_key(app_factory, fake_llm, status, phrase):
    async with app_factory(env=llm_env(fake_llm)) as c:
        answer = await c.call("tasks.generate", {"requirement": f"[[error:{status}]]"},
                              headers={"X-LLM-API-KEY": HEADER_KEY})
    error = answer["error"]
    assert error["code"] == -32602 and error["message"].startswith("LLM generation failed")
    assert phrase in error["message"], error
    assert HEADER_KEY not in json.dumps(answer)
    assert fake_llm.requests[-1]["authorization"] == f"Bearer {HEADER_KEY}"


async def test_header_key_is_used_and_not_echoed(app_factory, fake_llm):
    fake_llm.script("[[good]]", [tree(*GOOD)])
    async with app_factory(env=llm_env(fake_llm, OPENAI_API_KEY=ENV_KEY)) as c:
        answer = await c.call("tasks.generate", {"requirement": "[[good]]"}, headers={"X-LLM-API-KEY": HEADER_KEY})
        assert "result" in answer and HEADER_KEY not in json.dumps(answer)
        assert fake_llm.requests[-1]["authorization"] == f"Bearer {HEADER_KEY}"  # header > env
        await c.result("tasks.generate", {"requirement": "[[good]]"})
        assert fake_llm.requests[-1]["authorization"] == f"Bearer {ENV_KEY}"  # env without a header
        # `<provider>:<key>` is used for that provider...
        await c.result("tasks.generate", {"requirement": "[[good]]"}, headers={"X-LLM-API-KEY": f"openai:{HEADER_KEY}"})
        assert fake_llm.requests[-1]["authorization"] == f"Bearer {HEADER_KEY}"
        # ...and never sent to another one.
        await c.result("tasks.generate", {"requirement": "[[good]]", "llm_provider": "openai"},
                       headers={"X-LLM-API-KEY": "anthropic:sk-ant-other-0123456789"})
        assert fake_llm.requests[-1]["authorization"] == f"Bearer {ENV_KEY}"


async def test_stored_key_sits_between_header_and_env(app_factory, fake_llm):
    fake_llm.script("[[good]]", [tree(*GOOD)])
    asked: list[tuple[str | None, str]] = []

    async def lookup(user_id: str | None, provider: str) -> str | None:
        asked.append((user_id, provider))
        return "sk-stored-0123456789" if user_id == "alice" else None

    async with app_factory(env=llm_env(fake_llm, OPENAI_API_KEY=ENV_KEY)) as c:
        c.services.engine.services["llm_key_lookup"] = lookup
        await c.result("tasks.generate", {"requirement": "[[good]]", "user_id": "alice"})
        assert fake_llm.requests[-1]["authorization"] == "Bearer sk-stored-0123456789"
        assert asked[0] == ("alice", "openai")
        await c.result("tasks.generate", {"requirement": "[[good]]", "user_id": "alice"},
                       headers={"X-LLM-API-KEY": HEADER_KEY})
        assert fake_llm.requests[-1]["authorization"] == f"Bearer {HEADER_KEY}"
        await c.result("tasks.generate", {"requirement": "[[good]]", "user_id": "bob"})
        assert fake_llm.requests[-1]["authorization"] == f"Bearer {ENV_KEY}"


@pytest.mark.parametrize("value", ["", "openai:", "anthropic:   "])
async def test_malformed_key_header_is_invalid_params(app_factory, fake_llm, value):
    async with app_factory(env=llm_env(fake_llm)) as c:
        answer = await c.call("tasks.generate", {"requirement": "[[good]]"}, headers={"X-LLM-API-KEY": value})
        assert answer["error"]["code"] == -32602 and "X-LLM-API-KEY" in answer["error"]["message"]
        # The same for any method (the header is read before dispatch), as a normal JSON-RPC error.
        other = await c.call("tasks.list", {}, headers={"X-LLM-API-KEY": value})
        assert other["error"]["code"] == -32602
    assert fake_llm.requests == []


# -- permission ----------------------------------------------------------------------------------


def token(user: str, roles: list[str] | None = None) -> dict[str, str]:
    claims: dict[str, Any] = {"user_id": user}
    if roles:
        claims["roles"] = roles
    return {"Authorization": "Bearer " + jwt.encode(claims, SECRET, algorithm="HS256")}


async def test_permission_for_another_user(app_factory, fake_llm):
    fake_llm.script("[[good]]", [tree(*GOOD)])
    async with app_factory(env=llm_env(fake_llm, SERVICE_JWT_SECRET=SECRET)) as c:
        error = await c.error("tasks.generate", {"requirement": "[[good]]", "user_id": "bob"}, headers=token("alice"))
        assert error["code"] == -32001
        assert fake_llm.requests == []  # refused before spending tokens
        mine = await c.result("tasks.generate", {"requirement": "[[good]]", "save": True}, headers=token("alice"))
        assert (await c.result("tasks.get", {"task_id": mine["root_task_id"]}, headers=token("alice")))["user_id"] == "alice"
        same = await c.result("tasks.generate", {"requirement": "[[good]]", "user_id": "alice"}, headers=token("alice"))
        assert same["count"] == 3
        admin = await c.result("tasks.generate", {"requirement": "[[good]]", "user_id": "bob", "save": True},
                               headers=token("root", ["admin"]))
        row = await c.result("tasks.get", {"task_id": admin["root_task_id"]}, headers=token("bob"))
        assert row["user_id"] == "bob"


# -- the executors through tasks.create ----------------------------------------------------------


async def test_llm_executor_result_and_token_counter(app_factory, fake_llm):
    async with app_factory(env=llm_env(fake_llm)) as c:
        root = await c.result("tasks.create", {"tasks": [
            {"id": "ask", "name": "ask", "schemas": {"method": "llm_executor"}, "inputs": {"prompt": "hello there"}},
        ]}, headers={"X-LLM-API-KEY": HEADER_KEY})
        assert root["status"] == "completed", root
        assert root["result"]["text"] == "echo: hello there"
        assert root["result"]["token_usage"]["total_tokens"] == 15
        row = await c.result("tasks.get", {"task_id": "ask"})
        assert row["token_success"] == 15 and row["token_failed"] == 0
        assert HEADER_KEY not in json.dumps(row)
    assert fake_llm.requests[-1]["authorization"] == f"Bearer {HEADER_KEY}"


async def test_failed_llm_executor_counts_token_failed(app_factory, fake_llm):
    async with app_factory(env=llm_env(fake_llm)) as c:
        root = await c.result("tasks.create", {"tasks": [
            {"id": "bad", "name": "bad", "schemas": {"method": "llm_executor"}, "inputs": {"prompt": "[[error:500]]"}},
        ]})
        assert root["status"] == "failed" and root["error"]


async def test_cancel_running_llm_executor_returns_token_usage(app_factory, fake_llm):
    async with app_factory(env=llm_env(fake_llm, SERVICE_CREATE_WAIT_TIMEOUT="0")) as c:
        await c.result("tasks.create", {"tasks": [
            {"id": "slow", "name": "slow", "schemas": {"method": "llm_executor"}, "inputs": {"prompt": "[[slow]]"}},
        ]})
        await c.wait_status("slow", ("in_progress",))
        running = c.services.engine.running
        for _ in range(300):  # until some streamed text has arrived
            entry = running.get("slow")
            client = getattr(getattr(entry, "executor", None), "_client", None)
            if client is not None and client.partial_text:
                break
            await asyncio.sleep(0.02)
        (answer,) = await c.result("tasks.cancel", {"task_ids": ["slow"]})
        assert answer["status"] == "cancelled", answer
        usage = answer["token_usage"]
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert answer["result"]["partial"] is True and answer["result"]["text"].startswith("word0")
        row = await c.result("tasks.get", {"task_id": "slow"})
        assert row["status"] == "cancelled" and row["token_failed"] == usage["total_tokens"]


async def test_generate_executor_saves_a_tree_owned_by_the_task_owner(app_factory, fake_llm):
    fake_llm.script("[[good]]", [tree(*GOOD)])
    async with app_factory(env=llm_env(fake_llm)) as c:
        root = await c.result("tasks.create", {"tasks": [
            {"id": "gen", "name": "gen", "user_id": "carol", "schemas": {"method": "generate_executor"},
             "inputs": {"requirement": "[[good]]", "save": True}},
        ]})
        assert root["status"] == "completed", root
        made = await c.result("tasks.get", {"task_id": root["result"]["root_task_id"]})
        assert made["user_id"] == "carol" and made["status"] == "pending"
        assert (await c.result("tasks.get", {"task_id": "gen"}))["token_success"] == 15


# -- start-up stays light --------------------------------------------------------------------------

STARTUP = textwrap.dedent("""
    import asyncio, sys
    from taskgrove.agent.app import build_app
    from taskgrove.agent.foundations.settings import Settings

    async def main():
        env = {"SERVICE_DATABASE_URL": sys.argv[1], "SERVICE_API_PROTOCOL": sys.argv[2]}
        app = build_app(Settings.from_env(env))
        async with app.router.lifespan_context(app):
            pass
        heavy = sorted(m for m in ("litellm", "strawberry", "openai", "jsonschema") if m in sys.modules)
        print(",".join(heavy))

    asyncio.run(main())
""")


@pytest.mark.parametrize("protocol", ["a2a", "graphql"])
def test_startup_does_not_import_litellm(tmp_path, protocol):
    done = subprocess.run([sys.executable, "-c", STARTUP, f"sqlite:///{tmp_path}/x.db", protocol],
                          capture_output=True, text=True, timeout=120, cwd=str(tmp_path.parent))
    assert done.returncode == 0, done.stderr
    heavy = set(filter(None, done.stdout.strip().splitlines()[-1].split(","))) if done.stdout.strip() else set()
    assert "litellm" not in heavy and "openai" not in heavy, done.stdout
    assert "jsonschema" not in heavy, "input schemas are compiled when a task first runs"
    if protocol == "a2a":
        assert "strawberry" not in heavy, done.stdout
