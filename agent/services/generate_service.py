"""`tasks.generate`: a natural-language requirement -> a validated task tree (optionally saved).

The work (prompt, JSON extraction, the SPEC.md tree rules, one repair round) lives in
`llm.generate.generate_tree`, shared with `generate_executor`; this module is the service side
(`GenerateTree.from_params` in agent/foundations/requests_services.py reads the parameters): permission, which
LLM key to use, how failures become errors, and saving.

Decisions (docs/llm.md):

- Key precedence: the request's X-LLM-API-KEY header > the user's stored key (the
  `llm_key_lookup` service, when the key-configuration extension provides one) > <VENDOR>_API_KEY.
  A header given as `<provider>:<key>` is only used for that provider. Keys are passed to the
  LLM client for this one call and never written anywhere (not to the tasks, not to the log).
- `save: true` creates the tree through `TaskService.create_tree`, the very path `tasks.create`
  uses (same validation, same permission rule, one transaction), but does NOT execute it: the
  tasks stay `pending` and the caller starts them with `tasks.execute` on `root_task_id`.
  Generating is a proposal; running LLM-designed work should be an explicit second step.
- `generate_executor` is not offered to the model (nor accepted in a generated tree): a generated
  tree that generates trees is a loop nobody asked for.
- Every failure is -32602 (SPEC.md): bad parameters, unknown provider, missing key, a provider
  error, and a tree still invalid after the repair round (its problems listed in message and data).
  A JWT caller asking for another user's `user_id` without the admin role gets -32001.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taskgrove.agent.foundations.errors import INVALID_PARAMS, RpcError, invalid_params, permission_denied
from taskgrove.agent.foundations.requests import NewTree
from taskgrove.agent.foundations.requests_services import GenerateTree
from taskgrove.agent.foundations.calls import CallContext
from taskgrove.agent.services.task_service import TaskService
from taskgrove.agent.foundations.settings import Settings
from taskgrove.executors.base import Executor
from taskgrove.executors.registry import ExecutorRegistry
from taskgrove.llm.client import LLMClient, LLMError, LLMKeyMissingError, normalize_provider, redact
from taskgrove.llm.generate import GenerationError, GenerationValidationError, generate_tree
from taskgrove.storage import usage_store as stored_usage

# Executors never offered to the model (see the module docstring).
NOT_GENERATABLE = frozenset({"generate_executor"})


class GenerateService:
    """Implements `tasks.generate`. `services` is the engine's service map, read at call time,
    so a key store registered after start-up (`llm_key_lookup`) is still honoured."""

    def __init__(self, tasks: TaskService, registry: ExecutorRegistry, settings: Settings,
                 services: Mapping[str, Any]) -> None:
        self.tasks = tasks
        self.registry = registry
        self.settings = settings
        self.services = services

    def client(self, owner: str | None = None, traceparent: str | None = None) -> LLMClient:
        """A fresh client per call: its usage total is that call's usage; each of its calls is
        counted for `owner` and held to the owner's daily budget (agent/services/budget_service.py).
        `traceparent`: the caller's trace context, sent with the LLM call (docs/observability.md)."""
        meter_for = self.services.get("llm_meter")
        meter = None if meter_for is None else meter_for(owner, None)
        return LLMClient(self.settings, key_lookup=self.services.get("llm_key_lookup"), meter=meter,
                         breakers=self.services.get("llm_breakers"), traceparent=traceparent)

    def executors(self) -> list[type[Executor]]:
        return [cls for cls in self.registry.all() if cls.id not in NOT_GENERATABLE]

    async def generate(self, request: GenerateTree, ctx: CallContext) -> dict[str, Any]:
        user_id, provider = request.user_id, request.provider
        if provider is not None:
            try:  # an unknown provider is a parameter error: say so before anything else
                LLMClient(self.settings).resolve_provider(provider)
            except LLMError as exc:
                raise invalid_params(str(exc)) from None

        caller = ctx.caller
        if user_id is not None and not caller.can_access(user_id):
            raise permission_denied(f"You may not generate tasks for user '{user_id}'")
        owner = user_id if user_id is not None else caller.user_id

        provider, header_key = _header_key(provider, ctx)
        client = self.client(owner, ctx.traceparent)
        planner = self.services.get("agent_planner")  # the directory's agents (agent/services/agent_wiring.py)
        agents = await planner(owner, request.requirement) if planner is not None else []
        try:
            result = await generate_tree(
                request.requirement, client=client, executors=self.executors(), provider=provider,
                model=request.model, temperature=request.temperature, max_tokens=request.max_tokens,
                api_key=header_key, user_id=owner, agents=agents,
            )
        except GenerationValidationError as exc:
            # The model never saw a key; still, never echo the header's (problems quote its answer).
            problems = [x.replace(header_key, "[redacted]") if header_key else x for x in exc.problems]
            message = "Generated task tree is invalid (after one repair round): " + "; ".join(problems)
            raise RpcError(INVALID_PARAMS, message, "\n".join(problems)) from None
        except LLMKeyMissingError as exc:
            raise invalid_params(_safe(str(exc), header_key)) from None
        except LLMError as exc:
            raise invalid_params("LLM generation failed: " + _safe(str(exc), header_key)) from None
        except GenerationError as exc:
            raise invalid_params(_safe(str(exc), header_key)) from None

        tasks = [dict(t, user_id=owner) if owner is not None else dict(t) for t in result.tasks]
        answer: dict[str, Any] = {"tasks": tasks, "count": len(tasks)}
        repaired = " after one repair round" if result.attempts > 1 else ""
        if request.save:
            rows = await self.tasks.create_tree(NewTree.from_params(tasks, self.settings.max_tree_tasks), caller)
            answer["root_task_id"] = rows[0]["id"]
            answer["message"] = (f"Generated and saved {len(tasks)} tasks{repaired}; they are pending, "
                                 f"start them with tasks.execute on root task '{rows[0]['id']}'")
        else:
            answer["message"] = (f"Generated {len(tasks)} tasks{repaired}; not saved: pass them to "
                                 f"tasks.create, or call tasks.generate with save=true")
        answer["token_usage"] = result.usage
        answer["usage"] = stored_usage.shown(client.spend)
        return answer


def _header_key(wanted: str | None, ctx: CallContext) -> tuple[str | None, str | None]:
    """(provider, header key): the header key is used unless it names another provider than the
    one asked for (a `<provider>:<key>` header must not send one vendor's key to another)."""
    if not ctx.llm_api_key:
        return wanted, None
    header_provider = normalize_provider(ctx.llm_provider) if ctx.llm_provider else None
    if wanted and header_provider and normalize_provider(wanted) != header_provider:
        return wanted, None
    return wanted or header_provider, ctx.llm_api_key


def _safe(text: str, *secrets: str | None) -> str:
    return redact(text, *secrets)
