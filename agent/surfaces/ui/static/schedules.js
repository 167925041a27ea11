// Schedules (schedules.list): when each runs next and how often it ran, its last run's tree, and
// three actions: run now (schedules.trigger, then the run's tree), enable or disable, and its past
// runs with their durations (schedules.runs, in a row under the schedule's).

import {call} from "./api.js";
import {h} from "./dom.js";
import {tabs} from "./triggers.js";

const rpc = (method, params) => call(method, params, "/tasks");

export async function showSchedules(main, notify, go, current) {
  const schedules = await rpc("schedules.list", {limit: 1000});
  if (!current()) return;
  const body = h("tbody", {}, schedules.map((schedule) => row(schedule, notify, go)));
  main.replaceChildren(h("section", {},
    tabs("tab-schedules"),
    h("h1", {}, "Schedules"),
    schedules.length === 0
      ? h("p", {class: "empty", "data-testid": "no-schedules"}, "No schedules yet: create one with schedules.create.")
      : h("table", {class: "trees", "data-testid": "schedules"},
        h("thead", {}, h("tr", {}, ["schedule", "template", "when", "next run", "last run", "runs", "skipped", ""]
          .map((t) => h("th", {}, t)))),
        body)));
}

function row(schedule, notify, go) {
  const when = schedule.cron ? `cron ${schedule.cron} (${schedule.timezone})` : `every ${schedule.interval_seconds} s`;
  const tree = (id) => id ? h("a", {href: `#/tree/${encodeURIComponent(id)}`}, id) : "—";
  const act = (label, testid, action) => h("button", {type: "button", "data-testid": testid, onclick: async () => {
    try {
      await action();
    } catch (error) {
      notify(error.message || String(error));
    }
  }}, label);
  const line = h("tr", {"data-testid": "schedule-row", "data-schedule-id": schedule.id},
    h("td", {class: "id"}, schedule.id),
    h("td", {}, tree(schedule.task_id)),
    h("td", {}, when),
    h("td", {}, schedule.enabled ? (schedule.next_run_at || "no more runs") : "disabled"),
    h("td", {}, tree(schedule.last_root_task_id)),
    h("td", {}, String(schedule.runs)),
    h("td", {}, String(schedule.skipped ?? 0)),
    h("td", {},
      act("Run now", "trigger", async () => {
        const answer = await rpc("schedules.trigger", {schedule_id: schedule.id});
        go(`#/tree/${encodeURIComponent(answer.root_task_id)}`, [`Schedule ${schedule.id} ran now`, "ok"]);
      }),
      act(schedule.enabled ? "Disable" : "Enable", "toggle", async () => {
        await rpc("schedules.update", {schedule_id: schedule.id, enabled: !schedule.enabled});
        go("#/schedules", [`Schedule ${schedule.id} ${schedule.enabled ? "disabled" : "enabled"}`, "ok"]);
      }),
      act("Past runs", "show-runs", async () => {
        const shown = line.nextElementSibling;
        if (shown && shown.dataset.testid === "schedule-runs") shown.remove();
        else line.after(await pastRuns(schedule.id, tree));
      })));
  return line;
}

const duration = (ms) => (ms === null || ms === undefined ? "running" : `${(ms / 1000).toFixed(3)} s`);

async function pastRuns(scheduleId, tree) {
  const runs = await rpc("schedules.runs", {schedule_id: scheduleId, limit: 50}) || [];
  const table = runs.length === 0
    ? h("p", {class: "empty"}, "No runs yet.")
    : h("table", {class: "runs"},
      h("thead", {}, h("tr", {}, ["run", "status", "started", "duration"].map((t) => h("th", {}, t)))),
      h("tbody", {}, runs.map((run) => h("tr", {"data-testid": "schedule-run", "data-task-id": run.root_task_id},
        h("td", {}, tree(run.root_task_id)), h("td", {}, run.final_status || run.status),
        h("td", {class: "time"}, run.started_at), h("td", {"data-field": "duration"}, duration(run.duration_ms))))));
  return h("tr", {"data-testid": "schedule-runs", "data-schedule-id": scheduleId}, h("td", {colspan: 8}, table));
}
