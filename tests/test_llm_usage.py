"""Costs of LLM work (docs/costs.md): usage per task, per tree, per user and day, and in /metrics,
through the real app against the fake LLM (tests/fakellm.py reports 10 prompt and 5 completion
tokens per call unless a test scripts other numbers)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from taskgrove.llm import usage as llm_usage

PRICED = "gpt-4o-mini"  # in litellm's bundled price table
UNPRICED = "fake-model-without-price"


def llm_env(fake: Any, **extra: str) -> dict[str, str]:
    return {"SERVICE_LLM_BASE_URL": fake.base_url, "SERVICE_LLM_MAX_RETRIES": "0", **extra}


def price_of(model: str, prompt: int, completion: int) -> float:
    """The price litellm's own table gives (read from the table, not through our code)."""
    import litellm

    entry = litellm.model_cost[model]
    return prompt * entry["input_cost_per_token"] + completion * entry["output_cost_per_token"]


def llm_task(id_: str, parent: str | None, model: str, prompt: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"id": id_, "name": id_, "parent_id": parent, "schemas": {"method": "llm_executor"},
            "inputs": {"prompt": prompt, "model": model, "stream": False}, **extra}


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one series of /metrics (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if match and ",".join(sorted(match.group(1).split(","))) == wanted:
            return float(match.group(2))
    return 0.0


async def test_usage_per_task_tree_user_and_metrics_add_up(app_factory, fake_llm):
    fake_llm.script("[[big]]", [{"content": "long answer", "usage": {"prompt_tokens": 100, "completion_tokens": 40,
                                                                      "total_tokens": 140}}])
    tasks = [llm_task("root", None, PRICED), llm_task("a", "root", PRICED, "[[big]] more"),
             llm_task("b", "root", PRICED)]
    async with app_factory(env=llm_env(fake_llm)) as c:
        await c.result("tasks.create", tasks)
        root = await c.result("tasks.get", {"task_id": "root"})
        a = await c.result("tasks.get", {"task_id": "a"})
        assert root["status"] == a["status"] == "completed"
        one = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "calls": 1}
        assert {k: root["usage"][k] for k in one} == one
        assert root["usage"]["cost_usd"] == pytest.approx(price_of(PRICED, 10, 5))
        assert a["usage"]["total_tokens"] == 140 and a["usage"]["cost_usd"] == pytest.approx(price_of(PRICED, 100, 40))
        assert "tree_usage" not in a  # only a root answers for its tree
        expected_cost = 2 * price_of(PRICED, 10, 5) + price_of(PRICED, 100, 40)
        tree_usage = root["tree_usage"]
        assert (tree_usage["prompt_tokens"], tree_usage["completion_tokens"], tree_usage["total_tokens"],
                tree_usage["calls"]) == (120, 50, 170, 3)
        assert tree_usage["cost_usd"] == pytest.approx(expected_cost)
        nested = await c.result("tasks.tree", {"task_id": "root"})
        assert nested["tree_usage"] == tree_usage
        # The SPEC.md counters keep their meaning.
        assert (root["token_success"], a["token_success"], a["token_failed"]) == (15, 140, 0)

        mine = await c.result("usage.get", {})
        assert mine["today"]["total_tokens"] == 170 and mine["today"]["calls"] == 3
        assert mine["today"]["cost_usd"] == pytest.approx(expected_cost)
        assert [d["total_tokens"] for d in mine["days"]] == [170]

        text = (await c.http.get("/metrics")).text
        labels = {"provider": "openai", "model": PRICED}
        assert metric(text, "taskgrove_llm_tokens_total", kind="prompt", **labels) == 120
        assert metric(text, "taskgrove_llm_tokens_total", kind="completion", **labels) == 50
        assert metric(text, "taskgrove_llm_calls_total", priced="yes", **labels) == 3
        assert metric(text, "taskgrove_llm_cost_usd_total", **labels) == pytest.approx(expected_cost)
    assert len(fake_llm.requests) == 3


async def test_a_model_without_a_price_counts_tokens_and_says_the_cost_is_unknown(app_factory, fake_llm):
    async with app_factory(env=llm_env(fake_llm)) as c:
        await c.result("tasks.create", [llm_task("root", None, PRICED), llm_task("x", "root", UNPRICED)])
        x = await c.result("tasks.get", {"task_id": "x"})
        assert x["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost_usd": None,
                              "calls": 1}
        root = await c.result("tasks.get", {"task_id": "root"})
        assert root["tree_usage"]["total_tokens"] == 30 and root["tree_usage"]["cost_usd"] is None
        today = (await c.result("usage.get", {}))["today"]
        assert (today["total_tokens"], today["cost_usd"]) == (30, None)
        text = (await c.http.get("/metrics")).text
        assert metric(text, "taskgrove_llm_calls_total", provider="openai", model=UNPRICED, priced="no") == 1


async def test_a_tree_without_llm_work_has_no_usage(client):
    await client.result("tasks.create", [{"id": "r", "name": "r"}, {"id": "n", "name": "n", "parent_id": "r"}])
    root = await client.result("tasks.get", {"task_id": "r"})
    assert root["usage"] is None
    assert root["tree_usage"] == llm_usage.empty()


async def test_the_planners_calls_count_for_the_user(app_factory, fake_llm):
    tree = [{"id": "r", "name": "noop_executor", "parent_id": None, "inputs": {}, "dependencies": []}]
    fake_llm.script("[[plan]]", ["```json\n" + json.dumps(tree) + "\n```"])
    async with app_factory(env=llm_env(fake_llm, OPENAI_MODEL=PRICED)) as c:
        out = await c.result("tasks.generate", {"requirement": "[[plan]] do nothing"})
        assert out["usage"]["total_tokens"] == 15 and out["usage"]["calls"] == 1
        assert out["usage"]["cost_usd"] == pytest.approx(price_of(PRICED, 10, 5))
        today = (await c.result("usage.get", {"days": 1}))["today"]
        assert (today["total_tokens"], today["calls"]) == (15, 1)


@pytest.mark.parametrize("params, field", [({"days": 0}, "days"), ({"days": "7"}, "days"),
                                           ({"user_id": 3}, "user_id")])
async def test_usage_get_names_a_bad_param(client, params, field):
    error = await client.error("usage.get", params)
    assert error["code"] == -32602 and field in json.dumps(error)


def test_sums_keep_an_unknown_cost_unknown():
    known = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3, "cost_usd": 0.5, "calls": 1}
    unknown = dict(known, cost_usd=None)
    assert llm_usage.add(known, known)["cost_usd"] == 1.0
    assert llm_usage.add(known, unknown)["cost_usd"] is None
    assert llm_usage.add(unknown, llm_usage.empty())["cost_usd"] is None
    # What the priced calls cost is kept beside the unknown sum: dollar budgets are held to it.
    assert llm_usage.priced_cost(llm_usage.add(llm_usage.add(known, unknown), known)) == 1.0
    assert llm_usage.add(llm_usage.empty(), llm_usage.empty()) == llm_usage.empty()


async def test_the_a2a_task_results_artifact_carries_the_tree_usage(app_factory, fake_llm):
    from tests.test_a2a_artifacts import sse
    from tests.test_a2a_wire import send_body

    tasks = [llm_task("root", None, PRICED), llm_task("a", "root", PRICED)]
    async with app_factory(env=llm_env(fake_llm)) as c:
        response = await c.http.post("/", json=send_body(tasks, method="message/stream"))
    events = [e["result"] for e in sse(response.text)]
    (artifact,) = [e for e in events if e["kind"] == "artifact-update"]
    usage = artifact["artifact"]["parts"][0]["data"]["tree_usage"]
    assert (usage["total_tokens"], usage["calls"]) == (30, 2)
    assert usage["cost_usd"] == pytest.approx(2 * price_of(PRICED, 10, 5))


async def test_taskgrove_usage_show_for_people_and_scripts(tmp_path, fake_llm):
    import subprocess
    import sys
    from pathlib import Path

    from tests.processes import Service

    env = {"SERVICE_DATABASE_URL": f"sqlite:///{tmp_path / 'tg.db'}", "SERVICE_LLM_BASE_URL": fake_llm.base_url,
           "SERVICE_LLM_MAX_RETRIES": "0", "SERVICE_USER_DAILY_BUDGET_TOKENS": "1000"}
    service = Service(tmp_path, env).start()
    try:
        task = llm_task("r", None, PRICED, user_id="alice")
        task["inputs"]["max_tokens"] = 100  # within the day's 1000 tokens
        await service.rpc("tasks.create", [task])
        task_status = (await service.wait_status("r", ("completed", "failed")))
        command = [str(Path(sys.executable).parent / "taskgrove"), "usage", "show", "--user", "alice",
                   "--url", service.url]
        scripted = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=60)
        shown = subprocess.run(command, capture_output=True, text=True, timeout=60, env={"COLUMNS": "200"})
    finally:
        service.stop()
    assert task_status["status"] == "completed", task_status["error"]
    assert scripted.returncode == 0, scripted.stderr
    answer = json.loads(scripted.stdout)
    assert (answer["today"]["total_tokens"], answer["today"]["calls"]) == (15, 1)
    assert answer["budget"]["remaining"]["tokens"] == 985
    assert shown.returncode == 0, shown.stderr
    assert "LLM usage of alice" in shown.stdout and "985 tokens" in shown.stdout
    assert "15" in shown.stdout


def model_labels(text: str, name: str) -> dict[str, float]:
    """The `model` label of each series of `name` in /metrics, with its value (summed over the
    other labels)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(rf'{name}\{{.*model="([^"]*)".*\}} (\S+)$', line)
        if match:
            found[match.group(1)] = found.get(match.group(1), 0.0) + float(match.group(2))
    return found


async def test_metrics_name_at_most_max_llm_models_and_count_the_rest_as_other(app_factory, fake_llm):
    """Every model name a caller picks would be a new series: /metrics names the first
    MAX_LLM_MODELS and adds the later ones' calls and tokens to `other` (docs/costs.md)."""
    from taskgrove.agent.foundations.metrics import MAX_LLM_MODELS

    extra = 3
    models = [f"capped-model-{n:02d}" for n in range(MAX_LLM_MODELS + extra)]
    tasks = [llm_task("root", None, models[0])] + [llm_task(f"t{n}", "root", m) for n, m in enumerate(models[1:])]
    async with app_factory(env=llm_env(fake_llm)) as c:
        await c.result("tasks.create", tasks)
        root = await c.result("tasks.get", {"task_id": "root"})
        assert root["status"] == "completed" and root["tree_usage"]["calls"] == len(models), root
        text = (await c.http.get("/metrics")).text
    assert sorted(r["model"] for r in fake_llm.requests) == models  # each model called once, by name
    calls = model_labels(text, "taskgrove_llm_calls_total")
    named = set(calls) - {"other"}
    assert len(named) == MAX_LLM_MODELS and named <= set(models)
    assert calls["other"] == extra and sum(calls.values()) == len(models)
    tokens = model_labels(text, "taskgrove_llm_tokens_total")
    assert set(tokens) == named | {"other"}
    assert tokens["other"] == extra * 15  # 10 prompt + 5 completion tokens a call
