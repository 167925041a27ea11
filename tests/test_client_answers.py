"""The client's models cannot drift from the service: every method of the client is called on a real
service (the app served over HTTP and /ws), and every answer must fit its model exactly: no field
the model does not declare (pydantic keeps those in `model_extra`, which must stay empty, nested
models included), and no declared field that no answer ever carries (unless listed below with the
reason this test does not provoke it). The task model is also compared with the service's own
list of the fields a task shows (storage/models.py TASK_FIELDS).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from taskgrove.client import AsyncClient, Event, Task, TaskStatus, Tree
from taskgrove.client import answers, answers_automation
from taskgrove.storage.models import TASK_FIELDS
from tests.client_helpers import served
from tests.fakellm import FakeLLMServer

# Fields no answer of this test carries, and why; every other declared field must be seen.
NOT_PROVOKED: dict[str, set[str]] = {
    "Task": {"waiting_for"},  # a pending task held back by a concurrency key or a rate (docs/sharing.md)
    "TaskTree": {"waiting_for", "status_counts"},  # status_counts: only tasks.list with root_only
    "Wait": {"event", "match"},  # waits for an event (none here)
    "Execution": {"streaming", "webhook_url"},  # only with use_streaming / webhook_config
    "LogLine": {"level"},  # only lines logged at another level than info
    "Executors": {"allowed_ids"},  # only when SERVICE_EXTENSIONS restricts the executors
}


class Seen:
    """Every model instance read, by class: for the two directions of the check."""

    def __init__(self) -> None:
        self.fields: dict[str, set[str]] = defaultdict(set)
        self.extras: list[str] = []

    def take(self, value: Any, where: str) -> None:
        stack = [(value, where)]
        while stack:
            item, path = stack.pop()
            if isinstance(item, BaseModel):
                name = type(item).__name__.split("[")[0]
                if item.model_extra:
                    self.extras.append(f"{path} ({name}): {sorted(item.model_extra)}")
                declared = type(item).model_fields
                self.fields[name] |= {declared[f].alias or f for f in item.model_fields_set if f in declared}
                for field in item.model_fields_set & set(declared):
                    stack.append((getattr(item, field), f"{path}.{field}"))
            elif isinstance(item, (list, tuple)):
                stack.extend((v, f"{path}[{i}]") for i, v in enumerate(item))
            elif isinstance(item, dict):
                stack.extend((v, f"{path}[{k!r}]") for k, v in item.items())


def declared(cls: type[BaseModel]) -> set[str]:
    return {info.alias or name for name, info in cls.model_fields.items()}


def test_the_task_model_declares_every_field_the_service_shows() -> None:
    assert set(TASK_FIELDS) <= declared(Task), sorted(set(TASK_FIELDS) - declared(Task))
    extra = declared(answers.TaskTree) - set(TASK_FIELDS)
    # The fields a read adds to the stored ones (docs/jsonrpc.md, docs/waits.md, docs/costs.md).
    assert extra == {"waiting", "waiting_for", "tree_usage", "status_counts", "children"}, extra


def test_statuses_are_the_services() -> None:
    from taskgrove.storage.status import TaskStatus as ServiceStatus

    assert [s.value for s in TaskStatus] == [s.value for s in ServiceStatus]


async def test_every_answer_fits_its_model(make_settings: Callable[..., Any], fake_llm: FakeLLMServer) -> None:
    settings = make_settings({"SERVICE_SECRET_KEY": "client-answers-secret-key-of-some-length",
                              "SERVICE_LLM_BASE_URL": fake_llm.base_url, "SERVICE_LLM_MAX_RETRIES": "0"})
    seen = Seen()
    async with served(settings) as (url, _app), AsyncClient(url) as client:
        report = Tree("report", "aggregate_results_executor", id="ans-root")
        fetch = report.add("fetch", "noop_executor", id="ans-fetch", week=12)
        ask = report.add("ask", "human_input_executor", id="ans-ask", prompt="Publish?",
                         schema={"type": "boolean"}, after=[fetch])
        report.after(ask)
        created = await client.create(report)
        seen.take(created, "create")
        assert created.find("ans-ask").waiting is not None

        watch = client.watch("ans-root")
        events: list[Event[Any]] = []
        async with watch:
            async for event in watch:
                events.append(event)
                if event.wants_input:
                    seen.take(await event.respond(True), "respond")
        seen.take(events, "watch")
        assert events[-1].type == "final" and events[-1].data.status == TaskStatus.COMPLETED
        refused = await client.create(Tree("refused", "command_executor", id="ans-fails", command="ls"))
        failed = [event async for event in client.watch(refused)]
        seen.take(failed, "watch of a failed tree")
        assert [e.type for e in failed][-2:] == ["task_failed", "final"] and failed[-2].data.error

        for name, call in {
            "get": client.get("ans-root"),
            "get child": client.get("ans-fetch"),
            "tree": client.tree("ans-fetch"),
            "children": client.children("ans-root"),
            "list_page": client.list_page(limit=2),
            "list_page roots": client.list_page(roots=True),
            "attempts": client.attempts("ans-fetch", tree=True),
            "logs_page": client.logs_page("ans-fetch"),
            "emit": client.emit("ans-event", {"k": 1}),
            "copy": client.copy("ans-root", children=True),
            "clone": client.clone("ans-root"),
            "clone_preview": client.clone_preview("ans-root"),
            "update": client.update("ans-fetch", name="fetch it"),
            "running_status": client.running_status(["ans-root", "nope"]),
            "running_count": client.running_count(user_id="someone"),
            "usage": client.usage(),
            "purge": client.purge(older_than="30d"),
            "health": client.health(),
            "executors": client.executors(),
            "budget set": client.budgets.set("ans-user", max_tokens=100),
            "budget get": client.budgets.get(user_id="ans-user"),
            "key set": client.keys.set("sk-test", provider="openai", user_id="ans-user"),
            "key get": client.keys.get(user_id="ans-user"),
            "key delete": client.keys.delete(provider="openai", user_id="ans-user"),
        }.items():
            seen.take(await call, name)
        seen.take([task async for task in client.list(page_size=3)], "list")

        copy = await client.copy("ans-root")
        seen.take(await client.execute(copy.id), "execute")
        seen.take(await client.execute("ans-root", copy=True), "execute copy")
        pending = await client.copy("ans-root")
        seen.take(await client.cancel(pending.id, "nope", "ans-fetch"), "cancel")
        other = await client.copy("ans-root")
        seen.take(await client.delete(other.id), "delete")

        schedule = await client.schedules.create("ans-root", interval_seconds=3600)
        seen.take(schedule, "schedules.create")
        seen.take(await client.schedules.get(schedule.id), "schedules.get")
        seen.take(await client.schedules.list(), "schedules.list")
        seen.take(await client.schedules.update(schedule.id, enabled=False), "schedules.update")
        seen.take(await client.schedules.trigger(schedule.id), "schedules.trigger")
        seen.take(await client.schedules.runs(schedule.id), "schedules.runs")
        seen.take(await client.schedules.delete(schedule.id), "schedules.delete")

        seen.take(await client.generate("[[tree:valid]] plan some work"), "generate")
        saved = await client.generate("[[tree:valid]] plan and keep it", save=True)
        seen.take(saved, "generate save")
        assert saved.root_task_id and (await client.get(saved.root_task_id)).status == TaskStatus.PENDING

        agent = await client.agents.add(url, name="ans-self", tags=["ans"], concurrency=2)  # the service's own card
        seen.take(agent, "agents.add")
        assert agent.skills and agent.interfaces and agent.health is not None and not agent.has_credentials
        seen.take(await client.agents.get("ans-self"), "agents.get")
        seen.take(await client.agents.list_page(limit=1), "agents.list_page")
        seen.take([a async for a in client.agents.list(tag="ans", page_size=1)], "agents.list")
        seen.take(await client.agents.refresh("ans-self", accept=True), "agents.refresh")
        seen.take(await client.agents.remove("ans-self"), "agents.remove")

        await client.create(Tree("trigger template", "noop_executor", id="ans-trig"))
        trigger = await client.triggers.create("ans-trig", "ans.ticket", match={"queue": "support"}, key="ticket",
                                               singleton="queue", cancel_on="ans.closed", trigger_id="ans-on-ticket")
        seen.take(trigger, "triggers.create")
        seen.take(await client.emit("ans.ticket", {"queue": "support", "ticket": "T-1"}), "emit to a trigger")
        runs = []
        for _ in range(100):  # the trigger loop starts the run soon after the emit
            runs = await client.triggers.runs(trigger.id)
            if runs:
                break
            await asyncio.sleep(0.1)
        assert runs, "the trigger started no run"
        seen.take(runs, "triggers.runs")
        seen.take(await client.triggers.get(trigger.id), "triggers.get")
        debounced = await client.triggers.create("ans-trig", "ans.message",
                                                 debounce={"seconds": 5, "max_wait_seconds": 30})
        seen.take(debounced, "triggers.create debounce")
        seen.take(await client.triggers.update(debounced.id, debounce=None, batch={"size": 10}), "triggers.update")
        seen.take(await client.triggers.list_page(task_id="ans-trig"), "triggers.list_page")
        seen.take([t async for t in client.triggers.list(page_size=1)], "triggers.list")
        seen.take(await client.triggers.delete(debounced.id), "triggers.delete")

    assert not seen.extras, "fields the models do not declare:\n" + "\n".join(seen.extras)
    never = {}
    for name in seen.fields:
        cls = getattr(answers, name, None) or getattr(answers_automation, name)
        missing = declared(cls) - seen.fields[name] - NOT_PROVOKED.get(name, set())
        if missing:
            never[name] = sorted(missing)
    assert not never, f"declared fields no answer carried (drifted, or add them to NOT_PROVOKED): {never}"
