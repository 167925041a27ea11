// The Triggers tab of the schedules page (docs/triggers.md): each trigger (triggers.list) with its
// event, key, policy and counters, two actions: enable or disable (triggers.update), and its runs
// with their status and why a trigger cancelled them (triggers.runs, in a row under the trigger's).

import {call} from "./api.js";
import {h} from "./dom.js";

const rpc = (method, params) => call(method, params, "/tasks");

// The tabs of the schedules page: schedules (#/schedules) and triggers (#/triggers).
export function tabs(active) {
  const tab = (label, href, testid) => h("a", {href, "data-testid": testid,
    class: active === testid ? "tab active" : "tab"}, label);
  return h("nav", {class: "tabs"}, tab("On a clock", "#/schedules", "tab-schedules"), " ",
    tab("On events (triggers)", "#/triggers", "tab-triggers"));
}

export async function showTriggers(main, notify, go, current) {
  const triggers = await rpc("triggers.list", {limit: 1000});
  if (!current()) return;
  main.replaceChildren(h("section", {},
    tabs("tab-triggers"),
    h("h1", {}, "Triggers"),
    triggers.length === 0
      ? h("p", {class: "empty", "data-testid": "no-triggers"}, "No triggers yet: create one with triggers.create.")
      : h("table", {class: "trees", "data-testid": "triggers"},
        h("thead", {}, h("tr", {}, ["trigger", "template", "event", "key", "policy", "matched", "runs", "skipped",
          "cancelled", ""].map((t) => h("th", {}, t)))),
        h("tbody", {}, triggers.map((trigger) => row(trigger, notify, go))))));
}

function policy(trigger) {
  const parts = [];
  if (trigger.debounce) parts.push(`debounce ${trigger.debounce.seconds} s`);
  if (trigger.batch) parts.push(`batch ${trigger.batch.size} / ${trigger.batch.seconds} s`);
  if (trigger.singleton) parts.push(`singleton ${trigger.singleton}`);
  if (trigger.cancel_on) parts.push(`cancel on ${trigger.cancel_on}`);
  return parts.join(", ") || "every event";
}

function row(trigger, notify, go) {
  const tree = (id) => id ? h("a", {href: `#/tree/${encodeURIComponent(id)}`}, id) : "—";
  const act = (label, testid, action) => h("button", {type: "button", "data-testid": testid, onclick: async () => {
    try {
      await action();
    } catch (error) {
      notify(error.message || String(error));
    }
  }}, label);
  const line = h("tr", {"data-testid": "trigger-row", "data-trigger-id": trigger.id},
    h("td", {class: "id"}, trigger.id),
    h("td", {}, tree(trigger.task_id)),
    h("td", {}, trigger.enabled ? trigger.event : `${trigger.event} (disabled)`),
    h("td", {}, trigger.key || "—"),
    h("td", {"data-field": "policy"}, policy(trigger)),
    h("td", {}, String(trigger.matched)),
    h("td", {"data-field": "runs"}, String(trigger.runs)),
    h("td", {}, String(trigger.skipped)),
    h("td", {}, String(trigger.cancelled)),
    h("td", {},
      act(trigger.enabled ? "Disable" : "Enable", "toggle", async () => {
        await rpc("triggers.update", {trigger_id: trigger.id, enabled: !trigger.enabled});
        go("#/triggers", [`Trigger ${trigger.id} ${trigger.enabled ? "disabled" : "enabled"}`, "ok"]);
      }),
      act("Runs", "show-runs", async () => {
        const shown = line.nextElementSibling;
        if (shown && shown.dataset.testid === "trigger-runs") shown.remove();
        else line.after(await runsOf(trigger.id, tree));
      })));
  return line;
}

async function runsOf(triggerId, tree) {
  const runs = await rpc("triggers.runs", {trigger_id: triggerId, limit: 50}) || [];
  const table = runs.length === 0
    ? h("p", {class: "empty"}, "No runs yet.")
    : h("table", {class: "runs"},
      h("thead", {}, h("tr", {}, ["run", "key", "events", "status", "started", "why cancelled"]
        .map((t) => h("th", {}, t)))),
      h("tbody", {}, runs.map((run) => h("tr", {"data-testid": "trigger-run", "data-task-id": run.root_task_id},
        h("td", {}, tree(run.root_task_id)), h("td", {}, run.key || "—"), h("td", {}, String(run.events)),
        h("td", {"data-field": "status"}, run.status || run.final_status || "—"),
        h("td", {class: "time"}, run.started_at), h("td", {"data-field": "reason"}, run.cancel_reason || "")))));
  return h("tr", {"data-testid": "trigger-runs", "data-trigger-id": triggerId}, h("td", {colspan: 10}, table));
}
