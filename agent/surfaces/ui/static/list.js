// The tree list: root tasks newest first with their tree's counts by status, a status filter,
// search by name or id, paging; plus creating a tree from pasted JSON and examples.init.

import {call} from "./api.js";
import {h} from "./dom.js";

export const STATUSES = ["pending", "in_progress", "completed", "failed", "cancelled"];
const PAGE = 20;

export async function showList(main, query, notify, go, current) {
  const status = query.get("status") || "";
  const search = query.get("search") || "";
  // Paged by cursor (docs/retention.md): `cursor` starts this page, `trail` holds the cursors that
  // started the pages before it ("~": the first page), so "newer" goes back without an offset.
  const cursor = query.get("cursor") || "";
  const trail = (query.get("trail") || "").split(".").filter(Boolean);
  const params = {root_only: true, limit: PAGE, cursor: cursor || null};
  if (status) params.status = status;
  if (search) params.search = search;

  const link = (changes) => {
    const next = new URLSearchParams({status, search, cursor, trail: trail.join("."), ...changes});
    for (const [key, value] of [...next]) if (!value) next.delete(key);
    return `#/?${next}`;
  };
  const searchBox = h("input", {type: "search", name: "search", value: search, placeholder: "name or id",
                               "aria-label": "Search trees by name or id"});
  const statusBox = h("select", {name: "status", "aria-label": "Filter by status",
                                 onchange: () => go(link({status: statusBox.value, cursor: "", trail: ""}))},
    h("option", {value: ""}, "all statuses"),
    STATUSES.map((name) => h("option", {value: name, selected: name === status}, name)));
  const filters = h("form", {class: "filters", onsubmit: (event) => {
    event.preventDefault();
    go(link({search: searchBox.value.trim(), cursor: "", trail: ""}));
  }}, statusBox, searchBox, h("button", {type: "submit"}, "Search"));

  const body = h("tbody");
  const table = h("table", {class: "trees", "data-testid": "trees"},
    h("thead", {}, h("tr", {}, ["tree", "id", "status", "tasks by status", "created"].map((t) => h("th", {}, t)))),
    body);
  const pager = h("p", {class: "pager"}, "loading…");
  main.replaceChildren(h("section", {}, h("h1", {}, "Trees"), filters, table, pager), createPanel(notify, go));

  const answer = await call("tasks.list", params);
  if (!current()) return;
  const shown = answer.tasks;
  for (const row of shown) {
    body.append(h("tr", {"data-testid": "tree-row", "data-task-id": row.id},
      h("td", {}, h("a", {href: `#/tree/${encodeURIComponent(row.id)}`}, row.name)),
      h("td", {class: "id"}, row.id),
      h("td", {}, h("span", {class: `badge status-${row.status}`}, row.status)),
      h("td", {}, counts(row.status_counts || {})),
      h("td", {class: "time"}, row.created_at || "")));
  }
  if (!shown.length) body.append(h("tr", {}, h("td", {colspan: 5, class: "empty"}, "No trees match.")));
  const previous = trail.length ? trail[trail.length - 1] : null;
  pager.replaceChildren(
    previous !== null
      ? h("a", {href: link({cursor: previous === "~" ? "" : previous, trail: trail.slice(0, -1).join(".")})}, "← newer")
      : "",
    ` page ${trail.length + 1} `,
    answer.next_cursor
      ? h("a", {href: link({cursor: answer.next_cursor, trail: [...trail, cursor || "~"].join(".")})}, "older →")
      : "");
}

export function counts(byStatus) {
  return h("span", {class: "counts"}, STATUSES.filter((name) => byStatus[name])
    .map((name) => h("span", {class: `badge status-${name}`, title: name}, `${byStatus[name]} ${name}`)));
}

function createPanel(notify, go) {
  const text = h("textarea", {rows: 8, "aria-label": "Tree JSON", "data-testid": "create-json",
                              placeholder: '[{"id": "root", "name": "root", "schemas": {"method": "noop_executor"}}]'});
  const create = async () => {
    let tasks;
    try {
      tasks = JSON.parse(text.value);
    } catch (error) {
      notify(`Not JSON: ${error.message}`);
      return;
    }
    // The tasks array, one task, or tasks.create's whole params ({"tasks": [...]}).
    const list = Array.isArray(tasks) ? tasks : Array.isArray(tasks && tasks.tasks) ? tasks.tasks : [tasks];
    const root = list.find((task) => task && typeof task === "object" && !task.parent_id);
    if (!root) {
      notify("The tree needs one task without a parent_id (its root).");
      return;
    }
    if (!root.id) root.id = newId();  // known before the reply, so the page can follow the run
    // tasks.create answers once the tree has run; the tree page follows it live meanwhile.
    const reply = call("tasks.create", {tasks: list});
    reply.catch((error) => notify(`Create failed: ${error.message}`));
    if (await stored(root.id, reply)) go(`#/tree/${encodeURIComponent(root.id)}`);
  };
  const init = async () => {
    try {
      const answer = await call("examples.init", {});
      go(`#/?r=${Date.now()}`, [answer.message || `${answer.created_count} example tasks created`, "info"]);
    } catch (error) {
      notify(`examples.init failed: ${error.message}`);
    }
  };
  return h("section", {class: "create"},
    h("h2", {}, "Create a tree"),
    h("p", {}, "Paste the tasks (the JSON of tasks.create's ", h("code", {}, "tasks"), ") and run them."),
    text,
    h("p", {}, h("button", {onclick: create, "data-testid": "create"}, "Create and run"), " ",
      h("button", {onclick: init, "data-testid": "examples-init"}, "Load the examples (examples.init)")));
}

// Wait until the tree is stored (the create's transaction committed), or its reply came back.
async function stored(rootId, reply) {
  let answered = false;
  reply.then(() => { answered = true; }, () => { answered = true; });
  for (let i = 0; i < 100; i++) {
    try {
      if (await call("tasks.get", {task_id: rootId})) return true;
    } catch { /* reported by the reply */ }
    if (answered) return reply.then(() => true, () => false);
    await new Promise((resolve) => setTimeout(resolve, 150));
  }
  return false;
}

function newId() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  bytes[6] = (bytes[6] & 0x0f) | 0x40;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const hex = [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
