// The layered layout of a tree's dependency graph: pure arithmetic, no DOM (so it is cheap to
// measure and to test). Columns are layers: a task sits one column right of its latest dependency,
// so arrows run left to right in execution order. Inside a column tasks keep the tree's preorder,
// which keeps siblings (children of one parent) next to each other: the parent/child grouping.
// Iterative everywhere: a tree may be as deep as it is large.

export const NODE_W = 210;
export const NODE_H = 46;
const GAP_X = 80;
const GAP_Y = 12;
const PAD = 20;
const MAX_LINKED = 50;

// tree: the nested node of tasks.tree. Returns {tasks, order, pos, edges, links, width, height}.
export function layout(tree) {
  const tasks = new Map();
  const order = [];  // preorder of the parent/child tree
  const stack = [tree];
  while (stack.length) {
    const node = stack.pop();
    tasks.set(node.id, node);
    order.push(node.id);
    const children = node.children || [];
    for (let i = children.length - 1; i >= 0; i--) stack.push(children[i]);
  }

  // Longest-path layering over the dependencies inside this tree (Kahn's algorithm).
  const dependents = new Map(order.map((id) => [id, []]));
  const waiting = new Map();
  const edges = [];  // [dependency id, dependent id, required]
  for (const id of order) {
    let count = 0;
    for (const dep of tasks.get(id).dependencies || []) {
      if (!tasks.has(dep.id)) continue;
      dependents.get(dep.id).push(id);
      edges.push([dep.id, id, dep.required !== false]);
      count++;
    }
    waiting.set(id, count);
  }
  const layer = new Map(order.map((id) => [id, 0]));
  const ready = order.filter((id) => waiting.get(id) === 0);
  for (let i = 0; i < ready.length; i++) {
    const id = ready[i];
    for (const next of dependents.get(id)) {
      layer.set(next, Math.max(layer.get(next), layer.get(id) + 1));
      waiting.set(next, waiting.get(next) - 1);
      if (waiting.get(next) === 0) ready.push(next);
    }
  }

  const columns = [];
  for (const id of order) {
    const column = layer.get(id);
    while (columns.length <= column) columns.push([]);
    columns[column].push(id);
  }
  const pos = new Map();
  let height = 0;
  columns.forEach((ids, column) => {
    ids.forEach((id, row) => {
      pos.set(id, {x: PAD + column * (NODE_W + GAP_X), y: PAD + row * (NODE_H + GAP_Y)});
    });
    height = Math.max(height, ids.length * (NODE_H + GAP_Y));
  });
  // Parent/child links drawn where no dependency already joins the two tasks, for parents of at
  // most MAX_LINKED children: past that the lines hide the graph, and the preorder alone keeps a
  // parent's children together.
  const joined = new Set(edges.map(([a, b]) => `${a}\n${b}`));
  const links = [];
  for (const id of order) {
    const parent = tasks.get(id).parent_id;
    if (parent && tasks.has(parent) && (tasks.get(parent).children || []).length <= MAX_LINKED
        && !joined.has(`${id}\n${parent}`) && !joined.has(`${parent}\n${id}`)) {
      links.push([parent, id]);
    }
  }
  return {
    tasks, order, pos, edges, links,
    width: PAD * 2 + columns.length * (NODE_W + GAP_X) - GAP_X,
    height: PAD * 2 + height,
  };
}
