"""Services: the objects one running service is made of, built once and handed to every surface.

Below the surfaces (rpc, a2a, graphql, ws) and above the services they bundle (TaskService,
ScheduleService, SystemService, GenerateService, KeyService), the engine and storage; it imports no surface.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from taskgrove.agent.services.admission import Admission
from taskgrove.agent.foundations.auth import check_settings
from taskgrove.agent.engine.bus import EventBus
from taskgrove.agent.engine.engine import Engine
from taskgrove.agent.services.generate_service import GenerateService
from taskgrove.agent.services.key_service import KeyService
from taskgrove.agent.foundations.requests_services import GenerateTree, InitExamples, UsageQuery
from taskgrove.agent.foundations.calls import Handler
from taskgrove.agent.services.idempotent import IdempotentMethods
from taskgrove.agent.services.schedule_service import schedule_methods
from taskgrove.agent.services.task_service import task_methods
from taskgrove.agent.services.execution_service import ExecutionService, execution_methods
from taskgrove.agent.foundations.calls import typed, without_params
from taskgrove.agent.services.log_service import log_methods
from taskgrove.agent.services.wait_service import wait_methods
from taskgrove.agent.engine.schedule_loop import ScheduleLoop
from taskgrove.agent.foundations.requests import PurgeTasks
from taskgrove.agent.services.retention_service import Retention
from taskgrove.agent.services.schedule_service import ScheduleService
from taskgrove.agent.services.task_service import TaskService
from taskgrove.agent.foundations.settings import Settings
from taskgrove.agent.services.system_service import SystemService
from taskgrove.agent.services.wait_service import WaitService
from taskgrove.agent.services.trigger_service import TriggerService, trigger_methods
from taskgrove.agent.engine.trigger_loop import TriggerLoop
from taskgrove.agent.foundations.trigger_metrics import TriggerMetrics
from taskgrove.agent.services.log_service import LogService
from taskgrove.agent.services.agent_wiring import AgentDirectoryParts
from taskgrove.agent.services.remote_questions import RemoteQuestionCancels
from taskgrove.executors.database import dispose_engines
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.llm.breaker import Breakers
from taskgrove.agent.foundations.metrics import Metrics
from taskgrove.agent.services.budget_service import BudgetService
from taskgrove.agent.services.usage_service import UsageService
from taskgrove.storage.db import create_batch_engine, create_engine, create_loop_engine, migrate
from taskgrove.storage.keys import KeyStore
from taskgrove.storage.repository import TaskRepository


@dataclass
class Services:
    """The objects one running service is made of, handed to every surface."""

    settings: Settings
    repo: TaskRepository
    bus: EventBus
    registry: ExecutorRegistry
    engine: Engine
    tasks: TaskService
    # Starting, following and cancelling executions; the running lists; attempts.
    executions: ExecutionService
    system: SystemService
    schedule_loop: ScheduleLoop
    schedules: ScheduleService
    # The per-user quotas every surface asks (agent/services/admission.py).
    admission: Admission
    # Answers to waits and events (tasks.respond, events.emit), for every surface.
    waits: WaitService
    # Task logs (tasks.logs, /ws subscribe_logs), for every surface.
    logs: LogService
    task_methods: dict[str, Handler] = field(default_factory=dict)
    system_methods: dict[str, Handler] = field(default_factory=dict)
    keys: KeyService | None = None
    # Awaited first on shutdown, by surfaces that own background work (the A2A handler, push sender).
    shutdown_hooks: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)
    # Idempotency-Key handling, shared by the JSON-RPC methods and A2A message/send.
    idempotency: IdempotentMethods | None = None
    # Retention: tasks.purge, and the sweeper started when SERVICE_RETENTION is set.
    retention: Retention | None = None
    # Costs of LLM work (docs/costs.md): counted per call, summed per tree and per user and day.
    usage: UsageService | None = None
    # Cancels the remote task of a task that ended while a remote agent's question waited.
    remote_questions: RemoteQuestionCancels | None = None
    # The directory of agents (agents.*, delegation by name or skill, the planner's agents).
    agents: AgentDirectoryParts | None = None
    # Event triggers (triggers.*; events.emit starts their runs): docs/triggers.md.
    triggers: TriggerService | None = None
    # Set once the schema is at the migrations' head (for /readyz).
    migrated: bool = False

    @classmethod
    def build(cls, settings: Settings, registry: ExecutorRegistry | None = None) -> "Services":
        check_settings(settings)
        url = settings.database_url
        repo = TaskRepository(create_engine(url), create_batch_engine(url), create_loop_engine(url))
        bus = EventBus()
        registry = registry or ExecutorRegistry.discover(settings.extensions)
        metrics = Metrics()
        engine = Engine(repo, registry, settings, bus, metrics=metrics)
        admission = Admission(settings, repo, metrics)
        tasks = TaskService(repo, engine, registry, settings, admission)
        executions = ExecutionService(repo, engine, bus, settings, tasks)
        system = SystemService(repo, engine, registry, tasks)
        engine.services["tasks"] = tasks
        engine.services["registry"] = registry  # generate_executor offers the app's executors
        keys = KeyService(KeyStore(repo.engine, settings.secret_key))
        engine.services["llm_key_lookup"] = keys.lookup  # stored per-user keys for the LLM client
        usage = UsageService(repo, metrics)
        budgets = BudgetService(repo, settings, usage)
        engine.services["llm_meter"] = budgets.meter  # every LLM call: budgets, stored usage, /metrics
        engine.services["llm_breakers"] = Breakers(settings.llm_breaker_failures, settings.llm_breaker_reset_seconds)
        schedule_loop = ScheduleLoop(engine)
        schedules = ScheduleService(repo, schedule_loop, settings)
        waits = WaitService(repo, engine, settings)
        logs = LogService(repo, bus)
        services = cls(settings, repo, bus, registry, engine, tasks, executions, system, schedule_loop, schedules, admission,
                       waits, logs, keys=keys, metrics=metrics, usage=usage)
        services.task_methods = {**task_methods(tasks), **execution_methods(executions), **schedule_methods(schedules), **wait_methods(waits),
                                 **log_methods(logs)}
        idempotent = services.idempotency = IdempotentMethods(repo, settings)
        for name in ("tasks.create", "tasks.execute", "execute_task_tree", "tasks.copy", "tasks.clone", "events.emit"):
            services.task_methods[name] = idempotent.wrap(name, services.task_methods[name])
        services.retention = Retention(repo, settings, metrics)
        services.remote_questions = RemoteQuestionCancels(repo, bus, settings)
        services.task_methods["tasks.purge"] = typed(PurgeTasks.from_params, services.retention.purge)
        generate = GenerateService(tasks, registry, settings, engine.services)
        services.task_methods["tasks.generate"] = typed(GenerateTree.from_params, generate.generate)
        services.task_methods["usage.get"] = typed(UsageQuery.from_params, usage.get)
        services.agents = AgentDirectoryParts.build(repo, settings, metrics, engine.services, tasks)
        services.task_methods.update(services.agents.methods())
        trigger_metrics = TriggerMetrics(metrics.registry)
        services.triggers = TriggerService(repo, TriggerLoop(engine, trigger_metrics), trigger_metrics)
        waits.on_emit.append(services.triggers.emit_hook())
        services.task_methods.update(trigger_methods(services.triggers))
        services.system_methods = {
            "system.health": without_params(system.health),
            "system.executors": without_params(system.executors),
            "examples.init": typed(InitExamples.from_params, system.examples_init),
            "examples.status": without_params(system.examples_status),
            **keys.methods(),
            **budgets.methods(),
        }
        return services

    async def start(self) -> None:
        await migrate(self.repo.engine)
        self.migrated = True
        await self.engine.start()
        if self.remote_questions is not None:
            self.remote_questions.start()
        if self.settings.enable_scheduler:
            self.schedule_loop.start()
            if self.triggers is not None:
                self.triggers.loop.start()
        if self.agents is not None:
            self.agents.refresher.start()
        if self.retention is not None:
            self.retention.start()  # only when SERVICE_RETENTION is set

    async def stop(self) -> None:
        await self.schedule_loop.stop()  # no new runs; the engine then hands back what is running
        if self.triggers is not None:
            await self.triggers.loop.stop()
        if self.agents is not None:
            await self.agents.refresher.stop()
        if self.retention is not None:
            await self.retention.stop()
        for hook in self.shutdown_hooks:
            await hook()
        if self.remote_questions is not None:
            await self.remote_questions.stop()
        await self.engine.stop()
        await dispose_engines()  # database_executor's connection pools
        await self.repo.close()
