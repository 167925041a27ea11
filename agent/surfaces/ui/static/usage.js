// LLM usage and budgets on the dashboard (docs/costs.md): the per-user usage page (#/usage: a
// user's calls, tokens and cost per UTC day from usage.get, with their daily budget from
// config.budget.get) and the tree page's line of what the tree used and what its budget leaves.

import {call} from "./api.js";
import {h} from "./dom.js";

const DAYS = [7, 30, 90, 366];

// A cost in US dollars, or why there is none (a call of a model without a price: docs/costs.md).
export function dollars(cost) {
  return cost === null || cost === undefined ? "cost unknown" : `$${Number(cost).toFixed(6)}`;
}

// The tree page's usage line: the tree's calls, tokens and cost, and what the root's budget leaves.
// `root` is tasks.get of the root (its `tree_usage`, `budget`, `budget_remaining`).
export function treeUsageLine(root) {
  const usage = root.tree_usage;
  const parts = [];
  if (usage && usage.calls) {
    parts.push(h("span", {"data-testid": "tree-usage"},
      `LLM: ${usage.calls} calls, ${usage.total_tokens} tokens, ${dollars(usage.cost_usd)}`));
  }
  const left = root.budget_remaining;
  if (root.budget && left) {
    const kinds = [];
    if (root.budget.max_tokens !== undefined && root.budget.max_tokens !== null) {
      kinds.push(`${left.tokens} of ${root.budget.max_tokens} tokens`);
    }
    if (root.budget.max_cost_usd !== undefined && root.budget.max_cost_usd !== null) {
      kinds.push(`${left.cost_usd === null ? "an unknown amount" : dollars(left.cost_usd)} of $${root.budget.max_cost_usd}`);
    }
    parts.push(h("span", {"data-testid": "budget-left"}, `budget left: ${kinds.join(" and ")}`));
  }
  return parts.length ? h("span", {class: "usage"}, " · ", ...parts.flatMap((p, i) => i ? [" · ", p] : [p])) : "";
}

// #/usage?user=<id>&days=<n>: one's own usage by default (the token's user; with JWT off, pick one).
export async function showUsage(main, query, go, current) {
  const user = query.get("user") || "";
  const days = DAYS.includes(Number(query.get("days"))) ? Number(query.get("days")) : 30;
  const whose = user ? {user_id: user} : {};
  const [usage, budget] = await Promise.all([
    call("usage.get", {...whose, days}, "/tasks"), call("config.budget.get", whose)]);
  if (!current()) return;
  const userBox = h("input", {type: "text", name: "user", value: user, placeholder: "your own",
                              "data-testid": "usage-user"});
  const daysBox = h("select", {name: "days", "data-testid": "usage-days"},
    DAYS.map((n) => h("option", {value: n, selected: n === days}, `last ${n} days`)));
  const form = h("form", {class: "filters", onsubmit: (event) => {
    event.preventDefault();
    const params = new URLSearchParams({days: daysBox.value});
    if (userBox.value.trim()) params.set("user", userBox.value.trim());
    go(`#/usage?${params}`);
  }}, h("label", {}, "User ", userBox), daysBox, h("button", {type: "submit"}, "Show"));
  const who = usage.user_id === null || usage.user_id === undefined || usage.user_id === "" ? "calls without a user"
    : `user ${usage.user_id}`;
  main.replaceChildren(h("section", {class: "usage-page"},
    h("h1", {}, "LLM usage"), form,
    h("p", {"data-testid": "usage-who"}, `Usage of ${who}, per UTC day.`),
    budgetLine(budget), daysTable(usage.days)));
}

function budgetLine(budget) {
  if (budget.max_tokens === null && budget.max_cost_usd === null) {
    return h("p", {"data-testid": "daily-budget"}, "No daily budget.");
  }
  const limits = [];
  if (budget.max_tokens !== null) limits.push(`${budget.max_tokens} tokens`);
  if (budget.max_cost_usd !== null) limits.push(`$${budget.max_cost_usd}`);
  const left = [];
  if (budget.remaining.tokens !== null) left.push(`${budget.remaining.tokens} tokens`);
  if (budget.max_cost_usd !== null) left.push(budget.remaining.cost_usd === null ? "an unknown amount" : dollars(budget.remaining.cost_usd));
  const source = budget.source === "user" ? "set for this user" : "the service's setting";
  return h("p", {"data-testid": "daily-budget"},
    `Daily budget (${source}): ${limits.join(" and ")}; left today: ${left.join(" and ")}.`);
}

const COLUMNS = [["calls", "calls"], ["prompt_tokens", "prompt tokens"], ["completion_tokens", "completion tokens"],
                 ["total_tokens", "tokens"]];

function daysTable(days) {
  if (!days.length) return h("p", {class: "empty", "data-testid": "usage-none"}, "No LLM calls in these days.");
  const cells = (row) => [...COLUMNS.map(([key]) => h("td", {"data-field": key}, String(row[key]))),
                          h("td", {"data-field": "cost_usd"}, dollars(row.cost_usd))];
  let total = {calls: 0, prompt_tokens: 0, completion_tokens: 0, total_tokens: 0, cost_usd: 0};
  for (const day of days) {
    for (const [key] of COLUMNS) total[key] += day[key];
    total.cost_usd = total.cost_usd === null || day.cost_usd === null ? null : total.cost_usd + day.cost_usd;
  }
  return h("table", {class: "usage-days", "data-testid": "usage-days-table"},
    h("thead", {}, h("tr", {}, ["day", ...COLUMNS.map(([, label]) => label), "cost"].map((t) => h("th", {}, t)))),
    h("tbody", {}, days.map((day) => h("tr", {"data-testid": "usage-day", "data-day": day.day},
      h("td", {class: "time"}, day.day), ...cells(day)))),
    h("tfoot", {}, h("tr", {"data-testid": "usage-total"}, h("th", {}, "total"), ...cells(total))));
}
