// Every element the console makes is made here. Device documents are untrusted: they only
// ever go into the page as text (text nodes, attribute values), never parsed as HTML; the
// Content-Security-Policy (no inline script, Trusted Types required) backs this up.

const REFUSED = /^(on|style$|srcdoc$|formaction$)/i;

/** h("a", {href: "#/", class: "x", on: {click: f}}, "text", child, [more]) */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "on") {
      for (const [event, handler] of Object.entries(value)) element.addEventListener(event, handler);
    } else if (name === "class") {
      element.className = value;
    } else if (REFUSED.test(name)) {
      throw new Error(`the console never sets ${name}`);
    } else {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
  return append(element, children);
}

export function append(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : String(child)); // a string is a text node
  }
  return parent;
}

export function replace(parent, ...children) {
  parent.replaceChildren();
  return append(parent, children);
}

/** A date-time as the reader's locale writes it, with the exact UTC value as its title. */
export function time(iso) {
  if (typeof iso !== "string") return h("span", {class: "muted"}, "—");
  const date = new Date(iso);
  const shown = Number.isNaN(date.getTime()) ? iso : date.toLocaleString();
  return h("time", {datetime: iso, title: iso}, shown);
}

let announcer;
/** Says something to screen readers (a polite live region) without moving the focus. */
export function announce(text) {
  announcer ??= document.body.appendChild(h("div", {role: "status", class: "visually-hidden", "aria-live": "polite"}));
  announcer.textContent = text;
}

/** A paged table's Previous and Next buttons around its page number (``page`` from 0). A click
 * disables both and turns the page (``turn(-1)`` or ``turn(1)``), which draws them again: a
 * second click before the next page's cursor came would read the first page under the next
 * one's number. */
export function pagerControls(page, hasNext, turn) {
  const go = (step) => (event) => {
    for (const button of event.currentTarget.parentElement.querySelectorAll("button")) button.disabled = true;
    turn(step);
  };
  return [h("button", {type: "button", disabled: page === 0, on: {click: go(-1)}}, "Previous page"),
    h("span", {class: "muted"}, ` Page ${page + 1} `),
    h("button", {type: "button", disabled: !hasNext, on: {click: go(1)}}, "Next page")];
}
