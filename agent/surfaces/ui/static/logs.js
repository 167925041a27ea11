// The logs of a task in its detail (docs/observability.md, "Task logs"): the lines tasks.logs
// gives, every attempt's, oldest first, each with its attempt, time and stream; while the task is
// unfinished, new lines are asked for every second from the last line's seq, until the section
// leaves the page (another task selected, the detail redrawn) or the task is finished.

import {call} from "./api.js";
import {h} from "./dom.js";

const POLL_MS = 1000;
const FINISHED = new Set(["completed", "failed", "cancelled"]);

function lineNode(line) {
  const level = line.level && line.level !== "info" ? ` ${line.level}` : "";
  return h("div", {class: `log-line log-${line.stream}`, "data-testid": "log-line", "data-stream": line.stream},
    h("span", {class: "log-meta"}, `#${line.attempt} ${String(line.at).slice(11, 23)} ${line.stream}${level} `),
    line.text);
}

// A section for `task` (a tasks.get answer) that fills itself in.
export function logsSection(task) {
  const lines = h("div", {class: "log-lines", "data-testid": "log-lines"});
  const state = h("p", {class: "hint", "data-testid": "logs-state"}, "Loading…");
  const section = h("section", {class: "logs", "data-testid": "logs"}, h("h3", {}, "Logs"), state, lines);
  let after = null;

  async function load() {
    for (;;) {  // every page stored so far
      const params = {task_id: task.id};
      if (after !== null) params.after = after;
      const page = await call("tasks.logs", params);
      lines.append(...page.lines.map(lineNode));
      if (page.lines.length) after = page.lines[page.lines.length - 1].seq;
      if (page.next_after === null) return;
    }
  }

  async function follow(finished) {
    try {
      await load();
    } catch (error) {
      state.textContent = `Logs unavailable: ${error.message}`;
      return;
    }
    state.textContent = lines.childElementCount ? "" : "No log lines.";
    state.hidden = lines.childElementCount > 0;
    if (finished || !section.isConnected) return;  // done, or replaced by a newer detail
    setTimeout(async () => {
      if (!section.isConnected) return;
      let now = task;
      try { now = await call("tasks.get", {task_id: task.id}) || task; } catch { /* keep polling */ }
      follow(FINISHED.has(now.status));
    }, POLL_MS);
  }

  follow(FINISHED.has(task.status));
  return section;
}
