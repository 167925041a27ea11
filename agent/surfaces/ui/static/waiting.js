// "Waiting for an answer" (#/waiting): every task that waits for a person's input or for the answer
// to a question another agent asked it (docs/waits.md, docs/agents.md), oldest first, each with who
// asks, since when, until when, its tree, and the answer form (answer.js: tasks.respond). Answered,
// the task leaves the list; a refusal is shown under its form.

import {call} from "./api.js";
import {h} from "./dom.js";
import {answerForm} from "./answer.js";

const ANSWERED_HERE = new Set(["input", "agent_input"]);  // the waits tasks.respond answers

// Who asks: a person (kind input), or the agent (and, down a chain, the agent that asked it).
function asker(wait) {
  if (wait.kind !== "agent_input") return "asks for your input";
  const names = [];
  for (let agent = wait.agent; agent && names.length < 10; agent = agent.asked_by) {
    names.push(agent.name || agent.url || "an agent");
  }
  return names.length ? `the agent ${names.join(", asked by ")} asks` : "an agent asks";
}

export async function showWaiting(main, notify, current) {
  const answer = await call("tasks.list", {waiting: true, root_only: false, limit: 1000}, "/tasks");
  if (!current()) return;
  const tasks = (Array.isArray(answer) ? answer : answer.tasks || [])
    .filter((task) => task.waiting && ANSWERED_HERE.has(task.waiting.kind) && task.status === "in_progress")
    .sort((a, b) => String(a.waiting.since || "").localeCompare(String(b.waiting.since || "")));
  const reload = (task) => {
    notify(`Answered ${task.name}`, "info");
    showWaiting(main, notify, current).catch((error) => notify(error.message || String(error)));
  };
  main.replaceChildren(h("section", {},
    h("h1", {}, `Waiting for an answer (${tasks.length})`),
    tasks.length === 0
      ? h("p", {class: "empty", "data-testid": "no-waiting"}, "No task waits for an answer.")
      : h("ul", {class: "waiting", "data-testid": "waiting"}, tasks.map((task) => {
        const wait = task.waiting;
        const tree = task.task_tree_id || task.root_task_id || task.id;
        return h("li", {class: "waiting-task", "data-testid": "waiting-task", "data-task-id": task.id,
                        "data-kind": wait.kind},
          h("p", {class: "who"},
            h("a", {href: `#/tree/${encodeURIComponent(tree)}`}, task.name || task.id),
            " · ", h("span", {"data-testid": "waiting-asker"}, asker(wait)),
            ` · since ${wait.since || "—"}`, wait.deadline ? ` · until ${wait.deadline}` : ""),
          answerForm(task, () => reload(task)));
      }))));
}
