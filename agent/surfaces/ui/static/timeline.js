// The timeline of a tree page (docs/observability.md, "Timeline"): one row per task, one bar per
// attempt (tasks.attempts with `tree`) on a shared time axis. A bar shows the time the attempt was
// queued (runnable, not started) and the time it ran, coloured by its outcome; the pause after an
// attempt that parked on a wait, or after one that failed and is retried later, is drawn as its own
// segment. The slowest path (the chain of dependencies whose tasks took the longest in sum) is
// highlighted. Also the attempts table of the task detail (`attemptsTable`).

import {call} from "./api.js";
import {h} from "./dom.js";

const REFRESH_MS = 400;  // live events redraw the timeline at most this often

const stamp = (text) => (text ? Date.parse(text) : NaN);
const ms = (value) => (value === null || value === undefined ? "—" : `${Math.round(value)} ms`);

// plan: layout.js's plan of the tree (tasks, order, edges). Returns {node, refresh}.
export function timeline(rootId, plan, onSelect) {
  const body = h("div", {class: "timeline-rows"});
  const caption = h("p", {class: "timeline-caption", "data-testid": "slowest-path"});
  const node = h("section", {class: "timeline", "data-testid": "timeline"},
    h("h2", {}, "Timeline"), caption, body);
  let timer = null;

  async function draw() {
    const attempts = await call("tasks.attempts", {task_id: rootId, tree: true});
    const byTask = new Map(plan.order.map((id) => [id, []]));
    for (const attempt of attempts) if (byTask.has(attempt.task_id)) byTask.get(attempt.task_id).push(attempt);
    const now = Date.now();
    const parts = new Map(plan.order.map((id) => [id, spans(byTask.get(id), now)]));
    const axis = bounds([...parts.values()].flat(), now);
    const slowest = slowestPath(plan, byTask, now);
    const onPath = new Set(slowest.path);
    body.replaceChildren(...plan.order.map((id) => row(plan.tasks.get(id), parts.get(id), axis,
      onPath.has(id), onSelect)));
    caption.replaceChildren(slowest.path.length
      ? `Slowest path (${ms(slowest.total)}): ${slowest.path.map((id) => plan.tasks.get(id).name).join(" → ")}`
      : "No attempt yet.");
    caption.dataset.path = slowest.path.join(" ");
  }

  return {
    node,
    ready: draw().catch((error) => caption.replaceChildren(`Timeline unavailable: ${error.message}`)),
    refresh() {  // after a live event: redrawn once the burst is over
      if (!timer) timer = setTimeout(() => { timer = null; draw().catch(() => {}); }, REFRESH_MS);
    },
  };
}

// The axis: from the earliest span drawn to the latest end (now, for what still runs or waits).
function bounds(parts, now) {
  let start = Infinity, end = -Infinity;
  for (const part of parts) {
    if (Number.isFinite(part.from)) start = Math.min(start, part.from);
    if (Number.isFinite(part.to)) end = Math.max(end, part.to);
  }
  if (!Number.isFinite(start)) start = end = now;
  return {start, span: Math.max(end - start, 1)};
}

// The spans of one task's attempts, in time order: [{kind, from, to, attempt}].
function spans(attempts, now) {
  const out = [];
  attempts.forEach((a, i) => {
    const started = stamp(a.started_at), ended = Number.isFinite(stamp(a.ended_at)) ? stamp(a.ended_at) : now;
    const queued = stamp(a.queued_at);
    if (Number.isFinite(queued) && queued < started) out.push({kind: "queued", from: queued, to: started, a});
    out.push({kind: a.outcome, from: started, to: ended, a});
    if (a.outcome === "waiting" || a.outcome === "retry") {  // until the next attempt was runnable
      const next = attempts[i + 1];
      const until = next ? stamp(next.queued_at) || stamp(next.started_at) : now;
      out.push({kind: a.outcome === "waiting" ? "wait" : "retry-delay", from: ended, to: until, a});
    }
  });
  return out;
}

// How long a task took: from its first attempt's queueing to its last attempt's end (retries
// and waits included).
function taken(attempts, now) {
  if (!attempts.length) return 0;
  const first = attempts[0], last = attempts[attempts.length - 1];
  const from = stamp(first.queued_at) || stamp(first.started_at);
  const to = last.ended_at && last.outcome !== "waiting" ? stamp(last.ended_at) : now;
  return Number.isFinite(from) && Number.isFinite(to) ? Math.max(0, to - from) : 0;
}

// The chain of dependencies with the largest summed durations (the longest path of the graph,
// each task weighted by `taken`), in execution order.
export function slowestPath(plan, byTask, now) {
  const weight = new Map(plan.order.map((id) => [id, taken(byTask.get(id) || [], now)]));
  const deps = new Map(plan.order.map((id) => [id, []]));
  const dependents = new Map(plan.order.map((id) => [id, 0]));
  for (const [from, to] of plan.edges) { deps.get(to).push(from); dependents.set(from, dependents.get(from) + 1); }
  const best = new Map(), via = new Map();
  const visit = (root) => {  // iterative post-order: a tree may be deep
    const stack = [[root, false]];
    while (stack.length) {
      const [id, expanded] = stack.pop();
      if (best.has(id)) continue;
      if (!expanded) {
        stack.push([id, true]);
        for (const dep of deps.get(id)) if (!best.has(dep)) stack.push([dep, false]);
        continue;
      }
      let top = 0, from = null;
      for (const dep of deps.get(id)) if (best.has(dep) && best.get(dep) > top) { top = best.get(dep); from = dep; }
      best.set(id, top + weight.get(id));
      via.set(id, from);
    }
  };
  // A chain reaching `end` through `via` extends it: on a tie it wins, so a task that took 0 ms
  // (an instant aggregation at the root) still ends the path it closes.
  const extendsChain = (id, end) => { for (let at = via.get(id); at; at = via.get(at)) if (at === end) return true; return false; };
  let end = null;
  for (const id of plan.order) {
    visit(id);
    if (!(byTask.get(id) || []).length) continue;  // never attempted: not on the path yet
    if (end === null || best.get(id) > best.get(end) || (best.get(id) === best.get(end) && extendsChain(id, end))) end = id;
  }
  const path = [];
  for (let id = end; id !== null && id !== undefined; id = via.get(id)) path.unshift(id);
  return {path, total: end === null ? 0 : best.get(end)};
}

function row(task, parts, axis, slow, onSelect) {
  const track = h("div", {class: "track"});
  for (const part of parts) {
    const seconds = ((part.to - part.from) / 1000).toFixed(3);
    const segment = h("span", {class: `segment ${part.kind}`,
      "data-testid": part.kind === part.a.outcome ? "attempt-bar" : "attempt-gap",
      "data-kind": part.kind, "data-attempt": part.a.attempt, "data-task-id": task.id,
      title: `${task.name}: attempt ${part.a.attempt}, ${part.kind} ${seconds} s`});
    // Through the CSSOM: the page's CSP (style-src 'self') refuses style attributes.
    segment.style.left = `${((part.from - axis.start) / axis.span) * 100}%`;
    segment.style.width = `${Math.max(((part.to - part.from) / axis.span) * 100, 0.3)}%`;
    track.append(segment);
  }
  return h("div", {class: slow ? "timeline-row slowest" : "timeline-row", "data-testid": "timeline-row",
    "data-task-id": task.id, "data-slowest": slow ? "true" : null, onclick: () => onSelect(task.id)},
  h("span", {class: "label", title: task.id}, task.name), track);
}

// The task detail's attempts: one line each, with its durations (tasks.attempts).
export async function attemptsTable(taskId) {
  const attempts = await call("tasks.attempts", {task_id: taskId});
  if (!attempts.length) return h("p", {class: "hint", "data-testid": "attempts"}, "No attempt yet.");
  return h("table", {class: "attempts", "data-testid": "attempts"},
    h("thead", {}, h("tr", {}, ["attempt", "outcome", "queued", "ran", "started"].map((t) => h("th", {}, t)))),
    h("tbody", {}, attempts.map((a) => h("tr", {"data-outcome": a.outcome},
      h("td", {}, String(a.attempt)), h("td", {}, a.outcome), h("td", {"data-field": "queued_ms"}, ms(a.queued_ms)),
      h("td", {"data-field": "ran_ms"}, ms(a.ran_ms)), h("td", {class: "time"}, a.started_at || "—")))));
}
