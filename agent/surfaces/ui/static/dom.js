// Building DOM nodes without HTML strings: every value is set as text or as an attribute, never
// parsed as markup, so task names, results and errors (user data) cannot inject anything.

const SVG = "http://www.w3.org/2000/svg";

// h("div", {class: "x", onclick: f}, "text", child, ...): an element; strings become text nodes.
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  return fill(node, attrs, children);
}

// The same for SVG elements (the graph).
export function s(tag, attrs = {}, ...children) {
  return fill(document.createElementNS(SVG, tag), attrs, children);
}

function fill(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// A JSON value for reading: pretty-printed text in a <pre> (textContent, not markup).
export function json(value) {
  return h("pre", {class: "json"}, value === undefined ? "" : JSON.stringify(value, null, 2));
}

export function clear(node) {
  node.replaceChildren();
  return node;
}
