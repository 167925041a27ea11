"""executors/llm.py: llm_executor, generate_executor, crew_executor against the fake LLM server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.base import ExecutionContext, Executor, ExecutorError
from taskgrove.executors.llm import CrewExecutor, GenerateExecutor, LLMExecutor
from taskgrove.executors.registry import ExecutorRegistry


class AggregateStub(Executor):
    id = "aggregate_results_executor"
    description = "Merges the results of its dependencies"


def make_context(fake, *, key=None, key_provider=None, services=None, deps=None, progress=None) -> ExecutionContext:
    settings = Settings(llm_base_url=fake.base_url, llm_max_retries=0, environ={})

    async def record(value: float, message: str | None) -> None:
        if progress is not None:
            progress.append((value, message))

    return ExecutionContext(task_id="t1", task={}, settings=settings, user_id="alice", llm_api_key=key,
                            llm_provider=key_provider, services=services or {}, dependency_results=deps or {},
                            _progress=record)


def test_descriptors():
    assert (LLMExecutor.id, LLMExecutor.extension) == ("llm_executor", "llm")
    assert (GenerateExecutor.id, GenerateExecutor.extension) == ("generate_executor", "generate")
    assert (CrewExecutor.id, CrewExecutor.extension) == ("crew_executor", "crew")


# -- llm_executor -------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_llm_executor_result_and_usage(fake_llm, stream):
    ex = LLMExecutor()
    out = await ex.execute({"prompt": "say hi", "system": "be brief", "model": "m1", "stream": stream},
                           make_context(fake_llm, key="sk-header"))
    assert out == {"text": "echo: say hi", "model": "m1", "provider": "openai",
                   "token_usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
    assert ex.token_usage == out["token_usage"]
    sent = fake_llm.requests[-1]
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    assert sent["authorization"] == "Bearer sk-header"


async def test_llm_executor_messages_and_dependency_results(fake_llm):
    ex = LLMExecutor()
    msgs = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"}]
    await ex.execute({"messages": msgs, "prompt": "final"}, make_context(fake_llm, deps={"dep1": {"text": "42"}}))
    sent = fake_llm.requests[-1]["messages"]
    assert sent[:2] == msgs and '"dep1"' in sent[2]["content"] and sent[-1]["content"] == "final"


async def test_llm_executor_header_key_for_other_provider_is_not_used(fake_llm):
    ex = LLMExecutor()
    await ex.execute({"prompt": "x", "provider": "openai", "stream": False},
                     make_context(fake_llm, key="sk-ant-header", key_provider="anthropic"))
    assert fake_llm.requests[-1]["authorization"] == "Bearer no-key"


async def test_llm_executor_failure_keeps_usage_and_clear_error(fake_llm):
    ex = LLMExecutor()
    with pytest.raises(ExecutorError, match="rejected the API key"):
        await ex.execute({"prompt": "[[error:401]]"}, make_context(fake_llm, key="sk-secret-abcdefgh"))
    with pytest.raises(ExecutorError, match="prompt"):
        await ex.execute({}, make_context(fake_llm))


async def test_llm_executor_reports_progress_from_chunks(fake_llm):
    fake_llm.script("[[long]]", [{"content": "a " * 30, "chunk_delay": 0.05}])
    progress: list[tuple[float, Any]] = []
    out = await LLMExecutor().execute({"prompt": "[[long]]", "max_tokens": 20}, make_context(fake_llm, progress=progress))
    assert out["text"].startswith("a a")
    assert progress and all(0 <= v <= 0.95 for v, _ in progress)


@pytest.mark.parametrize("stream", [True, False])
async def test_cancel_running_llm_executor_returns_usage(fake_llm, stream):
    ex = LLMExecutor()
    task = asyncio.create_task(ex.execute({"prompt": "[[slow]]", "stream": stream}, make_context(fake_llm)))
    for _ in range(200):  # wait until the request is in flight (and, streaming, some text arrived)
        await asyncio.sleep(0.02)
        if ex._client is not None and ex._client._call is not None and (not stream or ex._client.partial_text):
            break
    answer = await ex.cancel()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    usage = answer["token_usage"]
    assert usage["prompt_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if stream:
        assert usage["completion_tokens"] > 0
        assert answer["result"]["partial"] is True and answer["result"]["text"].startswith("word0")
    else:
        assert answer["result"] is None
    assert ex.token_usage["total_tokens"] >= usage["total_tokens"]


async def test_cancel_before_start_returns_none():
    assert await LLMExecutor().cancel() is None


# -- crew_executor ------------------------------------------------------------------------------

CREW = {
    "agents": [
        {"role": "Researcher", "goal": "find facts", "instructions": "cite sources"},
        {"role": "Writer", "goal": "write clearly", "instructions": "short sentences", "model": "writer-model"},
    ],
    "steps": [
        {"description": "collect facts about bees", "agent": "Researcher", "expected_output": "a list"},
        {"description": "write a paragraph", "agent": "writer"},
    ],
}


async def test_crew_runs_steps_in_order_and_chains_outputs(fake_llm):
    progress: list[tuple[float, Any]] = []
    ex = CrewExecutor()
    out = await ex.execute(CREW, make_context(fake_llm, progress=progress))
    first, second = fake_llm.requests
    assert "You are Researcher." in first["messages"][0]["content"] and "cite sources" in first["messages"][0]["content"]
    assert "Step 1 of 2: collect facts about bees" in first["messages"][1]["content"]
    assert "Expected output: a list" in first["messages"][1]["content"]
    # Step 1's output (the fake echoes its prompt) is part of step 2's prompt.
    assert out["steps"][0]["output"] in second["messages"][1]["content"]
    assert "You are Writer." in second["messages"][0]["content"] and second["model"] == "writer-model"
    assert [s["agent"] for s in out["steps"]] == ["Researcher", "Writer"]
    assert out["final_output"] == out["steps"][1]["output"]
    total = {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}
    assert out["token_usage"] == total and ex.token_usage == total
    assert [round(v, 2) for v, _ in progress] == [0.0, 0.5, 1.0]


async def test_crew_rejects_unknown_agent(fake_llm):
    bad = {"agents": CREW["agents"], "steps": [{"description": "x", "agent": "Editor"}]}
    with pytest.raises(ExecutorError, match="'Editor'"):
        await CrewExecutor().execute(bad, make_context(fake_llm))


async def test_crew_failure_names_step_and_keeps_usage(fake_llm):
    crew = {"agents": CREW["agents"], "steps": [CREW["steps"][0], {"description": "[[error:500]]", "agent": "Writer"}]}
    ex = CrewExecutor()
    with pytest.raises(ExecutorError, match="step 2 failed"):
        await ex.execute(crew, make_context(fake_llm))
    assert ex.token_usage["total_tokens"] == 15
    answer = await ex.cancel()
    assert answer["result"]["steps"][0]["agent"] == "Researcher"


# -- generate_executor --------------------------------------------------------------------------


class FakeTasksService:
    def __init__(self) -> None:
        self.created: list[tuple[list[dict[str, Any]], str | None]] = []

    async def create_tree_for(self, tasks: list[dict[str, Any]], user_id: str | None) -> dict[str, Any]:
        self.created.append((tasks, user_id))
        return {"root_task_id": tasks[0]["id"]}


async def test_generate_executor_returns_and_saves_tree(fake_llm):
    registry = ExecutorRegistry([LLMExecutor, AggregateStub, GenerateExecutor, CrewExecutor])
    service = FakeTasksService()
    ex = GenerateExecutor()
    ctx = make_context(fake_llm, services={"registry": registry, "tasks": service})
    out = await ex.execute({"requirement": "[[tree:valid]] two topics", "save": True}, ctx)
    assert out["count"] == 3 and out["root_task_id"] == out["tasks"][0]["id"]
    assert service.created == [(out["tasks"], "alice")]
    assert ex.token_usage == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    prompt = fake_llm.requests[0]["messages"][0]["content"]
    assert "crew_executor" in prompt and "- generate_executor" not in prompt


async def test_generate_executor_errors(fake_llm):
    ctx = make_context(fake_llm, services={"registry": ExecutorRegistry([LLMExecutor, AggregateStub])})
    with pytest.raises(ExecutorError, match="mandatory for tasks.generate"):
        await GenerateExecutor().execute({"requirement": " "}, ctx)
    ex = GenerateExecutor()
    with pytest.raises(ExecutorError, match="multiple root tasks"):
        await ex.execute({"requirement": "[[tree:invalid]]"}, ctx)
    assert ex.token_usage["total_tokens"] == 30  # both attempts counted
