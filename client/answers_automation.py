"""The typed answers of the methods that automate work around trees: triggers (`client.triggers`),
the directory of A2A agents (`client.agents`) and tasks.generate; the rules of client/answers.py
(frozen, unknown fields kept, checked for drift by tests/test_client_answers.py)."""

from __future__ import annotations

from pydantic import Field

from taskgrove.client.answers import JSON, Model, TokenUsage, UsageTotals


# --- triggers -----------------------------------------------------------------------------------


class TriggerDebounce(Model):
    """One run with the last event, once a key was quiet for `seconds` (at most `max_wait_seconds` late)."""

    seconds: float
    max_wait_seconds: float | None = None


class TriggerBatch(Model):
    """One run holding up to `size` events, or the ones waiting once the first is `seconds` old."""

    size: int
    seconds: float


class Trigger(Model):
    """A trigger (docs/triggers.md): a run of the stored tree `task_id` for each event `event`
    whose payload meets `match`, under its flow control; with its counters."""

    id: str
    task_id: str
    user_id: str | None = None
    event: str
    match: dict[str, JSON] | None = None
    key: str | None = None
    debounce: TriggerDebounce | None = None
    batch: TriggerBatch | None = None
    singleton: str | None = None  # skip, queue or replace
    cancel_on: str | None = None
    enabled: bool
    matched: int = 0
    runs: int = 0
    debounced: int = 0
    batched: int = 0
    skipped: int = 0
    cancelled: int = 0
    last_run_at: str | None = None
    last_root_task_id: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    # triggers.get: how many of its events wait (a debounce, a batch, a queue).
    waiting: int | None = None


class TriggerRun(Model):
    """One run a trigger started (triggers.runs), newest first."""

    root_task_id: str
    name: str | None = None
    key: str | None = None
    events: int | None = None
    status: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    final_status: str | None = None
    duration_ms: float | None = None
    cancel_reason: str | None = None


class TriggerDeletion(Model):
    success: bool
    trigger_id: str


# --- the agents directory ---------------------------------------------------------------------------


class AgentSkill(Model):
    """A skill of an agent's card: what `skill` of a2a_agent_executor and `agents.list` match (id or tag)."""

    id: str
    name: str | None = None
    description: str | None = None
    tags: list[str] = Field(default_factory=list)
    examples: list[str] = Field(default_factory=list)
    input_modes: list[str] = Field(default_factory=list)
    output_modes: list[str] = Field(default_factory=list)


class AgentInterface(Model):
    """Where an agent's messages go (a change of these is flagged in `changed`, never followed by itself)."""

    url: str
    protocol_binding: str | None = None
    protocol_version: str | None = None


class AgentHealth(Model):
    """How an agent's delegated calls went: `state` healthy, failing, open (breaker) or unknown."""

    state: str
    calls: int = 0
    successes: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    last_error: str | None = None
    last_call_at: str | None = None
    last_success_at: str | None = None
    recent: list[dict[str, JSON]] = Field(default_factory=list)


class Agent(Model):
    """An agent of the directory (docs/agents.md): an A2A agent a tree may delegate to by `name` or
    skill. Its credential is never shown, only `has_credentials`."""

    agent_id: str
    name: str
    card_url: str
    shared: bool = False
    user_id: str | None = None
    tags: list[str] = Field(default_factory=list)
    card_name: str | None = None
    description: str | None = None
    version: str | None = None
    protocol_version: str | None = None
    skills: list[AgentSkill] = Field(default_factory=list)
    interfaces: list[AgentInterface] = Field(default_factory=list)
    fetched_at: str | None = None
    refresh_error: str | None = None
    changed: dict[str, JSON] | None = None  # {"interfaces": {"before", "after"}, "seen_at"}: accept it by refresh
    has_credentials: bool = False
    concurrency: int | None = None
    concurrency_key: str | None = None
    health: AgentHealth | None = None
    breaker: str | None = None  # closed, open or probing
    breaker_until: str | None = None
    created_at: str | None = None
    updated_at: str | None = None


class AgentPage(Model):
    """One page of agents.list; pass `next_cursor` for the next (None: the last page)."""

    agents: list[Agent]
    next_cursor: str | None = None


class AgentRemoval(Model):
    success: bool
    name: str


# --- tasks.generate ---------------------------------------------------------------------------------


class Generated(Model):
    """tasks.generate: the task dicts a plan proposes (ready for `create`), and, with `save`, the
    stored pending tree's `root_task_id` (start it with `execute`)."""

    tasks: list[dict[str, JSON]]
    count: int
    message: str | None = None
    root_task_id: str | None = None
    token_usage: TokenUsage | None = None
    usage: UsageTotals | None = None
