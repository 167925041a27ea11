"""taskgrove's Python client: `from taskgrove import Client` (or `AsyncClient`).

    from taskgrove.client import Client, Tree

    report = Tree("Weekly report", "aggregate_results_executor")
    numbers = report.add("Numbers", "noop_executor", week=12)
    report.after(numbers)
    with Client("http://localhost:8000") as client:
        tree = client.create(report)            # a TaskTree, typed
        done = client.wait(tree.id)

One module per job: `aio` (AsyncClient), `sync` (Client), `automation` (`client.agents`,
`client.triggers`), `builder` (Tree), `answers` and `answers_automation` (the typed answers),
`reading` (an answer into its model), `exceptions` (the exceptions and the one table mapping
answers to them), `resend` (what is resent, when), `rpc` (the HTTP side), `watch` (live events
over /ws). The manual: docs/client.md.
It imports nothing of the service: httpx, websockets, pydantic and anyio are all it needs.
"""

from taskgrove.client.aio import UNSET, AsyncClient
from taskgrove.client.answers import (Answer, AsyncEvent, Attempt, Budget, Cancellation, ClonePreview, Deletion,
                                      Dependency, Emitted, Event, EventData, Execution, ExecutorInfo, Executors,
                                      Health, LlmKeyDeleted, LlmKeyStatus, LlmKeyStored, LogLine, LogPage, Purge,
                                      RetryPolicy, RunningCount, RunningStatus, Schedule, ScheduleDeletion,
                                      ScheduleRun, SyncEvent, Task, TaskPage, TaskStatus, TaskTree, Usage,
                                      UsageDay, UsageTotals, Wait)
from taskgrove.client.answers_automation import (Agent, AgentHealth, AgentInterface, AgentPage, AgentRemoval,
                                                 AgentSkill, Generated, Trigger, TriggerBatch, TriggerDebounce,
                                                 TriggerDeletion, TriggerRun)
from taskgrove.client.builder import Needs, TaskSpec, Tree, optional
from taskgrove.client.exceptions import (Conflict, InvalidParams, InvalidRequest, MethodNotFound, NotFound,
                                         PermissionDenied, ProtocolError, QuotaExceeded, ServerError,
                                         TaskgroveError, Unavailable, Unreachable)
from taskgrove.client.resend import Retry, RetryEvent, Safety
from taskgrove.client.sync import Client, Watch
from taskgrove.client.watch import TreeWatch, WatchedTask

__all__ = [
    "Agent", "AgentHealth", "AgentInterface", "AgentPage", "AgentRemoval", "AgentSkill", "Generated", "Trigger",
    "TriggerBatch", "TriggerDebounce", "TriggerDeletion", "TriggerRun",
    "Answer", "AsyncClient", "AsyncEvent", "Attempt", "Budget", "Cancellation", "Client", "ClonePreview", "Conflict",
    "Deletion",
    "Dependency", "Emitted", "Event", "EventData", "Execution", "ExecutorInfo", "Executors", "Health",
    "InvalidParams", "InvalidRequest", "LlmKeyDeleted", "LlmKeyStatus", "LlmKeyStored", "LogLine", "LogPage",
    "MethodNotFound", "Needs", "NotFound", "PermissionDenied", "ProtocolError", "Purge", "QuotaExceeded", "Retry",
    "RetryEvent", "RetryPolicy", "RunningCount", "RunningStatus", "Safety", "Schedule", "ScheduleDeletion",
    "ScheduleRun", "ServerError", "SyncEvent", "Task", "TaskPage", "TaskSpec", "TaskStatus", "TaskTree",
    "TaskgroveError", "Tree", "TreeWatch", "UNSET", "Unavailable", "Unreachable", "Usage", "UsageDay", "UsageTotals",
    "Wait", "Watch", "WatchedTask", "optional",
]
