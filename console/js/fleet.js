// The fleet: a filter (RQL, as GET /devices?filter= takes it), the declared fields as sortable
// columns, pages by cursor, connectivity badges, a count grouped by any declared field, and a job
// created for what the filter finds (jobs.js).
// The filter and the sort live in the address (#/?filter=…&sort=…), so a view can be shared
// and the browser's back button works.
import {answered, request, settings} from "./api.js";
import {announce, h, pagerControls, replace, time} from "./dom.js";
import {effective, fleetAddress, listingQuery} from "./fleet-query.js";
import {createJobSection} from "./jobs.js";
import {at, fieldSegments, text, visible} from "./json.js";

const LIMITS = [25, 50, 100];

export function fleetView(main, _params, query) {
  const state = {...fleetAddress(query), cursors: [null], page: 0};
  const fields = settings.fleetFields;
  const filterInput = h("input", {id: "filter", name: "filter", type: "search", value: state.filter,
                                  autocomplete: "off", spellcheck: "false", "aria-describedby": "filter-help",
                                  placeholder: "eq(reported/online,false)"});
  const problemBox = h("div", {id: "filter-problem"});
  const note = h("p", {class: "muted", id: "sort-note"});
  const table = h("table", {class: "devices"});
  const pager = h("nav", {"aria-label": "Pages", class: "pager"});
  const countResult = h("div", {id: "count-result", "aria-live": "polite"});
  const groupSelect = h("select", {id: "group-by", name: "groupBy"},
    h("option", {value: ""}, "no grouping"),
    fields.map((field) => h("option", {value: field.path, selected: field.path === state.groupBy}, field.path)));
  const limitSelect = h("select", {id: "limit", name: "limit"},
    [...new Set([...LIMITS, state.limit])].sort((a, b) => a - b).map((limit) =>
      h("option", {value: limit, selected: limit === state.limit}, `${limit} a page`)));
  limitSelect.setAttribute("aria-label", "Devices a page");

  const form = h("form", {role: "search", class: "filter", on: {submit: (event) => {
    event.preventDefault();
    navigate({filter: filterInput.value.trim(), sort: state.sort, limit: limitSelect.value, groupBy: state.groupBy});
  }}},
  h("label", {for: "filter"}, "Filter (RQL)"),
  h("div", {class: "row"}, filterInput, limitSelect, h("button", {type: "submit"}, "Search")),
  h("p", {id: "filter-help", class: "muted"},
    fields.length ? ["Declared fields: ", fields.map((field, index) => [index ? ", " : "", h("code", {}, field.path),
                                                                          ` (${field.type})`])]
      : "No field is declared queryable (FLEET_INDEX): the fleet can be listed, not filtered."),
  problemBox);

  groupSelect.addEventListener("change", () => {
    state.groupBy = groupSelect.value;
    count();
  });
  replace(main,
    h("h1", {}, "Fleet"), form,
    h("section", {"aria-labelledby": "count-heading", class: "panel"},
      h("h2", {id: "count-heading"}, "Count"),
      h("div", {class: "row"}, h("label", {for: "group-by"}, "Group by"), groupSelect),
      countResult),
    createJobSection(state.filter),
    h("section", {"aria-labelledby": "devices-heading"},
      h("h2", {id: "devices-heading"}, "Devices"), note,
      h("div", {class: "table-wrap", tabindex: 0, role: "region", "aria-labelledby": "devices-heading"}, table),
      pager));

  function navigate(next) {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(next)) if (value && !(name === "limit" && Number(value) === 25)) params.set(name, value);
    const hash = `#/${params.toString() ? "?" + params : ""}`;
    if (location.hash === hash || (hash === "#/" && !location.hash)) load();
    else location.hash = hash;
  }

  let loading = 0; // the latest page asked for: an earlier one's late answer is not shown
  async function load() {
    const asked = ++loading;
    for (const button of pager.querySelectorAll("button")) button.disabled = true; // a second click waits for this page
    replace(problemBox);
    filterInput.removeAttribute("aria-invalid");
    const {filter, implied} = effective(state);
    note.textContent = implied ? `Sorted by ${implied}: the devices that hold it (the API sorts what a filter finds).` : "";
    table.setAttribute("aria-busy", "true");
    const answer = await answered(request("GET", "devices", {query: listingQuery(state, state.cursors[state.page])}));
    if (asked !== loading) return;
    table.removeAttribute("aria-busy");
    if (!answer.ok) {
      showProblem(answer.problem, filter === state.filter ? filterInput.value : filter);
      replace(table);
      // refused: nothing to try again; no answer, or a 5xx: the same page asked for again
      replace(pager, answer.status >= 400 && answer.status < 500 ? null
        : h("button", {type: "button", on: {click: () => load()}}, `Try page ${state.page + 1} again`));
      return;
    }
    state.cursors[state.page + 1] = answer.data.nextCursor;
    renderTable(answer.data.items);
    renderPager(answer.data.nextCursor);
    announce(`${answer.data.items.length} devices on page ${state.page + 1}`);
  }

  function showProblem(problem, filterText) {
    const shown = [h("p", {}, h("strong", {}, visible(problem.title || "Refused")), ": ",
                        h("bdi", {}, visible(problem.detail ?? "")))];
    if (Number.isInteger(problem.position) && filterText) {
      const characters = Array.from(filterText); // the service counts characters, not UTF-16 units
      const position = Math.min(problem.position, characters.length);
      shown.push(h("pre", {class: "filter-echo", "aria-label": `The filter, marked at position ${position}`},
        h("bdi", {}, visible(characters.slice(0, position).join("")), h("mark", {}, visible(characters[position] ?? " ")),
          visible(characters.slice(position + 1).join("")))),
      h("p", {class: "muted"}, `at position ${position}`));
      const start = characters.slice(0, position).join("").length;
      filterInput.focus();
      filterInput.setSelectionRange(start, start + (characters[position] ?? "").length);
    }
    if (problem.status === 400) filterInput.setAttribute("aria-invalid", "true"); // the filter's fault, not the network's
    replace(problemBox, h("div", {role: "alert", class: "problem"}, shown));
  }

  function sortButton(field) {
    const direction = state.sort === `+${field.path}` ? "ascending" : state.sort === `-${field.path}` ? "descending" : null;
    const next = direction === "ascending" ? `-${field.path}` : direction === "descending" ? "" : `+${field.path}`;
    return h("th", {scope: "col", "aria-sort": direction || "none"},
      h("button", {type: "button", class: "sort", title: `Sort by ${field.path}`, on: {click: () =>
        navigate({filter: state.filter, sort: next, limit: state.limit, groupBy: state.groupBy})}},
      field.path, h("span", {"aria-hidden": "true"}, direction === "ascending" ? " ▲" : direction === "descending" ? " ▼" : "")));
  }

  function renderTable(items) {
    const head = h("tr", {}, h("th", {scope: "col"}, "Device"), h("th", {scope: "col"}, "Connectivity"),
      fields.map(sortButton), h("th", {scope: "col"}, "Version"), h("th", {scope: "col"}, "Updated"));
    const rows = items.map((device) => h("tr", {},
      h("th", {scope: "row"}, h("a", {href: `#/devices/${encodeURIComponent(device.deviceId)}`}, device.deviceId)),
      h("td", {}, badge(device.connectivity)),
      fields.map((field) => {
        const value = at(device, fieldSegments(field.path));
        return h("td", {class: "value"}, value === undefined ? h("span", {class: "muted"}, "—") : text(value));
      }),
      h("td", {class: "number"}, String(device.version)), h("td", {}, time(device.updatedAt))));
    replace(table, h("caption", {class: "visually-hidden"}, "Devices, page " + (state.page + 1)),
      h("thead", {}, head),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", {colspan: fields.length + 4}, "No device on this page."))));
  }

  function renderPager(nextCursor) {
    replace(pager, pagerControls(state.page, nextCursor, (step) => { state.page += step; load(); }));
  }

  let counting = 0; // the latest count asked for: an earlier one's late answer is not shown
  async function count() {
    const asked = ++counting;
    const filter = state.filter || (state.groupBy ? `exists(${state.groupBy})` : "");
    if (!filter) {
      replace(countResult, h("p", {class: "muted"},
        "Counting needs a filter (the service counts what a filter finds): search with one, or group by a field."));
      return;
    }
    replace(countResult, h("p", {class: "muted"}, "Counting…"));
    const answer = await answered(request("GET", "devices/count", {query: {filter, groupBy: state.groupBy}}));
    if (asked !== counting) return;
    if (!answer.ok) {
      replace(countResult, h("div", {class: "problem"}, h("strong", {}, visible(answer.problem.title || "Refused")), ": ",
                             h("bdi", {}, visible(answer.problem.detail ?? ""))));
      return;
    }
    const {count: total, groups} = answer.data;
    const heading = h("p", {class: "count"}, h("strong", {}, String(total)), ` device${total === 1 ? "" : "s"} match `,
      h("code", {}, h("bdi", {}, visible(filter))));
    if (!groups) return replace(countResult, heading);
    const largest = Math.max(1, ...groups.map((group) => group.count));
    replace(countResult, heading, h("table", {class: "bars"},
      h("caption", {class: "visually-hidden"}, `Devices by ${state.groupBy}`),
      h("thead", {}, h("tr", {}, h("th", {scope: "col"}, state.groupBy), h("th", {scope: "col"}, "Devices"))),
      h("tbody", {}, groups.map((group) => {
        const bar = h("span", {class: "chart-bar", "aria-hidden": "true"});
        bar.style.width = `${(100 * group.count) / largest}%`; // CSSOM, which the style-src policy allows
        return h("tr", {}, h("th", {scope: "row", class: "value"}, group.value === null ? "(none)" : text(group.value)),
                 h("td", {}, h("span", {class: "bar-track"}, bar), h("span", {class: "number"}, String(group.count))));
      }))));
  }

  // The rows first: a count reads every device its filter finds, and sent beside the listing it
  // competes with it for the same server.
  load().finally(count);
  return {leave() {}};
}

/** Online / offline, with since when or when last seen. */
export function badge(connectivity) {
  if (!connectivity) return h("span", {class: "badge unknown"}, "unknown");
  const online = connectivity.connected;
  const when = online ? connectivity.since : connectivity.lastSeen;
  return h("span", {class: "connectivity"},
    h("span", {class: `badge ${online ? "online" : "offline"}`}, online ? "online" : "offline"),
    when ? [" ", h("span", {class: "muted small"}, online ? "since " : "seen ", time(when))]
      : online ? "" : [" ", h("span", {class: "muted small"}, "never seen")]);
}
