// A tiny DOM builder: h("div", {class: "x", onclick: f}, child, "text", [more]).

const SVG_NS = "http://www.w3.org/2000/svg";

function build(el, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "value" && "value" in el) el.value = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** An HTML element. */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element. */
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

/**
 * Replace the children of `container` with `build()`'s result, only when `signature` (any
 * JSON-able value) differs from the last one rendered there: polling every 0.5 s then leaves
 * an unchanged section alone (no flicker, focus and hover kept).
 */
const rendered = new WeakMap();

export function renderIfChanged(container, signature, build) {
  const key = JSON.stringify(signature);
  if (rendered.get(container) === key) return false;
  container.replaceChildren(...[build()].flat());
  rendered.set(container, key);
  return true;
}

/** Forget what was rendered in `container` (the next renderIfChanged builds again). */
export function forget(container) {
  rendered.delete(container);
}
