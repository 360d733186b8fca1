// Pages by the address's fragment: #/ (the fleet), #/devices/{id}, and whatever else registers.
// A view is view(main, params, query) -> {leave()}: leave() stops what it runs (a live follower).
import {h, replace} from "./dom.js";

const routes = [];
let current = null;

/** route("/devices/:id", view, {nav: "Devices"}): a page; with nav, a link in the header. */
export function route(pattern, view, {nav} = {}) {
  const names = [];
  const expression = new RegExp("^" + pattern.replace(/:(\w+)/g, (_, name) => {
    names.push(name);
    return "([^/]+)";
  }) + "$");
  routes.push({pattern, expression, names, view, nav});
}

export function start(main, navList) {
  replace(navList, routes.filter((entry) => entry.nav).map((entry) =>
    h("li", {}, h("a", {href: `#${entry.pattern}`, "data-route": entry.pattern}, entry.nav))));
  window.addEventListener("hashchange", () => show(main, navList));
  show(main, navList);
}

function show(main, navList) {
  const hash = location.hash || "#/";
  if (!hash.startsWith("#/")) return; // an in-page anchor (the skip link), not a page
  const [where, search = ""] = hash.slice(1).split("?");
  const found = routes.map((entry) => [entry, entry.expression.exec(where)]).find(([, match]) => match);
  current?.leave?.();
  current = null;
  for (const link of navList.querySelectorAll("a")) {
    if (link.dataset.route === found?.[0].pattern) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (!found) {
    replace(main, h("h1", {}, "Not found"), h("p", {}, h("a", {href: "#/"}, "Back to the fleet")));
    return;
  }
  const [entry, match] = found;
  let params;
  try {
    params = Object.fromEntries(entry.names.map((name, index) => [name, decodeURIComponent(match[index + 1])]));
  } catch {
    replace(main, h("h1", {}, "Not found"), h("p", {}, "The address is not well formed."));
    return;
  }
  current = entry.view(main, params, new URLSearchParams(search));
}
