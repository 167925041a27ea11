"""The directory's agents in the planner's prompt, and the problems of a plan that delegates.

`llm/generate.py` lists the local executors; with a directory of agents (docs/agents.md) the
planner is also told which agents it may hand work to, each with its description and skills (with
a few examples), and a task delegates by naming one: `a2a_agent_executor` with `inputs.agent`.
The caller chooses which agents (at most 20, those whose skills match the request best), so the
prompt stays bounded whatever the directory holds. A plan naming an agent that is not listed, or a
skill none of them has, is a problem like an unknown executor: the repair round sees it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DELEGATING = "a2a_agent_executor"
MAX_TEXT = 300  # characters of one description or example in the prompt


def _short(text: Any) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 1] + "…"


def agents_section(agents: Sequence[Mapping[str, Any]]) -> str:
    """The prompt's part about agents ("" without any)."""
    if not agents:
        return ""
    lines = [f"Agents you may delegate to (a task with name \"{DELEGATING}\" and inputs "
             "{\"agent\": <the agent's name>, \"message\": <what to ask it, in words>}):"]
    for agent in agents:
        lines.append(f"- {agent['name']}: {_short(agent.get('description')) or 'no description'}")
        for skill in agent.get("skills") or ():
            examples = "; ".join(_short(e) for e in (skill.get("examples") or ())[:3])
            tags = ", ".join(skill.get("tags") or ())
            lines.append(f"  skill {skill.get('id')}: {_short(skill.get('description') or skill.get('name'))}"
                         + (f" [tags: {tags}]" if tags else "") + (f" e.g. {examples}" if examples else ""))
    return "\n".join(lines)


def delegation_problems(tasks: Sequence[Mapping[str, Any]], agents: Sequence[Mapping[str, Any]]) -> list[str]:
    """What is wrong with the plan's delegations: an agent not listed, a skill none has."""
    names = {a["name"] for a in agents}
    skills = {str(s.get("id")).casefold() for a in agents for s in a.get("skills") or ()}
    skills |= {str(t).casefold() for a in agents for s in a.get("skills") or () for t in s.get("tags") or ()}
    problems = []
    for index, task in enumerate(tasks):
        if task.get("name") != DELEGATING:
            continue
        inputs = task.get("inputs") or {}
        who = f"task {task.get('id') or '#' + str(index + 1)}"
        agent, skill = inputs.get("agent"), inputs.get("skill")
        if agent is not None and not isinstance(agent, str) or skill is not None and not isinstance(skill, str):
            problems.append(f"{who}: inputs.agent and inputs.skill are strings (an agent's name, a skill id)")
            continue
        if agent is not None and agent not in names:
            listed = ", ".join(sorted(names)) or "none"
            problems.append(f"{who}: agent '{agent}' is not in the directory (agents: {listed})")
        if skill is not None and str(skill).casefold() not in skills:
            problems.append(f"{who}: no agent in the directory has the skill '{skill}'")
        if agent is None and skill is None and not inputs.get("agent_url"):
            problems.append(f"{who}: {DELEGATING} needs inputs.agent (an agent's name from the list)")
    return problems
