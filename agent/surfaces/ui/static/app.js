// The dashboard's entry: routes (#/ the tree list, #/tree/<id> a tree, #/waiting, #/agents, #/schedules, #/usage, #/system
// executors and health), the token field and the message line. Small ES modules loaded by the browser as they
// are: no bundler, no build step, nothing fetched from outside the service.

import {AuthError, call, setToken, token} from "./api.js";
import {showAgents} from "./agents.js";
import {h} from "./dom.js";
import {showList} from "./list.js";
import {showSchedules} from "./schedules.js";
import {showTriggers} from "./triggers.js";
import {showTree} from "./tree.js";
import {showUsage} from "./usage.js";
import {showWaiting} from "./waiting.js";

const main = document.getElementById("main");
const notice = document.getElementById("notice");
const tokenBox = document.getElementById("token");
let leave = null;
let generation = 0;  // one per route change: a view whose route has gone stops drawing

function notify(text, kind = "error") {
  notice.hidden = !text;
  notice.className = `notice ${kind}`;
  notice.textContent = text || "";
}

function explain(error) {
  if (error instanceof AuthError) {
    const detail = error.message ? ` (the service said: ${error.message})` : "";
    notify(token()
      ? `The service refused the token${detail}. Paste a valid token into the Token field above.`
      : `This service requires a token: paste a JWT into the Token field above (for example one made by "taskgrove token USER")${detail}.`,
    "auth");
    main.replaceChildren(h("p", {class: "empty", "data-testid": "auth-needed"}, "Sign in with a token to see the tasks."));
  } else {
    notify(error.message || String(error));
  }
}

// Navigate; `message` ([text, kind]) is shown on the page it opens.
let carried = null;
function go(hash, message = null) {
  carried = message;
  if (location.hash === hash) route();
  else location.hash = hash;
}

async function route() {
  if (leave) leave();
  leave = null;
  notify(...(carried || [""]));
  carried = null;
  delete document.body.dataset.renderMs;  // set again by a tree page once drawn
  const mine = ++generation;
  const current = () => mine === generation;
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, search = ""] = hash.split("?");
  try {
    if (path.startsWith("/tree/")) {
      const stop = await showTree(main, decodeURIComponent(path.slice("/tree/".length)), notify, go, current);
      if (current()) leave = stop;
      else if (stop) stop();
    } else if (path === "/system") {
      await showSystem(current);
    } else if (path === "/usage") {
      await showUsage(main, new URLSearchParams(search), go, current);
    } else if (path === "/waiting") {
      await showWaiting(main, notify, current);
    } else if (path === "/agents") {
      await showAgents(main, new URLSearchParams(search), notify, go, current);
    } else if (path === "/schedules") {
      await showSchedules(main, notify, go, current);
    } else if (path === "/triggers") {
      await showTriggers(main, notify, go, current);
    } else {
      await showList(main, new URLSearchParams(search), notify, go, current);
    }
  } catch (error) {
    if (current()) explain(error);
  }
}

async function showSystem(current) {
  const [health, executors] = await Promise.all([call("system.health"), call("system.executors")]);
  if (!current()) return;
  main.replaceChildren(h("section", {},
    h("h1", {}, "Service"),
    h("dl", {}, ["status", "message", "version", "running_tasks_count", "timestamp"].flatMap((key) =>
      [h("dt", {}, key), h("dd", {}, String(health[key] ?? "—"))])),
    h("h2", {}, `Executors (${executors.count}${executors.restricted ? ", restricted by SERVICE_EXTENSIONS" : ""})`),
    h("table", {class: "executors", "data-testid": "executors"},
      h("thead", {}, h("tr", {}, ["id", "extension", "description"].map((t) => h("th", {}, t)))),
      h("tbody", {}, executors.executors.map((e) =>
        h("tr", {}, h("td", {class: "id"}, e.id), h("td", {}, e.extension), h("td", {}, e.description)))))));
}

async function showHealth() {
  const badge = document.getElementById("health");
  try {
    const health = await call("system.health");
    badge.replaceChildren(h("a", {href: "#/system", class: `health-${health.status}`},
      `${health.status} · v${health.version} · ${health.running_tasks_count} running`));
  } catch (error) {
    badge.textContent = `unreachable: ${error.message}`;
  }
}

tokenBox.value = token();
document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setToken(tokenBox.value.trim());
  route();
});
document.getElementById("token-clear").addEventListener("click", () => {
  tokenBox.value = "";
  setToken("");
  route();
});
window.addEventListener("hashchange", route);
showHealth();
route();
