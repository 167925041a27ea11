"""The GraphQL fields of event triggers (docs/triggers.md): `trigger`, `triggers`, `triggerRuns`,
`createTrigger`, `updateTrigger`, `deleteTrigger`.

Mixed into Query and Mutation (agent/surfaces/graphql/schema.py) so the schema file only names
them. Each resolver only renames: it builds the typed request of agent/foundations/requests_triggers.py
from its arguments (`from_params` on the same names as JSON-RPC, so the rules and -32602 messages
are one) and calls TriggerService; a trigger is answered as JSON, the very object JSON-RPC answers.
An argument left out is not sent (an update changes only what is given; null clears a field).
"""

from __future__ import annotations

from typing import Any, Optional

import strawberry
from strawberry.scalars import JSON

from taskgrove.agent.foundations.requests_triggers import (CreateTrigger, ListTriggers, TriggerRef, TriggerRuns,
                                                           UpdateTrigger)
from taskgrove.agent.surfaces.graphql.graphql_errors import checked, service_call


def _given(**arguments: Any) -> dict[str, Any]:
    return {name: value for name, value in arguments.items() if value is not strawberry.UNSET}


def _service(info: strawberry.Info) -> Any:
    return info.context.services.triggers


@strawberry.type
class TriggerQuery:
    @strawberry.field(description="One trigger (the object of triggers.get); null when it does not exist.")
    async def trigger(self, info: strawberry.Info, trigger_id: Optional[str] = None) -> Optional[JSON]:
        request = checked(TriggerRef.from_params, {"trigger_id": trigger_id})
        return await service_call(_service(info).get, request, info.context.call)

    @strawberry.field(description="Triggers newest first (the rules of triggers.list).")
    async def triggers(self, info: strawberry.Info, task_id: Optional[str] = None, event: Optional[str] = None,
                       limit: Optional[int] = None, offset: Optional[int] = None) -> Optional[JSON]:
        request = checked(ListTriggers.from_params, _given(task_id=task_id, event=event, limit=limit, offset=offset))
        return await service_call(_service(info).list, request, info.context.call)

    @strawberry.field(description="The runs a trigger started, newest first (triggers.runs).")
    async def trigger_runs(self, info: strawberry.Info, trigger_id: Optional[str] = None, key: Optional[str] = None,
                           limit: Optional[int] = None) -> Optional[JSON]:
        request = checked(TriggerRuns.from_params, {"trigger_id": trigger_id, "key": key, "limit": limit})
        return await service_call(_service(info).runs, request, info.context.call)


@strawberry.type
class TriggerMutation:
    @strawberry.mutation(description="Create a trigger (triggers.create); returns it.")
    async def create_trigger(self, info: strawberry.Info, task_id: Optional[str] = None,
                             event: Optional[str] = strawberry.UNSET, match: Optional[JSON] = strawberry.UNSET,
                             key: Optional[str] = strawberry.UNSET, debounce: Optional[JSON] = strawberry.UNSET,
                             batch: Optional[JSON] = strawberry.UNSET, singleton: Optional[str] = strawberry.UNSET,
                             cancel_on: Optional[str] = strawberry.UNSET,
                             enabled: Optional[bool] = strawberry.UNSET) -> Optional[JSON]:
        params = {"task_id": task_id, **_given(event=event, match=match, key=key, debounce=debounce, batch=batch,
                                               singleton=singleton, cancel_on=cancel_on, enabled=enabled)}
        request = checked(CreateTrigger.from_params, params)
        return await service_call(_service(info).create, request, info.context.call)

    @strawberry.mutation(description="Change a trigger (triggers.update); returns it.")
    async def update_trigger(self, info: strawberry.Info, trigger_id: Optional[str] = None,
                             event: Optional[str] = strawberry.UNSET, match: Optional[JSON] = strawberry.UNSET,
                             key: Optional[str] = strawberry.UNSET, debounce: Optional[JSON] = strawberry.UNSET,
                             batch: Optional[JSON] = strawberry.UNSET, singleton: Optional[str] = strawberry.UNSET,
                             cancel_on: Optional[str] = strawberry.UNSET,
                             enabled: Optional[bool] = strawberry.UNSET) -> Optional[JSON]:
        params = {"trigger_id": trigger_id, **_given(event=event, match=match, key=key, debounce=debounce,
                                                     batch=batch, singleton=singleton, cancel_on=cancel_on,
                                                     enabled=enabled)}
        request = checked(UpdateTrigger.from_params, params)
        return await service_call(_service(info).update, request, info.context.call)

    @strawberry.mutation(description="Delete a trigger (triggers.delete): true when it was deleted.")
    async def delete_trigger(self, info: strawberry.Info, trigger_id: Optional[str] = None) -> Optional[bool]:
        request = checked(TriggerRef.from_params, {"trigger_id": trigger_id})
        return bool((await service_call(_service(info).delete, request, info.context.call))["success"])
