// Draws a layout (layout.js) as SVG and keeps each task's colour, status and progress bar current.
// Built once into a fragment; a live event then touches only the few nodes of its task.

import {s} from "./dom.js";
import {NODE_H, NODE_W} from "./layout.js";

const MAX_NAME = 30;

export function drawGraph(plan, onSelect) {
  const svg = s("svg", {class: "graph", width: plan.width, height: plan.height, "data-testid": "graph",
                        viewBox: `0 0 ${plan.width} ${plan.height}`});
  svg.append(s("defs", {}, s("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
                                         markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse"},
                                      s("path", {d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead"}))));
  const lines = document.createDocumentFragment();
  for (const [parent, child] of plan.links) {
    const a = plan.pos.get(parent), b = plan.pos.get(child);
    lines.append(s("line", {class: "link", x1: a.x + NODE_W / 2, y1: a.y + NODE_H,
                            x2: b.x + NODE_W / 2, y2: b.y}));
  }
  for (const [from, to, required] of plan.edges) {
    const a = plan.pos.get(from), b = plan.pos.get(to);
    const x1 = a.x + NODE_W, y1 = a.y + NODE_H / 2, x2 = b.x, y2 = b.y + NODE_H / 2;
    const bend = (x2 - x1) / 2;
    lines.append(s("path", {class: required ? "edge" : "edge optional", "marker-end": "url(#arrow)",
                            d: `M ${x1} ${y1} C ${x1 + bend} ${y1}, ${x2 - bend} ${y2}, ${x2} ${y2}`}));
  }
  svg.append(s("g", {class: "lines"}, lines));

  const nodes = new Map();
  const boxes = document.createDocumentFragment();
  for (const id of plan.order) {
    const task = plan.tasks.get(id);
    const {x, y} = plan.pos.get(id);
    const name = task.name.length > MAX_NAME ? `${task.name.slice(0, MAX_NAME - 1)}…` : task.name;
    const bar = s("rect", {class: "bar", x: 0, y: NODE_H - 5, height: 5, width: 0});
    const state = s("text", {class: "state", x: 8, y: 35});
    const group = s("g", {class: "node", transform: `translate(${x} ${y})`, "data-task-id": id, tabindex: 0},
      s("title", {}, `${task.name}\n${id}`),
      s("rect", {class: "box", width: NODE_W, height: NODE_H, rx: 6}),
      bar,
      s("text", {class: "name", x: 8, y: 17}, name),
      state);
    nodes.set(id, {group, bar, state});
    boxes.append(group);
    paint(nodes.get(id), task.status, task.progress, task.waiting);
  }
  svg.append(s("g", {class: "nodes"}, boxes));
  svg.addEventListener("click", (event) => {
    const group = event.target.closest("g.node");
    if (group) onSelect(group.getAttribute("data-task-id"));
  });
  svg.addEventListener("keydown", (event) => {
    const group = event.target.closest("g.node");
    if (group && (event.key === "Enter" || event.key === " ")) onSelect(group.getAttribute("data-task-id"));
  });

  return {
    svg,
    update(id, status, progress, waiting) {
      const node = nodes.get(id);
      if (node) paint(node, status, progress, waiting);
    },
    select(id) {
      for (const [other, node] of nodes) node.group.classList.toggle("selected", other === id);
    },
  };
}

// `waiting`: a parked task's wait (docs/waits.md), said in its state line and data-waiting.
function paint(node, status, progress, waiting) {
  const value = Number.isFinite(progress) ? Math.min(Math.max(progress, 0), 1) : 0;
  node.group.setAttribute("class", `node status-${status}${node.group.classList.contains("selected") ? " selected" : ""}`);
  node.group.setAttribute("data-status", status);
  node.bar.setAttribute("width", String(value * NODE_W));
  const kind = waiting && waiting.kind;
  if (kind) node.group.setAttribute("data-waiting", kind);
  else node.group.removeAttribute("data-waiting");
  node.state.textContent = kind ? `${status} · waits for ${kind}` : `${status} · ${Math.round(value * 100)}%`;
}
