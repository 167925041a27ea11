// A tree page: the dependency graph (layout.js, graph.js) kept live over /ws, a task's detail,
// the actions execute, re-execute (on a copy), cancel and copy, and the answer form of a task
// that waits for input (answer.js).

import {answerForm} from "./answer.js";
import {call, watch} from "./api.js";
import {h, json} from "./dom.js";
import {drawGraph} from "./graph.js";
import {layout} from "./layout.js";
import {logsSection} from "./logs.js";
import {counts} from "./list.js";
import {attemptsTable, timeline} from "./timeline.js";
import {treeUsageLine} from "./usage.js";

// Detail fields in reading order; objects are shown as JSON.
// `waiting_for` (docs/sharing.md, "Why a task waits") sits next to the status it explains.
// `waiting` (docs/waits.md) is what a parked task waits for.
// `usage`, `budget`, `budget_remaining` and a root's `tree_usage`: LLM tokens and cost (docs/costs.md).
const FIELDS = ["id", "name", "status", "waiting", "waiting_for", "progress", "priority", "user_id", "parent_id",
  "task_tree_id", "original_task_id", "dependencies", "inputs", "params", "schemas", "result", "error",
  "usage", "tree_usage", "budget", "budget_remaining", "retry",
  "attempt", "interruptions", "next_attempt_at", "timeout_seconds", "concurrency", "rate_limit", "created_at",
  "started_at", "completed_at", "updated_at"];

export async function showTree(main, rootId, notify, go, current) {
  const started = performance.now();
  const tree = await call("tasks.tree", {task_id: rootId});
  if (!current()) return null;
  const plan = layout(tree);
  const detail = h("aside", {class: "detail", "data-testid": "detail"}, h("p", {class: "hint"}, "Click a task for its detail."));
  const summary = h("span", {class: "summary", "data-testid": "summary"});
  const live = h("span", {class: "live", "data-testid": "live"}, "connecting…");
  const measured = h("span", {class: "measured", "data-testid": "render-time"});
  const usageLine = h("span", {"data-testid": "usage-line"});
  let selected = null;

  const select = async (id) => {
    selected = id;
    graph.select(id);
    await showDetail(id);
  };
  const graph = drawGraph(plan, select);
  const times = timeline(rootId, plan, select);
  const refreshSummary = () => {
    const byStatus = {};
    for (const task of plan.tasks.values()) byStatus[task.status] = (byStatus[task.status] || 0) + 1;
    summary.replaceChildren(`${plan.tasks.size} tasks `, counts(byStatus));
  };
  // What the tree's LLM calls used and what the root's budget leaves (tasks.get of the root):
  // read with the page, then again at most twice a second while its tasks change.
  let usageTimer = null;
  const refreshUsage = async () => {
    const root = await call("tasks.get", {task_id: tree.id}).catch(() => null);
    if (root && current()) usageLine.replaceChildren(treeUsageLine(root));
  };
  const refreshUsageSoon = () => {
    if (!usageTimer) usageTimer = setTimeout(() => { usageTimer = null; refreshUsage(); }, 500);
  };

  async function act(label, work) {
    try {
      await work();
    } catch (error) {
      notify(`${label} failed: ${error.message}`);
    }
  }

  async function showDetail(id) {
    const task = await call("tasks.get", {task_id: id});
    if (selected !== id) return;
    if (!task) {
      detail.replaceChildren(h("p", {}, "This task no longer exists."));
      return;
    }
    const fields = h("dl", {});
    for (const field of FIELDS) {
      if (!(field in task)) continue;
      const value = task[field];
      fields.append(h("dt", {}, field), h("dd", {"data-field": field},
        value !== null && typeof value === "object" ? json(value) : String(value ?? "—")));
    }
    const buttons = [];
    if (task.status === "pending" || task.status === "failed") {
      buttons.push(h("button", {"data-testid": "execute", onclick: () => act("Execute", async () => {
        const answer = await call("tasks.execute", {task_id: id});
        notify(answer.message || answer.status, answer.success ? "info" : "error");
      })}, "Execute"));
    }
    if (task.status === "completed" || task.status === "failed" || task.status === "cancelled") {
      buttons.push(h("button", {"data-testid": "re-execute", onclick: () => act("Re-execute", async () => {
        const answer = await call("tasks.execute", {task_id: id, copy_execution: true});
        go(`#/tree/${encodeURIComponent(answer.root_task_id)}`);
      })}, "Re-execute on a copy"));
    }
    if (task.status === "pending" || task.status === "in_progress") {
      buttons.push(h("button", {"data-testid": "cancel", onclick: () => act("Cancel", async () => {
        const [answer] = await call("tasks.cancel", {task_ids: [id]});
        notify(answer.message, answer.status === "cancelled" ? "info" : "error");
      })}, "Cancel"));
    }
    buttons.push(h("button", {"data-testid": "copy", onclick: () => act("Copy", async () => {
      const copy = await call("tasks.copy", {task_id: id, children: true});
      go(`#/tree/${encodeURIComponent(copy.id)}`);
    })}, "Copy"));
    const answer = task.waiting && ["input", "agent_input"].includes(task.waiting.kind) && task.status === "in_progress"
      ? answerForm(task, () => { notify(`Answered ${task.name}`, "info"); if (selected === id) showDetail(id); })
      : null;
    const logs = logsSection(task);
    // (replaceChildren would show a null as the text "null": absent parts are left out)
    detail.replaceChildren(...[h("h2", {}, task.name), answer, h("p", {class: "actions"}, buttons), fields, logs]
      .filter(Boolean));
    const durations = await attemptsTable(id).catch(() => null);
    if (selected !== id || !durations) return;
    // Put in place, not by drawing the detail again: moving the answer form would take the focus
    // from whoever is typing into it, and their next keystrokes would go nowhere.
    fields.after(durations);
  }

  main.replaceChildren(
    h("section", {class: "tree-page"},
      h("h1", {}, h("a", {href: "#/"}, "Trees"), " / ", tree.name),
      h("p", {class: "toolbar"}, summary, usageLine, " ", live, " ", measured),
      h("div", {class: "split"}, h("div", {class: "canvas"}, graph.svg), detail), times.node));
  refreshSummary();
  refreshUsage();
  // The time to a drawn frame: layout, DOM, style and layout by the browser.
  await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  if (!current()) return null;
  const renderMs = performance.now() - started;
  measured.textContent = `drawn in ${Math.round(renderMs)} ms`;
  document.body.dataset.renderMs = String(renderMs);

  let timer = null;
  const connection = watch([...plan.tasks.keys()], (message) => {
    const task = plan.tasks.get(message.task_id);
    if (message.type === "error") {
      notify(`Live updates: ${message.message}`);
      return;
    }
    if (!task || !message.data || !message.data.status) return;
    task.status = message.data.status;
    if ("waiting" in message.data) task.waiting = message.data.waiting;  // parked, or resumed (null)
    else if (task.status !== "in_progress") task.waiting = null;
    if (typeof message.data.progress === "number") task.progress = message.data.progress;
    if (task.status === "completed") task.progress = 1;
    graph.update(task.id, task.status, task.progress, task.waiting);
    if (!timer) timer = setTimeout(() => { timer = null; refreshSummary(); }, 100);
    refreshUsageSoon();
    times.refresh();
    if (message.task_id === selected && !message.data.snapshot) showDetail(selected);
  }, () => {
    live.textContent = "live updates stopped (reload to reconnect)";
    live.classList.add("down");
  });
  connection.ready.then(() => {
    if (!live.classList.contains("down")) live.textContent = "live";
  });
  return () => connection.close();
}
