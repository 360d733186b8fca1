// A device: state, desired, reported and delta side by side, each desired leaf with its version,
// ack, expiry and confirmation; connectivity; live over the WebSocket; desired edited as a merge
// patch under If-Match, sent again on a later version while desired stays as the edit found it (a
// 412 after desired changed shows what changed and offers to apply again); the change feed as
// a timeline, and the difference between any two versions.
import {answered, outcomeUnknown, path, request, settings} from "./api.js";
import {announce, h, replace, time} from "./dom.js";
import {badge} from "./fleet.js";
import {diff, isObject, leaves, parse, text, visible} from "./json.js";
import {Follower} from "./live.js";

const SECTIONS = ["state", "desired", "reported", "delta"];
const HISTORY_PAGE = 20;
const CONNECTIVITY_MS = 30e3;
const SENDS_WHILE_DESIRED_STAYS = 5;  // an edit's sends, each on the version a write of reported or state made

/** What a desired edit guards: each desired leaf's value and the version of the write that set it
 *  (a desire set again to the same value is another), not its acks or confirmations. */
function desires(device) {
  const set = new Map([...leaves(device.metadata?.desired || {})].filter(([leaf]) => leaf.endsWith("/version"))
    .map(([leaf, version]) => [leaf.slice(0, -"/version".length), text(version)]));
  return JSON.stringify([...leaves(device.desired || {})].map(([leaf, value]) => [leaf, text(value), set.get(leaf) ?? null])
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

export function deviceView(main, {id}) {
  const route = `devices/${path(id)}`;
  const view = {device: null, missing: false, editBase: null, editDesires: null, editing: 0, changes: new Map(), oldest: null, follower: null,
                reading: null, readAgain: false, left: false};
  const head = h("div", {class: "device-head"});
  const panes = h("div", {class: "panes"});
  const cleared = h("div", {id: "cleared"});
  const editor = editorSection();
  const history = historySection();
  replace(main, h("p", {}, h("a", {href: "#/"}, "← Fleet")), head, panes, cleared, editor.section, history.section);

  /** The device as it is now (one read at a time; a change during a read asks for one more). */
  async function read() {
    if (view.reading) {
      view.readAgain = true;
      return view.reading;
    }
    view.reading = (async () => {
      do {
        view.readAgain = false;
        const answer = await answered(request("GET", route, {query: {include: "metadata"}}));
        if (view.left) return;
        if (answer.ok) {
          view.device = answer.data;
          view.missing = false;
        } else if (answer.status === 404) {
          view.missing = true;
        } else {
          renderProblem(panes, answer.problem);
          continue;
        }
        render();
      } while (view.readAgain);
    })().finally(() => { view.reading = null; });
    return view.reading;
  }

  function render() {
    const device = view.device;
    if (view.missing) {
      replace(head, h("h1", {}, id), h("p", {class: "problem", role: "status"},
        device ? `Deleted (it was at version ${device.version}).` : "No such device."));
      replace(panes);
      return;
    }
    replace(head,
      h("h1", {}, device.deviceId),
      h("dl", {class: "facts"},
        h("dt", {}, "Version"), h("dd", {id: "version"}, String(device.version)),
        h("dt", {}, "Connectivity"), h("dd", {}, badge(device.connectivity)),
        h("dt", {}, "Updated"), h("dd", {}, time(device.updatedAt)),
        h("dt", {}, "Live"), h("dd", {}, liveBadge)));
    replace(panes, SECTIONS.map((section) => h("section", {class: "pane", "aria-labelledby": `${section}-heading`},
      h("h2", {id: `${section}-heading`}, section),
      h("div", {class: "document", id: `${section}-document`, tabindex: 0, role: "region", "aria-label": `${section} document`},
        tree(device[section], section === "desired" || section === "reported" ? device.metadata?.[section] : undefined,
             section)))));
    renderCleared(device.metadata?.desired);
    editor.deviceMoved(device.version);
  }

  function renderCleared(meta) {
    const found = [];
    (function walk(node, pointer) {
      if (!isObject(node)) return;
      if (typeof node.version === "number" && node.cleared) found.push([pointer, node]);
      else for (const [name, child] of Object.entries(node)) walk(child, `${pointer}/${name.replaceAll("~", "~0").replaceAll("/", "~1")}`);
    })(meta, "");
    replace(cleared, found.length ? h("section", {class: "panel", "aria-labelledby": "cleared-heading"},
      h("h2", {id: "cleared-heading"}, "Desires cleared on confirm"),
      h("ul", {}, found.map(([pointer, entry]) => h("li", {}, h("code", {}, h("bdi", {}, visible(pointer))),
        ` set at version ${entry.version}, confirmed at version ${entry.confirmedVersion}, cleared`)))) : "");
  }

  // --- live ---
  const liveBadge = h("span", {class: "badge offline", id: "live"}, "connecting");
  function liveStatus(status, detail) {
    liveBadge.className = `badge ${status === "live" ? "online" : "offline"}`;
    liveBadge.textContent = status === "live" ? "live" : status === "connecting" ? "connecting" : "reconnecting";
    liveBadge.title = detail || "";
  }

  function changed(change) {
    history.add(change);
    read().then(() => announce(`Version ${change.version}: ${change.kind}`));
  }

  // --- history ---
  function historySection() {
    const list = h("ol", {class: "timeline", reversed: true, id: "timeline"});
    const earlier = h("button", {type: "button", on: {click: () => loadHistory()}}, "Load earlier changes");
    const from = h("input", {id: "compare-from", type: "number", min: 1, inputmode: "numeric", required: true});
    const to = h("input", {id: "compare-to", type: "number", min: 1, inputmode: "numeric", required: true});
    const result = h("div", {id: "compare-result", "aria-live": "polite"});
    const problem = h("div", {id: "history-problem"});
    let chosen = false; // once the reader picks versions, new changes leave them be
    for (const input of [from, to]) input.addEventListener("input", () => { chosen = true; });
    // ... and from the moment one is focused: a value set between the reader's select and typing
    // would take what they type as appended ("1" typed over a "1" set then read as version 11).
    const choosing = () => document.activeElement === from || document.activeElement === to;
    const section = h("section", {class: "panel", "aria-labelledby": "history-heading"},
      h("h2", {id: "history-heading"}, "History"),
      h("form", {class: "row compare", on: {submit: (event) => { event.preventDefault(); compare(); }}},
        h("label", {for: "compare-from"}, "Compare version"), from,
        h("label", {for: "compare-to"}, "with version"), to, h("button", {type: "submit"}, "Compare")),
      result, problem, list, earlier);

    function add(change) {
      if (view.changes.has(change.version)) return;
      view.changes.set(change.version, change);
      view.oldest = Math.min(view.oldest ?? change.version, change.version);
      const item = h("li", {value: change.version, class: "change"},
        h("span", {class: "change-head"}, h("strong", {}, `version ${change.version}`), ` ${change.kind} `,
          h("span", {class: "muted"}, (change.sections || []).join(", ")), " ", time(change.updatedAt)),
        ops(change));
      const after = [...list.children].find((other) => Number(other.value) < change.version);
      list.insertBefore(item, after || null);
      if (!chosen && !choosing() && (!to.value || Number(to.value) < change.version)) {
        to.value = change.version;
        from.value = Math.max(1, change.version - 1);
      }
    }

    function ops(change) {  // each path, value and reason isolated: none reorders what is drawn beside it
      const entries = [...(change.patch || []).map((op) => [`${op.op} `, h("bdi", {}, visible(op.path)),
                                                            "value" in op ? [" = ", h("bdi", {}, text(op.value))] : ""]),
                       ...(change.acks || []).map((ack) => ["ack ", h("bdi", {}, visible(ack.path)), ` ${ack.code}`,
                                                            ack.reason ? [" ", h("bdi", {}, visible(ack.reason))] : ""])];
      if (change.tooLarge) entries.push("too large to show: compare the versions");
      return entries.length ? h("ul", {class: "ops"}, entries.slice(0, 20).map((entry) => h("li", {}, h("code", {}, entry))),
        entries.length > 20 ? h("li", {class: "muted"}, `… ${entries.length - 20} more`) : "") : "";
    }

    async function compare() {
      const [a, b] = [Number(from.value), Number(to.value)];
      replace(result, h("p", {class: "muted"}, "Reading both versions…"));
      const [older, newer] = await Promise.all([a, b].map((version) => answered(request("GET", `${route}/versions/${version}`))));
      const refused = [older, newer].find((answer) => !answer.ok);
      if (refused) return renderProblem(result, refused.problem);
      replace(result, differences(documentOf(older.data), documentOf(newer.data), `version ${a}`, `version ${b}`));
    }

    /** A resync: the device was read whole at `version`, the changes missed being past the retention. */
    function gap(version) {
      const item = h("li", {value: version, class: "change gap"}, h("strong", {}, `version ${version}`),
        " read whole: the changes before it that this page missed are past the change feed's retention");
      const after = [...list.children].find((other) => Number(other.value) <= version);
      list.insertBefore(item, after || null);
    }

    return {section, add, gap, list, problem, earlier};
  }

  async function loadHistory(upTo) {
    const newest = upTo ?? (view.oldest ? view.oldest - 1 : 0);
    if (newest < 1) return 0;
    const since = Math.max(0, newest - HISTORY_PAGE);
    const answer = await answered(request("GET", `${route}/changes`, {query: {since, limit: newest - since}}));
    if (String(answer.problem?.type).endsWith(":changes-expired")) { // older than the retention: none to show
      history.earlier.hidden = true;
      history.list.after(h("p", {class: "muted", id: "history-expired"},
        `Changes before version ${newest + 1} are past the change feed's retention.`));
      return newest;
    }
    if (!answer.ok) {
      renderProblem(history.problem, answer.problem);
      return since;
    }
    replace(history.problem);
    for (const change of answer.data.changes) history.add(change);
    history.earlier.hidden = since === 0 || !answer.data.changes.length;
    return answer.data.nextSince; // the feed trails writes: what it has not recorded yet comes by the WebSocket
  }

  // --- editing desired ---
  function editorSection() {
    const open = h("button", {type: "button", id: "edit-desired", on: {click: () => start()}}, "Edit desired");
    const patch = h("textarea", {id: "patch", rows: 6, spellcheck: "false", autocomplete: "off",
                                 "aria-describedby": "patch-help"});
    const expiresIn = h("input", {id: "expires-in", type: "number", min: 1, max: 2592000, inputmode: "numeric"});
    const clearOnConfirm = h("input", {id: "clear-on-confirm", type: "checkbox"});
    const base = h("p", {id: "edit-base", class: "muted"});
    const moved = h("p", {id: "edit-moved", class: "warning", role: "status"});
    const outcome = h("div", {id: "edit-outcome"});
    const form = h("form", {id: "edit-form", hidden: true, on: {submit: (event) => { event.preventDefault(); apply(); }}},
      h("label", {for: "patch"}, "Merge patch for desired (JSON)"), patch,
      h("p", {id: "patch-help", class: "muted"}, "Members set what the device should do; null removes a member."),
      h("div", {class: "row"}, h("label", {for: "expires-in"}, "Expires in (seconds, optional)"), expiresIn),
      h("div", {class: "row"}, clearOnConfirm, h("label", {for: "clear-on-confirm"}, "Clear each leaf once the device confirms it")),
      base, moved,
      h("div", {class: "row"}, h("button", {type: "submit", id: "apply"}, "Apply"),
        h("button", {type: "button", on: {click: () => { stop(); replace(outcome); }}}, "Cancel")));
    const section = h("section", {class: "panel", "aria-labelledby": "edit-heading"},
      h("h2", {id: "edit-heading"}, "Change desired"), open, form, outcome);
    // One Idempotency-Key per request an edit sends: the same edit sent again on the same version (its
    // answer lost) keeps its key, so the service answers with what the first send did.
    const keyed = {request: null, key: null};

    function start() {
      if (!view.device || view.missing) { // nothing to guard the edit by: no such device, or its read failed
        renderProblem(outcome, view.missing ? {title: "No such device", detail: "nothing to edit"}
          : {title: "Not read", detail: "the device could not be read; reload the page to edit it"});
        return;
      }
      view.editing++;  // an edit of its own: what an earlier one still waits for is dropped
      guard(view.device);
      patch.value = patch.value || "{}";
      moved.textContent = "";
      replace(outcome);
      form.hidden = false;
      open.hidden = true;
      patch.focus();
    }

    /** The edit applies only while desired is as in ``device`` (read with its metadata): sent with
     *  If-Match on its version. */
    function guard(device) {
      view.editBase = device.version;
      view.editDesires = desires(device);
      base.textContent = `Applies only while desired stays as it is at version ${view.editBase} (If-Match).`;
    }

    function stop() {
      view.editing++;
      view.editBase = null;
      form.hidden = true;
      open.hidden = false;
      replace(moved);
      open.focus();
    }

    function deviceMoved(version) {
      if (view.editBase !== null && version !== view.editBase) {
        moved.textContent = `The device has changed since you started (now version ${version}): should its desired have changed, applying will be refused and show what changed.`;
      }
    }

    async function apply() {
      let body;
      try {
        body = parse(patch.value);
      } catch (error) {
        return renderProblem(outcome, {title: "Not JSON", detail: error.message});
      }
      if (!isObject(body)) return renderProblem(outcome, {title: "Not an object", detail: "a merge patch of desired is a JSON object"});
      const query = {expiresIn: expiresIn.value, clearOnConfirm: clearOnConfirm.checked ? "true" : ""};
      const sent = patch.value;  // what was checked, whatever is typed while it is sent
      const edit = view.editing;
      const dropped = () => view.editing !== edit || view.left;  // cancelled, or another edit begun
      for (let tries = 1; ; tries++) {
        const same = JSON.stringify([edit, view.editBase, sent, query]);
        if (same !== keyed.request) Object.assign(keyed, {request: same, key: crypto.randomUUID()});
        const answer = await answered(request("PATCH", `${route}/desired`, {
          query, body: sent, contentType: "application/merge-patch+json",
          headers: {"If-Match": `"${view.editBase}"`, "Idempotency-Key": keyed.key}}));
        if (answer.ok) {  // applied, even if cancelled meanwhile: said as it is
          replace(outcome, h("p", {role: "status", class: "ok"}, `Applied: the device is at version ${answer.data.version}.`));
          stop();
          read();
          return;
        }
        if (dropped()) return;
        if (outcomeUnknown(answer)) {
          return renderProblem(outcome, {title: "No answer",
            detail: "the change may or may not have been applied; Apply again to learn which."});
        }
        if (answer.status !== 412) return renderProblem(outcome, answer.problem);
        // Reports and state writes move the version without touching desired (a device reporting every
        // second would refuse every edit): on a version whose desired is as the edit found it, sent again.
        const now = tries < SENDS_WHILE_DESIRED_STAYS ? await answered(request("GET", route, {query: {include: "metadata"}})) : null;
        if (dropped()) return;
        if (!now?.ok || desires(now.data) !== view.editDesires) return conflict(answer.problem.currentVersion, dropped, tries);
        guard(now.data);
      }
    }

    /** Why the edit was not applied and what changed between the version it was last sent on and now;
     *  apply again on the new version. */
    async function conflict(current, dropped, sends) {
      const from = view.editBase;
      const [then, now] = await Promise.all([answered(request("GET", `${route}/versions/${from}`)),
                                             answered(request("GET", route, {query: {include: "metadata"}}))]);
      if (dropped()) return;
      const to = now.ok ? now.data.version : current;
      // Desired as the edit found it: only reports and state writes moved the version, faster than the sends.
      const overtaken = now.ok && desires(now.data) === view.editDesires;
      const why = overtaken
        ? [h("h3", {}, "Not applied: the device kept reporting"),
           h("p", {}, `${sends === 1 ? "The send was" : `Each of the ${sends} sends was`} overtaken by a newer version (reports or state `
             + `written meanwhile); desired stayed as you found it. It moved from version ${from} to ${to}. What changed meanwhile:`)]
        : [h("h3", {}, "Not applied: the device changed"),
           h("p", {}, `It moved from version ${from} to ${to} while you edited. What changed meanwhile:`),
           then.ok && now.ok && !diff(then.data.desired, now.data.desired).length
             ? h("p", {}, "Desired was set again meanwhile, to the same values: a newer desire the edit would overwrite.") : ""];
      const shown = then.ok && now.ok ? differences(documentOf(then.data), documentOf(now.data), `version ${from}`, `version ${to}`)
        : !now.ok ? h("p", {}, `The device could not be read (${now.problem?.title || "refused"}).`)
        : String(then.problem?.type).endsWith(":not-yet-recorded")  // written, its change not in the feed yet
          ? h("p", {}, `Version ${from} is not recorded in the history yet: compare it with version ${to} below in a moment.`)
          : h("p", {}, `Version ${from} can no longer be read (${then.problem?.title || "refused"}).`);
      replace(outcome, h("div", {role: "alert", class: "problem", id: "conflict"}, why, shown,
        h("div", {class: "row"},
          h("button", {type: "button", id: "reapply", on: {click: () => { guard(now.ok ? now.data : {version: to}); moved.textContent = ""; apply(); }}},
            `Apply again on version ${to}`),
          h("button", {type: "button", on: {click: () => { stop(); replace(outcome); }}}, "Discard"))));
      outcome.querySelector("#reapply").focus();
    }

    return {section, deviceMoved};
  }

  // --- start ---
  // The device and its history, then the follower, whatever they answered: a read that got no answer
  // shows its problem, and the follower (connecting again with its backoff) brings what it missed.
  (async () => {
    let since = 0;
    try {
      await read();
      if (!view.left) since = await loadHistory(view.device?.version ?? 0);
    } finally {
      if (!view.left) {
        view.follower = new Follower({url: settings.webSocket, deviceId: id, since, onChange: changed, onStatus: liveStatus,
          onResync: async () => {
            await read();
            history.gap(view.device?.version ?? 0);
            view.follower.resume(view.device?.version ?? 0);
          }}).start();
      }
    }
  })();

  // Connectivity is no version (no change is pushed for it): read again now and then while shown.
  const connectivity = setInterval(() => { if (document.visibilityState === "visible") read(); }, CONNECTIVITY_MS);

  return {
    leave() {
      view.left = true;
      clearInterval(connectivity);
      view.follower?.stop();
    },
  };
}

function documentOf(device) {
  return {state: device.state, desired: device.desired, reported: device.reported};
}

function differences(before, after, beforeLabel, afterLabel) {
  const rows = diff(before, after);
  if (!rows.length) return h("p", {class: "muted"}, "No difference in state, desired or reported.");
  const cell = (value) => h("td", {class: "value"}, value === undefined ? h("span", {class: "muted"}, "absent") : text(value));
  return h("div", {class: "table-wrap", tabindex: 0, role: "region", "aria-label": "Differences"},
    h("table", {class: "diff"},
      h("thead", {}, h("tr", {}, h("th", {scope: "col"}, "Path"), h("th", {scope: "col"}, beforeLabel),
                     h("th", {scope: "col"}, afterLabel))),
      h("tbody", {}, rows.map((row) => h("tr", {}, h("th", {scope: "row"}, h("code", {}, h("bdi", {}, visible(row.path)))),
                                         cell(row.before), cell(row.after))))));
}

function renderProblem(where, problem) {
  replace(where, h("div", {role: "alert", class: "problem"}, h("strong", {}, visible(problem?.title || "Refused")), ": ",
    h("bdi", {}, visible(problem?.detail ?? ""))));
}

/** A section as a tree of text; each leaf beside its metadata (desired: version, ack, expiry, confirmation). */
function tree(value, meta, section) {
  if (isObject(value) && Object.keys(value).length) {
    return h("ul", {class: "tree"}, Object.keys(value).map((name) => h("li", {},
      h("span", {class: "key"}, text(name)), ": ", tree(value[name], isObject(meta) ? meta[name] : undefined, section))));
  }
  const leaf = h("span", {class: "leaf"}, value === undefined ? "—" : isObject(value) ? "{}" : text(value));
  if (!isObject(meta) || typeof meta.version !== "number") return leaf;
  return [leaf, " ", annotations(meta, section)];
}

function annotations(entry, section) {
  const notes = [h("span", {class: "tag", title: entry.updatedAt ? `set ${entry.updatedAt}` : ""}, `v${entry.version}`)];
  if (section === "desired") {
    if (entry.ack) {
      const kind = entry.ack.code >= 400 ? "refused" : "ok";
      notes.push(h("span", {class: `tag ${kind}`, title: entry.ack.at ? `acknowledged ${entry.ack.at}` : ""},
        `ack ${entry.ack.code}`, entry.ack.reason ? [" ", h("bdi", {}, visible(entry.ack.reason))] : ""));
    }
    if (entry.expired) notes.push(h("span", {class: "tag refused"}, "expired"));
    else if (entry.expiresAt) notes.push(h("span", {class: "tag"}, "expires ", time(entry.expiresAt)));
    if (entry.confirmedVersion !== undefined) notes.push(h("span", {class: "tag ok"}, `confirmed v${entry.confirmedVersion}`));
    else notes.push(h("span", {class: "tag pending"}, "not confirmed"));
    if (entry.clearOnConfirm) notes.push(h("span", {class: "tag"}, "clears on confirm"));
  }
  return h("span", {class: "meta"}, notes.flatMap((note, index) => index ? [" ", note] : [note]));
}

