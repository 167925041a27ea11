// The Agents page (#/agents, docs/agents.md): the directory's agents the caller sees (agents.list,
// every page), each with its skills, its health from real calls (successes, failures, p50/p95, the
// last error), its breaker, and, under its row on demand, its recent calls. A card whose interfaces
// moved is flagged; Refresh fetches the card again (agents.refresh), Accept follows the move.
// Every value is set as text (dom.js): a card's words are the remote agent's, never markup.

import {call} from "./api.js";
import {h} from "./dom.js";

const rpc = (method, params) => call(method, params, "/tasks");
const HEALTH = ["healthy", "failing", "open", "unknown"];
const MAX_PAGES = 20;  // 500 a page: at most 10,000 agents drawn

async function allAgents(health) {
  const agents = [];
  let cursor = null;
  for (let page = 0; page < MAX_PAGES; page++) {
    const answer = await rpc("agents.list", {limit: 500, cursor, ...(health ? {health} : {})});
    agents.push(...answer.agents);
    cursor = answer.next_cursor;
    if (!cursor) break;
  }
  return agents;
}

export async function showAgents(main, params, notify, go, current) {
  const health = HEALTH.includes(params.get("health")) ? params.get("health") : "";
  const agents = await allAgents(health);
  if (!current()) return;
  const filter = h("select", {"data-testid": "agents-health", onchange: (event) =>
    go(event.target.value ? `#/agents?health=${event.target.value}` : "#/agents")},
  h("option", {value: ""}, "every health"),
  HEALTH.map((state) => h("option", {value: state, selected: state === health}, state)));
  main.replaceChildren(h("section", {},
    h("h1", {}, `Agents (${agents.length})`),
    h("div", {class: "filters"}, filter),
    agents.length === 0
      ? h("p", {class: "empty", "data-testid": "no-agents"},
        health ? `No agent is ${health}.` : "No agents yet: add one with agents.add (its card URL).")
      : h("table", {class: "agents", "data-testid": "agents"},
        h("thead", {}, h("tr", {}, ["agent", "skills", "health", "calls", "latency p50 / p95", "last error",
          "breaker", ""].map((t) => h("th", {}, t)))),
        h("tbody", {}, agents.map((agent) => row(agent, notify, go))))));
}

function ms(value) {
  return value === null || value === undefined ? "—" : `${value} ms`;
}

function skills(agent) {
  if (!agent.skills.length) return h("span", {class: "empty"}, "none");
  return h("ul", {class: "skills"}, agent.skills.map((skill) => h("li", {"data-testid": "agent-skill",
    title: [skill.description, ...(skill.examples || []).map((e) => `e.g. ${e}`)].filter(Boolean).join("\n")},
  h("span", {class: "id"}, skill.id), skill.name && skill.name !== skill.id ? ` ${skill.name}` : "",
  (skill.tags || []).length ? h("span", {class: "tags"}, ` (${skill.tags.join(", ")})`) : "")));
}

function breaker(agent) {
  if (agent.breaker === "closed") return h("span", {class: "breaker closed"}, "closed");
  const until = agent.breaker_until ? ` until ${agent.breaker_until}` : "";
  return h("span", {class: `breaker ${agent.breaker}`}, `${agent.breaker}${until}`);
}

function row(agent, notify, go) {
  const health = agent.health;
  const act = (label, testid, action) => h("button", {type: "button", "data-testid": testid, onclick: async () => {
    try {
      await action();
    } catch (error) {
      notify(error.message || String(error));
    }
  }}, label);
  const refresh = (accept) => async () => {
    await rpc("agents.refresh", {name: agent.name, ...(accept ? {accept: true} : {})});
    go("#/agents", [`Agent ${agent.name}: card ${accept ? "accepted" : "refreshed"}`, "info"]);
  };
  const line = h("tr", {"data-testid": "agent-row", "data-agent": agent.name, "data-health": health.state,
                        "data-breaker": agent.breaker},
    h("td", {},
      h("strong", {"data-field": "name"}, agent.name), agent.shared ? h("span", {class: "badge"}, "shared") : "",
      h("div", {class: "id"}, agent.card_url),
      agent.description ? h("div", {"data-field": "description"}, agent.description) : "",
      agent.changed ? h("div", {class: "answer-error", "data-testid": "agent-changed"},
        "Its card moved (interfaces changed): not followed until accepted.") : "",
      agent.refresh_error ? h("div", {class: "answer-error"}, `Refresh failed: ${agent.refresh_error}`) : ""),
    h("td", {}, skills(agent)),
    h("td", {"data-field": "health"}, h("span", {class: `badge agent-${health.state}`}, health.state)),
    h("td", {"data-field": "calls"}, `${health.successes} ok · ${health.failures} failed`,
      health.consecutive_failures ? h("div", {class: "empty"}, `${health.consecutive_failures} in a row`) : ""),
    h("td", {"data-field": "latency"}, `${ms(health.p50_ms)} / ${ms(health.p95_ms)}`),
    h("td", {"data-field": "last-error"}, health.last_error || "—"),
    h("td", {"data-field": "breaker"}, breaker(agent)),
    h("td", {},
      act("Calls", "show-calls", async () => {
        const shown = line.nextElementSibling;
        if (shown && shown.dataset.testid === "agent-calls") shown.remove();
        else line.after(calls(agent));
      }),
      " ", act("Refresh", "refresh-agent", refresh(false)),
      agent.changed ? [" ", act("Accept", "accept-agent", refresh(true))] : ""));
  return line;
}

function calls(agent) {
  const recent = [...(agent.health.recent || [])].reverse();  // newest first
  const table = recent.length === 0
    ? h("p", {class: "empty"}, "No calls yet.")
    : h("table", {class: "runs"},
      h("thead", {}, h("tr", {}, ["at", "outcome", "took", "error"].map((t) => h("th", {}, t)))),
      h("tbody", {}, recent.map((one) => h("tr", {"data-testid": "agent-call", "data-ok": String(one.ok)},
        h("td", {class: "time"}, one.at), h("td", {}, one.ok ? "ok" : "failed"), h("td", {}, ms(one.ms)),
        h("td", {}, one.error || "")))));
  return h("tr", {"data-testid": "agent-calls", "data-agent": agent.name}, h("td", {colspan: 8},
    h("p", {class: "empty"}, `Last calls of ${agent.name}, newest first (at most 10); `,
      `${agent.health.calls} calls in all, concurrency ${agent.concurrency} (${agent.concurrency_key}).`),
    table));
}
