"""The GraphQL schema of SPEC.md (Typed query surface): operations, argument names and types as
the SPEC table gives them. Arguments SPEC.md types as nullable `String` are nullable here too; a
missing one is answered with an INVALID_PARAMS (-32602) error, as `/tasks` does."""

from collections.abc import AsyncGenerator
from typing import Any, Optional

import strawberry
from graphql import GraphQLError
from graphql import ASTValidationRule, SelectionSetNode, ValidationContext, ValidationRule
from strawberry.scalars import JSON
from strawberry.extensions import AddValidationRules, MaxAliasesLimiter, MaxTokensLimiter, QueryDepthLimiter

from taskgrove.agent.foundations.settings import Settings
from taskgrove.agent.surfaces.graphql import agent_resolvers, resolvers
from taskgrove.agent.surfaces.graphql.agent_types import AddAgentInput, AgentHealthEnum, AgentPage, AgentType
from taskgrove.agent.surfaces.graphql.graphql_errors import classify_errors
from taskgrove.agent.surfaces.graphql.subscription import task_status_changes
from taskgrove.agent.surfaces.graphql.trigger_fields import TriggerMutation, TriggerQuery
from taskgrove.agent.surfaces.graphql.types import CreateTaskInput, PurgeResult, TaskStatusEnum, TaskType, UpdateTaskInput


@strawberry.type
class Query(TriggerQuery):  # the triggers' fields: graphql/trigger_fields.py
    @strawberry.field(description="One task by id; null when it does not exist.")
    async def task(self, info: strawberry.Info, task_id: Optional[str] = None) -> Optional[TaskType]:
        return await resolvers.task(info, task_id)

    @strawberry.field(description="Tasks newest first (by creation); with JWT on, the caller's own unless admin.")
    async def tasks(self, info: strawberry.Info, status: Optional[TaskStatusEnum] = None,
                    limit: Optional[int] = None, offset: Optional[int] = None) -> Optional[list[Optional[TaskType]]]:
        return await resolvers.tasks(info, status, limit, offset)  # type: ignore[return-value]  # list is invariant

    @strawberry.field(description="Direct children of a task, oldest first.")
    async def task_children(self, info: strawberry.Info,
                            parent_id: Optional[str] = None) -> Optional[list[Optional[TaskType]]]:
        return await resolvers.task_children(info, parent_id)  # type: ignore[return-value]  # list is invariant

    @strawberry.field(description="Agents of the directory the caller sees (agents.list): filtered by a skill id or "
                                  "tag, a tag, a health; a page of limit (default 50) after cursor.")
    async def agents(self, info: strawberry.Info, skill: Optional[str] = None, tag: Optional[str] = None,
                     health: Optional[AgentHealthEnum] = None, limit: Optional[int] = None,
                     cursor: Optional[str] = None) -> Optional[AgentPage]:
        return await agent_resolvers.agents(info, skill, tag, health, limit, cursor)

    @strawberry.field(description="One agent of the directory by name (or agentId); null when there is none.")
    async def agent(self, info: strawberry.Info, name: Optional[str] = None,
                    agent_id: Optional[str] = None) -> Optional[AgentType]:
        return await agent_resolvers.agent(info, name, agent_id)


@strawberry.type
class Mutation(TriggerMutation):
    @strawberry.mutation(description="Create a task and start executing it; returns at once (docs/live-updates.md).")
    async def create_task(self, info: strawberry.Info,
                          task_input: Optional[CreateTaskInput] = None) -> Optional[TaskType]:
        return await resolvers.create_task(info, task_input)

    @strawberry.mutation(description="Change fields of a task (the rules of tasks.update).")
    async def update_task(self, info: strawberry.Info, task_id: Optional[str] = None,
                          task_input: Optional[UpdateTaskInput] = None) -> Optional[TaskType]:
        return await resolvers.update_task(info, task_id, task_input)

    @strawberry.mutation(description="Cancel a pending or running task: true when cancelled, false when already finished.")
    async def cancel_task(self, info: strawberry.Info, task_id: Optional[str] = None) -> Optional[bool]:
        return await resolvers.cancel_task(info, task_id)

    @strawberry.mutation(description="Answer the wait for input of a task (the rules of tasks.respond); returns the task.")
    async def respond_to_task(self, info: strawberry.Info, task_id: Optional[str] = None,
                              value: Optional[JSON] = strawberry.UNSET) -> Optional[TaskType]:
        return await resolvers.respond_to_task(info, task_id, value)

    @strawberry.mutation(description="Emit an event (the rules of events.emit); returns how many waits it resumed.")
    async def emit_event(self, info: strawberry.Info, name: Optional[str] = None,
                         payload: Optional[JSON] = None, user_id: Optional[str] = None) -> Optional[int]:
        return await resolvers.emit_event(info, name, payload, user_id)

    @strawberry.mutation(description="Delete a pending task and its descendants (the rules of tasks.delete).")
    async def delete_task(self, info: strawberry.Info, task_id: Optional[str] = None) -> Optional[bool]:
        return await resolvers.delete_task(info, task_id)

    @strawberry.mutation(description="Admins: one retention sweep now, of the trees ended longer ago than olderThan "
                                     "(30d, 12h, 90s or seconds; default SERVICE_RETENTION): the rules of tasks.purge.")
    async def purge_tasks(self, info: strawberry.Info, older_than: Optional[str] = None) -> Optional[PurgeResult]:
        return await resolvers.purge_tasks(info, older_than)

    @strawberry.mutation(description="Add an A2A agent to the directory from its card (the rules of agents.add).")
    async def add_agent(self, info: strawberry.Info, agent_input: Optional[AddAgentInput] = None) -> Optional[AgentType]:
        return await agent_resolvers.add_agent(info, agent_input)

    @strawberry.mutation(description="Fetch an agent's card again (agents.refresh); accept: follow a flagged change "
                                     "of its interfaces.")
    async def refresh_agent(self, info: strawberry.Info, name: Optional[str] = None,
                            accept: Optional[bool] = None) -> Optional[AgentType]:
        return await agent_resolvers.refresh_agent(info, name, accept)

    @strawberry.mutation(description="Remove an agent from the directory (agents.remove): true when removed.")
    async def remove_agent(self, info: strawberry.Info, name: Optional[str] = None) -> Optional[bool]:
        return await agent_resolvers.remove_agent(info, name)


@strawberry.type
class Subscription:
    @strawberry.subscription(description="The task's current state, then each status change; completes at "
                                         "COMPLETED, FAILED or CANCELLED.")
    async def task_status_changed(self, info: strawberry.Info,
                                  task_id: Optional[str] = None) -> AsyncGenerator[Optional[TaskType], None]:
        async for task in task_status_changes(info, task_id):
            yield task


class TaskSchema(strawberry.Schema):
    """Gives every error a JSON-RPC code and logs only the unexpected ones (see errors.py)."""

    def process_errors(self, errors: list[GraphQLError], execution_context: Any = None) -> None:
        classify_errors(errors)


class _DepthLimiter(QueryDepthLimiter):
    """strawberry's depth rule assumes a valid document: it raises on an unknown fragment or an
    empty selection (`mutation { }`), which came out as "Internal error". Here it steps aside on
    such a document, so graphql-core's own rules report it with its locations (-32600)."""

    def __init__(self, max_depth: int) -> None:
        super().__init__(max_depth=max_depth)
        self.validation_rules = [_tolerant(rule) for rule in self.validation_rules]


def _tolerant(rule: type[ASTValidationRule]) -> type[ASTValidationRule]:
    class Tolerant(rule):  # type: ignore[misc, valid-type]
        def __init__(self, context: ValidationContext) -> None:
            try:
                super().__init__(context)
            except (KeyError, ValueError):  # an invalid document: the standard rules say why
                ValidationRule.__init__(self, context)

    return Tolerant


class _NoEmptySelections(ValidationRule):
    """The GraphQL grammar wants at least one field between braces; graphql-core 3.3 parses
    `mutation { }` anyway and would answer `{"data": {}}` as if something had been asked."""

    def enter_selection_set(self, node: SelectionSetNode, *_: Any) -> None:
        if not node.selections:
            self.report_error(GraphQLError("Syntax Error: Expected a field, found '}'.", node))


def build_schema(settings: Settings | None = None) -> TaskSchema:
    """The schema, with the cost limits of `settings` (SERVICE_GRAPHQL_MAX_DEPTH, _ALIASES, _TOKENS;
    introspection fields do not count towards the depth)."""
    extensions: list[Any] = [lambda: AddValidationRules([_NoEmptySelections])]
    if settings is not None:
        extensions += [
            lambda: MaxTokensLimiter(max_token_count=settings.graphql_max_tokens),
            lambda: _DepthLimiter(max_depth=settings.graphql_max_depth),
            lambda: MaxAliasesLimiter(max_alias_count=settings.graphql_max_aliases),
        ]
    return TaskSchema(query=Query, mutation=Mutation, subscription=Subscription, extensions=extensions)
