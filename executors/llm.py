"""LLM executors: `llm_executor`, `generate_executor` and the agent-crew `crew_executor`.

All three call models through `llm.client.LLMClient`, so they share key resolution
(X-LLM-API-KEY header via `context.llm_api_key` > the user's stored key via
`context.services["llm_key_lookup"]` > <VENDOR>_API_KEY) and usage accounting. Each keeps its
running token total in `self.token_usage` (the engine turns it into token_success/token_failed)
and its `cancel()` returns the usage so far plus any partial result.

Importing this module must not import litellm (the client imports it on first use).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from taskgrove.executors.base import ExecutionContext, Executor, ExecutorError
from taskgrove.llm.client import LLMClient, LLMError, estimate_tokens, normalize_provider
from taskgrove.llm.generate import GenerationError, generate_tree

_MESSAGE_SCHEMA = {
    "type": "object",
    "properties": {"role": {"type": "string", "enum": ["system", "user", "assistant"]}, "content": {}},
    "required": ["role", "content"],
}
_COMMON = {
    "model": {"type": "string", "description": "Model name; default <VENDOR>_MODEL or the vendor default"},
    "provider": {"type": "string", "description": "openai, anthropic, gemini (google), mistral, groq, ..."},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2, "default": 0.7},
    "max_tokens": {"type": "integer", "minimum": 1, "default": 4000},
}


def make_client(context: ExecutionContext) -> LLMClient:
    """A client for this run; the stored-key lookup and the meter (budgets, the stored usage:
    agent/services/budget_service.py) come from the app's services when present."""
    meter_for = context.services.get("llm_meter")
    meter = None if meter_for is None else meter_for(context.user_id, context.task, context.wait_for_input,
                                                     context.lease_epoch)
    return LLMClient(context.settings, key_lookup=context.services.get("llm_key_lookup"), meter=meter,
                     breakers=context.services.get("llm_breakers"), traceparent=context.traceparent)


def call_args(options: Mapping[str, Any], context: ExecutionContext) -> tuple[str | None, str | None]:
    """(provider, header key) for a call.

    The header key is used unless it was given for a different provider than the one the task
    asks for (a `<provider>:<key>` header must not send one vendor's key to another).
    """
    wanted = options.get("provider") or options.get("llm_provider")
    header_provider = normalize_provider(context.llm_provider) if context.llm_provider else None
    if not context.llm_api_key:
        return wanted, None
    if wanted and header_provider and normalize_provider(wanted) != header_provider:
        return wanted, None
    return wanted or header_provider, context.llm_api_key


def _number(options: Mapping[str, Any], key: str, default: Any, low: float, high: float, integer: bool) -> Any:
    value = options.get(key, default)
    kind_ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not kind_ok or not low <= value <= high:
        raise ExecutorError(f"{key} must be {'an integer' if integer else 'a number'} between {low:g} and {high:g}, "
                            f"got {value!r}")
    return value


class _LLMBase(Executor):
    """Shared plumbing: options (inputs over params), the client, usage and cancel.

    Each executor has its own extension (llm, generate, crew) so SERVICE_EXTENSIONS can enable them apart.
    """

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        super().__init__(params)
        self._client: LLMClient | None = None

    def options(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.params, **{k: v for k, v in inputs.items() if v is not None}}

    def _sync_usage(self) -> dict[str, int] | None:
        if self._client is not None:
            self.token_usage = self._client.usage_so_far()
            self.llm_usage = self._client.unstored_spend  # the engine adds it to the task's `usage`
        return self.token_usage

    def partial_result(self) -> Any:
        return None

    async def cancel(self) -> dict[str, Any] | None:
        usage = self._sync_usage()
        if usage is None:
            return None
        return {"token_usage": usage, "result": self.partial_result()}


class LLMExecutor(_LLMBase):
    """One chat completion. Streams by default so progress and a partial text exist on cancel."""

    id = "llm_executor"
    extension = "llm"
    name = "LLM completion"
    description = ("Sends a prompt or a list of chat messages to an LLM and returns its text and token usage. "
                   "Results of the tasks it depends on are added to the prompt.")
    input_schema = {
        "type": "object",
        "properties": {
            "prompt": {"type": "string"},
            "messages": {"type": "array", "items": _MESSAGE_SCHEMA, "minItems": 1},
            "system": {"type": "string"},
            **_COMMON,
            "stream": {"type": "boolean", "default": True},
            "include_dependency_results": {"type": "boolean", "default": True},
        },
        "anyOf": [{"required": ["prompt"]}, {"required": ["messages"]}],
    }

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        opts = self.options(inputs)
        messages = self.build_messages(opts, context)
        temperature = _number(opts, "temperature", 0.7, 0, 2, integer=False)
        max_tokens = _number(opts, "max_tokens", 4000, 1, 1_000_000, integer=True)
        provider, key = call_args(opts, context)
        client = self._client = make_client(context)
        last_report = 0.0

        async def on_chunk(_: str) -> None:
            nonlocal last_report
            now = time.monotonic()
            if now - last_report >= 0.5:  # progress is an estimate; no need to publish every token
                last_report = now
                done = estimate_tokens(client.partial_text) / max_tokens
                await context.report_progress(min(0.95, done), "generating")

        try:
            completion = await client.complete(
                messages, provider=provider, model=opts.get("model"), api_key=key, user_id=context.user_id,
                temperature=temperature, max_tokens=max_tokens, stream=bool(opts.get("stream", True)),
                on_chunk=on_chunk,
            )
        except LLMError as exc:
            raise ExecutorError(str(exc), retryable=exc.retryable) from None
        finally:
            self._sync_usage()
        return {"text": completion.text, "model": completion.model, "provider": completion.provider,
                "token_usage": completion.usage}

    @staticmethod
    def build_messages(opts: Mapping[str, Any], context: ExecutionContext) -> list[dict[str, Any]]:
        raw = opts.get("messages")
        prompt = opts.get("prompt")
        if raw is None and not prompt:
            raise ExecutorError("llm_executor needs inputs.prompt (string) or inputs.messages (list)")
        messages: list[dict[str, Any]] = []
        if opts.get("system"):
            messages.append({"role": "system", "content": str(opts["system"])})
        if raw is not None:
            if not isinstance(raw, list) or not all(isinstance(m, Mapping) and "role" in m and "content" in m for m in raw):
                raise ExecutorError("inputs.messages must be a list of {role, content} objects")
            messages.extend(dict(m) for m in raw)
        if context.dependency_results and opts.get("include_dependency_results", True):
            results = json.dumps(context.dependency_results, default=str, ensure_ascii=False)
            messages.append({"role": "user", "content": f"Results of the tasks this task depends on (JSON):\n{results}"})
        if prompt:
            messages.append({"role": "user", "content": str(prompt)})
        return messages

    def partial_result(self) -> Any:
        text = self._client.partial_text if self._client is not None else ""
        return {"text": text, "partial": True} if text else None


class GenerateExecutor(_LLMBase):
    """tasks.generate as a task: builds (and with `save`, creates) a task tree from a requirement."""

    id = "generate_executor"
    extension = "generate"
    name = "Generate task tree"
    description = ("Turns a natural-language requirement into a validated task tree using the available "
                   "executors; with save=true the tree is created and root_task_id returned.")
    input_schema = {
        "type": "object",
        "properties": {
            "requirement": {"type": "string", "minLength": 1},
            "llm_provider": {"type": "string"},
            **_COMMON,
            "save": {"type": "boolean", "default": False},
        },
        "required": ["requirement"],
    }

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        opts = self.options(inputs)
        provider, key = call_args(opts, context)
        client = self._client = make_client(context)
        try:
            result = await generate_tree(
                opts.get("requirement"), client=client, executors=self._executors(context),
                provider=provider, model=opts.get("model"), temperature=opts.get("temperature", 0.7),
                max_tokens=opts.get("max_tokens", 4000), api_key=key, user_id=context.user_id,
            )
        except (GenerationError, LLMError) as exc:
            raise ExecutorError(str(exc), retryable=getattr(exc, "retryable", True)) from None
        finally:
            self._sync_usage()
        out: dict[str, Any] = {"tasks": result.tasks, "count": len(result.tasks)}
        if opts.get("save"):
            service = context.services.get("tasks")
            if service is None:
                raise ExecutorError("save=true needs the tasks service, which is not available here")
            # Plain data in (tasks, owner): the service applies tasks.create's rules as that user.
            created = await service.create_tree_for(result.tasks, context.user_id)
            out["root_task_id"] = _root_id(created, result.tasks)
        return out

    def _executors(self, context: ExecutionContext) -> list[Any]:
        """The app's registry when given (services["registry"]), else discovery; never itself,
        so a generated tree cannot keep generating trees."""
        registry = context.services.get("registry")
        if registry is None:
            from taskgrove.executors.registry import ExecutorRegistry

            registry = ExecutorRegistry.discover(getattr(context.settings, "extensions", None))
        return [cls for cls in registry.all() if cls.id != self.id]


def _root_id(created: Any, tasks: list[dict[str, Any]]) -> str | None:
    if isinstance(created, str):
        return created
    if isinstance(created, Mapping):
        return created.get("root_task_id") or created.get("id")
    if isinstance(created, list) and created:
        first = created[0]
        return first.get("id") if isinstance(first, Mapping) else getattr(first, "id", None)
    return tasks[0]["id"] if tasks else None


class CrewExecutor(_LLMBase):
    """A crew of role-playing agents working through steps in order, each output feeding the next."""

    id = "crew_executor"
    extension = "crew"
    name = "Agent crew"
    description = ("Runs a list of steps in order, each by one agent (role, goal, instructions); every step "
                   "sees the outputs of the steps before it. Returns each step's output and the final output.")
    input_schema = {
        "type": "object",
        "properties": {
            "agents": {"type": "array", "minItems": 1, "items": {
                "type": "object",
                "properties": {"role": {"type": "string", "minLength": 1}, "goal": {"type": "string"},
                               "instructions": {"type": "string"}, "model": {"type": "string"},
                               "provider": {"type": "string"}, "temperature": {"type": "number"}},
                "required": ["role"],
            }},
            "steps": {"type": "array", "minItems": 1, "items": {
                "type": "object",
                "properties": {"description": {"type": "string", "minLength": 1}, "agent": {"type": "string"},
                               "expected_output": {"type": "string"}},
                "required": ["description"],
            }},
            **_COMMON,
        },
        "required": ["agents", "steps"],
    }

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        super().__init__(params)
        self._done: list[dict[str, Any]] = []

    async def execute(self, inputs: dict[str, Any], context: ExecutionContext) -> Any:
        opts = self.options(inputs)
        agents, steps = self._check(opts)
        temperature = _number(opts, "temperature", 0.7, 0, 2, integer=False)
        max_tokens = _number(opts, "max_tokens", 4000, 1, 1_000_000, integer=True)
        client = self._client = make_client(context)
        total = len(steps)
        try:
            for n, (step, agent) in enumerate(steps):
                await context.report_progress(n / total, f"step {n + 1}/{total}: {agent['role']}")
                provider, key = call_args({**opts, **{k: agent[k] for k in ("provider",) if agent.get(k)}}, context)
                completion = await client.complete(
                    self.step_messages(agent, step, n, total, context), provider=provider,
                    model=agent.get("model") or opts.get("model"), api_key=key, user_id=context.user_id,
                    temperature=_number(agent, "temperature", temperature, 0, 2, integer=False),
                    max_tokens=max_tokens,
                )
                self._done.append({"agent": agent["role"], "description": step["description"],
                                   "output": completion.text})
                self._sync_usage()
        except LLMError as exc:
            raise ExecutorError(f"step {len(self._done) + 1} failed: {exc}", retryable=exc.retryable) from None
        finally:
            self._sync_usage()
        await context.report_progress(1.0, f"{total} steps done")
        return {"steps": list(self._done), "final_output": self._done[-1]["output"],
                "token_usage": dict(self.token_usage or {})}

    @staticmethod
    def _check(opts: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], list[tuple[dict[str, Any], dict[str, Any]]]]:
        agents = opts.get("agents")
        steps = opts.get("steps")
        if not isinstance(agents, list) or not agents or not all(isinstance(a, Mapping) and a.get("role") for a in agents):
            raise ExecutorError("crew_executor needs inputs.agents: a non-empty list of {role, goal, instructions}")
        if not isinstance(steps, list) or not steps or not all(isinstance(s, Mapping) and s.get("description") for s in steps):
            raise ExecutorError("crew_executor needs inputs.steps: a non-empty list of {description, agent}")
        by_role: dict[str, dict[str, Any]] = {}
        for a in agents:
            if a["role"] in by_role:
                raise ExecutorError(f"two agents have the role {a['role']!r}; roles must be unique")
            by_role[a["role"]] = dict(a)
        folded = {role.lower(): a for role, a in by_role.items()}
        resolved = []
        for i, s in enumerate(steps):
            wanted = s.get("agent")
            agent: dict[str, Any] | None
            if wanted is None and len(by_role) == 1:
                agent = next(iter(by_role.values()))
            else:
                agent = by_role.get(wanted) or (folded.get(wanted.lower()) if isinstance(wanted, str) else None)
            if agent is None:
                raise ExecutorError(f"step {i + 1} names agent {wanted!r}, which is not one of the roles: "
                                    f"{', '.join(by_role)}")
            resolved.append((dict(s), agent))
        return by_role, resolved

    def step_messages(self, agent: Mapping[str, Any], step: Mapping[str, Any], n: int, total: int,
                      context: ExecutionContext) -> list[dict[str, str]]:
        persona = [f"You are {agent['role']}."]
        if agent.get("goal"):
            persona.append(f"Your goal: {agent['goal']}")
        if agent.get("instructions"):
            persona.append(f"Instructions: {agent['instructions']}")
        persona.append("You are one member of a crew working through a list of steps; do only your step.")
        parts = [f"Step {n + 1} of {total}: {step['description']}"]
        if step.get("expected_output"):
            parts.append(f"Expected output: {step['expected_output']}")
        if context.dependency_results:
            parts.append("Results of the tasks this crew depends on (JSON):\n"
                         + json.dumps(context.dependency_results, default=str, ensure_ascii=False))
        if self._done:
            previous = "\n\n".join(f"### Step {i + 1} ({d['agent']}): {d['description']}\n{d['output']}"
                                   for i, d in enumerate(self._done))
            parts.append("Outputs of the previous steps:\n" + previous)
        return [{"role": "system", "content": "\n".join(persona)}, {"role": "user", "content": "\n\n".join(parts)}]

    def partial_result(self) -> Any:
        if not self._done:
            return None
        return {"steps": list(self._done), "final_output": self._done[-1]["output"], "partial": True}
