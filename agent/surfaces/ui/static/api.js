// The service's own public interface, as every other client uses it: JSON-RPC on /tasks and
// /system, live events on /ws. The token (JWT on) is kept in sessionStorage, so it lives as long as
// the browser tab and is sent with every call.

const KEY = "taskgrove.token";

export class AuthError extends Error {}
export class RpcError extends Error {
  constructor(error) {
    super(error.data && typeof error.data === "string" ? error.data : error.message);
    this.code = error.code;
  }
}

export function token() {
  return sessionStorage.getItem(KEY) || "";
}

export function setToken(value) {
  if (value) {
    sessionStorage.setItem(KEY, value);
  } else {
    sessionStorage.removeItem(KEY);
    document.cookie = "Authorization=; path=/ws; max-age=0; SameSite=Strict";  // see watch()
  }
}

let nextId = 1;

// One JSON-RPC call; throws AuthError on HTTP 401, RpcError on a JSON-RPC error.
export async function call(method, params = {}, path = method.startsWith("tasks.") ? "/tasks" : "/system") {
  const headers = {"Content-Type": "application/json"};
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const response = await fetch(path, {
    method: "POST", headers, credentials: "omit",
    body: JSON.stringify({jsonrpc: "2.0", id: nextId++, method, params}),
  });
  if (response.status === 401) {
    let detail = "";
    try { detail = (await response.json()).error.message; } catch { /* not JSON */ }
    throw new AuthError(detail || "The service refused the request (HTTP 401)");
  }
  const answer = await response.json();
  if (answer.error) throw new RpcError(answer.error);
  return answer.result;
}

// Live events of `ids` over /ws: onEvent(message) for each, onClose() when the connection ends.
// A browser cannot set headers on a WebSocket, and /ws also reads the token from a cookie named
// Authorization: the cookie is set for the /ws path only (no other request carries it), strict
// same-site, and for this browser session only. One connection watches at most 1000 tasks (the
// service's limit), so a larger tree opens one connection per thousand.
export function watch(ids, onEvent, onClose) {
  const secure = location.protocol === "https:";
  const t = token();
  document.cookie = t
    ? `Authorization=${encodeURIComponent(t)}; path=/ws; SameSite=Strict${secure ? "; Secure" : ""}`
    : "Authorization=; path=/ws; max-age=0; SameSite=Strict";
  const url = `${secure ? "wss" : "ws"}://${location.host}/ws`;
  const sockets = [];
  let closed = false;  // closed by the page (leaving the tree), not by the service
  for (let start = 0; start < ids.length; start += 1000) {
    const chunk = ids.slice(start, start + 1000);
    const socket = new WebSocket(url);
    socket.addEventListener("open", () => {
      for (const id of chunk) socket.send(JSON.stringify({action: "subscribe", task_id: id}));
    });
    socket.addEventListener("message", (frame) => onEvent(JSON.parse(frame.data)));
    socket.addEventListener("close", () => { if (!closed) onClose(); });
    sockets.push(socket);
  }
  return {
    close() { closed = true; for (const socket of sockets) socket.close(); },
    ready: Promise.all(sockets.map((socket) => new Promise((resolve) => {
      if (socket.readyState === WebSocket.OPEN) resolve();
      socket.addEventListener("open", resolve);
      socket.addEventListener("close", resolve);
    }))),
  };
}
