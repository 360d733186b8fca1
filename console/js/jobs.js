// Jobs (docs/api/jobs.md): one desired change to every device a filter finds. A job is created
// from the fleet page's filter (how many devices it matches is shown first, by the count route);
// its page follows it live (GET /jobs/{id}?waitSeconds= with If-None-Match: an answer only when
// the job changed), its progress per execution state as a bar and counts, its executions by
// state with their reasons, and cancels it (force: its leaves leave the devices still in
// progress). The list of jobs is #/jobs, a job's page #/jobs/{id}.
import {answered, outcomeUnknown, path, request} from "./api.js";
import {announce, h, pagerControls, replace, time} from "./dom.js";
import {isObject, parse, text, visible} from "./json.js";

export const STATES = ["QUEUED", "IN_PROGRESS", "SUCCEEDED", "FAILED", "TIMED_OUT", "SUPERSEDED", "REMOVED", "CANCELED"];
const STATUSES = ["IN_PROGRESS", "COMPLETED", "CANCELED", "ABORTED"];
const FINAL = new Set(["SUCCEEDED", "FAILED", "TIMED_OUT", "SUPERSEDED", "REMOVED", "CANCELED"]);
const WAIT_SECONDS = 20; // the API's longest wait
const MIN_READ_MS = 1000; // a busy job changes all the time: it is read at most once a second
const EXECUTIONS_MS = 2000; // and its executions at most every two
const BACKOFF_MS = [1000, 2000, 4000, 8000, 15000];
// A read of the job refused so is refused again (not 401: the page asks for a token, then reads again).
const FINAL_REFUSALS = [400, 403, 404];
const PAGE = 50;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
const words = (state) => state.toLowerCase().replace("_", " ");

/** A job's progress: a bar of its executions by state, and each state's count as text. */
export function progress(job, {compact = false} = {}) {
  const counts = job.counts || {};
  const total = Number(job.total) || 0;
  const done = STATES.filter((state) => FINAL.has(state)).reduce((sum, state) => sum + (counts[state] || 0), 0);
  const bar = h("div", {class: "progress", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": total,
                        "aria-valuenow": done, "aria-label": `${job.jobId}: ${done} of ${total} executions final`},
    STATES.filter((state) => counts[state]).map((state) => {
      const segment = h("span", {class: `segment s-${state}`, title: `${words(state)}: ${counts[state]}`});
      segment.style.width = `${(100 * counts[state]) / Math.max(1, total)}%`; // CSSOM, which the style-src policy allows
      return segment;
    }));
  const summary = h("span", {class: "small"}, `${done} of ${total} final${job.targeting ? ", still finding devices" : ""}`);
  if (compact) return h("div", {class: "progress-cell"}, bar, summary);
  return h("div", {class: "progress-block"}, bar, h("p", {class: "muted small"}, summary),
    h("ul", {class: "counts", id: "counts"}, STATES.map((state) => h("li", {id: `count-${state}`},
      h("span", {class: `swatch s-${state}`, "aria-hidden": "true"}), `${words(state)} `,
      h("strong", {}, String(counts[state] || 0))))));
}

function statusBadge(status, id) {
  const kind = status === "COMPLETED" ? "online" : status === "IN_PROGRESS" ? "running" : "offline";
  return h("span", {class: `badge ${kind}`, id}, words(String(status)));
}

function stateTag(state) {
  const kind = state === "SUCCEEDED" ? "ok" : ["FAILED", "TIMED_OUT"].includes(state) ? "refused"
    : ["QUEUED", "IN_PROGRESS"].includes(state) ? "pending" : "";
  return h("span", {class: `tag ${kind}`}, words(String(state)));
}

function problemBox(where, problem) {
  replace(where, h("div", {role: "alert", class: "problem"}, h("strong", {}, visible(problem?.title || "Refused")), ": ",
    h("bdi", {}, visible(problem?.detail ?? "")),
    problem?.member ? [" (", h("code", {}, h("bdi", {}, visible(problem.member))), ")"] : ""));
}

// --- creating a job (on the fleet page) ---

/** The fleet page's "create a job" panel, for the filter it shows. */
export function createJobSection(filter) {
  const section = h("section", {class: "panel", "aria-labelledby": "create-job-heading", id: "create-job-section"},
    h("h2", {id: "create-job-heading"}, "Job"));
  if (!filter) {
    section.append(h("p", {class: "muted"},
      "A job changes desired on every device a filter finds: search with a filter to create one."));
    return section;
  }
  const open = h("button", {type: "button", id: "create-job", on: {click: () => start()}}, "Create a job for these devices…");
  const count = h("div", {id: "job-count", "aria-live": "polite"});
  const desired = h("textarea", {id: "job-desired", rows: 4, spellcheck: "false", autocomplete: "off", required: true,
                                 "aria-describedby": "job-desired-help"});
  const number = (id, max) => h("input", {id, type: "number", min: 1, max, inputmode: "numeric"});
  const jobId = h("input", {id: "job-id", type: "text", pattern: "[A-Za-z0-9_\\-]{1,64}", maxlength: 64, autocomplete: "off",
                            spellcheck: "false"});
  const expiresIn = number("job-expires-in", 2592000);
  const timeout = number("job-timeout", 2592000);
  const perMinute = number("job-per-minute", 100000);
  const clearOnConfirm = h("input", {id: "job-clear-on-confirm", type: "checkbox"});
  const targets = h("select", {id: "job-targets"}, h("option", {value: "snapshot"}, "the devices matching when it runs"),
    h("option", {value: "continuous"}, "those and devices that come to match later"));
  const submit = h("button", {type: "submit", id: "job-submit", disabled: true}, "Create job");
  const outcome = h("div", {id: "job-outcome"});
  const sent = {body: null, key: null}; // the same body sent again (a lost answer) keeps its Idempotency-Key
  const form = h("form", {id: "job-form", hidden: true, on: {submit: (event) => { event.preventDefault(); create(); }}},
    h("p", {}, "Targets ", h("code", {id: "job-filter"}, h("bdi", {}, visible(filter)))), count,
    h("label", {for: "job-desired"}, "Desired for every device (JSON merge patch)"), desired,
    h("p", {id: "job-desired-help", class: "muted"}, "Values to set; a job removes nothing (no null)."),
    h("div", {class: "fields"},
      h("label", {for: "job-targets"}, "Devices"), targets,
      h("label", {for: "job-id"}, "Job id (optional)"), jobId,
      h("label", {for: "job-expires-in"}, "Desire expires in (seconds, optional)"), expiresIn,
      h("label", {for: "job-timeout"}, "Timeout per device (seconds, optional)"), timeout,
      h("label", {for: "job-per-minute"}, "At most writes a minute (optional)"), perMinute),
    h("div", {class: "row"}, clearOnConfirm, h("label", {for: "job-clear-on-confirm"}, "Clear each leaf once the device confirms it")),
    h("div", {class: "row"}, submit, h("button", {type: "button", on: {click: () => stop()}}, "Cancel")), outcome);
  section.append(open, form);

  async function start() {
    form.hidden = false;
    open.hidden = true;
    desired.value = desired.value || "{}";
    desired.focus();
    replace(count, h("p", {class: "muted"}, "Counting the devices it matches…"));
    submit.disabled = true;
    const answer = await answered(request("GET", "devices/count", {query: {filter}}));
    if (!answer.ok) return problemBox(count, answer.problem);
    const total = answer.data.count;
    replace(count, h("p", {class: "count"}, h("strong", {}, String(total)), ` device${total === 1 ? "" : "s"} match it now`,
      total ? "" : ": the job would write none unless devices come to match later", "."));
    submit.textContent = `Create job for ${total} device${total === 1 ? "" : "s"}`;
    submit.disabled = false;
  }

  function stop() {
    form.hidden = true;
    open.hidden = false;
    open.focus();
  }

  async function create() {
    let patch;
    try {
      patch = parse(desired.value);
    } catch (error) {
      return problemBox(outcome, {title: "Not JSON", detail: error.message});
    }
    if (!isObject(patch)) return problemBox(outcome, {title: "Not an object", detail: "desired is a JSON object"});
    // The patch goes as typed (numbers keep their digits); the rest as values.
    const members = [`"filter":${JSON.stringify(filter)}`, `"desired":${desired.value.trim()}`,
                     `"targets":${JSON.stringify(targets.value)}`];
    if (jobId.value.trim()) members.push(`"jobId":${JSON.stringify(jobId.value.trim())}`);
    if (expiresIn.value) members.push(`"expiresIn":${Number(expiresIn.value)}`);
    if (timeout.value) members.push(`"timeoutSeconds":${Number(timeout.value)}`);
    if (perMinute.value) members.push(`"rollout":{"maxPerMinute":${Number(perMinute.value)}}`);
    if (clearOnConfirm.checked) members.push(`"clearOnConfirm":true`);
    const body = `{${members.join(",")}}`;
    if (body !== sent.body) Object.assign(sent, {body, key: crypto.randomUUID()});
    submit.disabled = true;
    const answer = await answered(request("POST", "jobs", {body, headers: {"Idempotency-Key": sent.key}}));
    submit.disabled = false;  // answered() never throws: pressed again, the same body goes with the same key
    if (!answer.ok) {
      problemBox(outcome, outcomeUnknown(answer)
        ? {title: "No answer", detail: "press again (the same Idempotency-Key answers the same job)."} : answer.problem);
      outcome.querySelector("[role=alert]").setAttribute("tabindex", "-1");
      outcome.querySelector("[role=alert]").focus();
      return;
    }
    location.hash = `#/jobs/${encodeURIComponent(answer.data.jobId)}`;
  }

  return section;
}

// --- the list of jobs ---

export function jobsView(main, _params, query) {
  const state = {status: STATUSES.includes(query.get("status")) ? query.get("status") : "", cursors: [null], page: 0};
  const select = h("select", {id: "job-status-filter"}, h("option", {value: ""}, "any status"),
    STATUSES.map((status) => h("option", {value: status, selected: status === state.status}, words(status))));
  const table = h("table", {class: "jobs"});
  const pager = h("nav", {"aria-label": "Pages", class: "pager"});
  const problem = h("div");
  const form = h("form", {class: "row", on: {submit: (event) => {
    event.preventDefault();
    const hash = select.value ? `#/jobs?status=${select.value}` : "#/jobs";
    if (location.hash === hash) load(); else location.hash = hash;
  }}}, h("label", {for: "job-status-filter"}, "Status"), select, h("button", {type: "submit"}, "Show"));
  let left = false;
  replace(main, h("h1", {}, "Jobs"),
    h("p", {class: "muted"}, "A job is created from the ", h("a", {href: "#/"}, "fleet"), "'s filter."),
    form, problem,
    h("div", {class: "table-wrap", tabindex: 0, role: "region", "aria-label": "Jobs"}, table), pager);

  async function load() {
    table.setAttribute("aria-busy", "true");
    const answer = await answered(request("GET", "jobs", {query: {status: state.status, limit: PAGE, cursor: state.cursors[state.page]}}));
    table.removeAttribute("aria-busy");
    if (left) return;
    if (!answer.ok) {
      replace(pager, pagerControls(state.page, state.cursors[state.page + 1], turn));  // a click waits no more
      return problemBox(problem, answer.problem);
    }
    replace(problem);
    state.cursors[state.page + 1] = answer.data.nextCursor;
    const rows = answer.data.items.map((job) => h("tr", {},
      h("th", {scope: "row"}, h("a", {href: `#/jobs/${encodeURIComponent(job.jobId)}`}, job.jobId)),
      h("td", {}, statusBadge(job.status)), h("td", {}, progress(job, {compact: true})),
      h("td", {class: "value"}, targetsOf(job)), h("td", {}, time(job.createdAt))));
    replace(table, h("caption", {class: "visually-hidden"}, `Jobs, page ${state.page + 1}`),
      h("thead", {}, h("tr", {}, ["Job", "Status", "Progress", "Targets", "Created"].map((name) => h("th", {scope: "col"}, name)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", {colspan: 5}, "No job here."))));
    replace(pager, pagerControls(state.page, answer.data.nextCursor, turn));
    announce(`${rows.length} jobs on page ${state.page + 1}`);
  }

  function turn(step) {
    state.page += step;
    load();
  }

  load();
  return {leave() { left = true; }};
}

function targetsOf(job) {
  if (typeof job.filter === "string") {
    return [h("code", {}, h("bdi", {}, visible(job.filter))), job.targets === "continuous" ? " (continuous)" : ""];
  }
  return `${job.deviceIdCount} listed device${job.deviceIdCount === 1 ? "" : "s"}`;
}

// --- a job ---

export function jobView(main, {id}, query) {
  const route = `jobs/${path(id)}`;
  const view = {job: null, etag: null, left: false, following: false, state: STATES.includes(query.get("state")) ? query.get("state") : "",
                cursors: [null], page: 0, reading: null, readAgain: false, lastRead: 0};
  const aborter = new AbortController();
  const head = h("div", {id: "job-head"}, h("h1", {}, id), h("p", {class: "muted"}, "Reading the job…"));
  const progressBox = h("section", {"aria-labelledby": "progress-heading", class: "panel"},
    h("h2", {id: "progress-heading"}, "Progress"), h("div", {id: "progress"}));
  const followBadge = h("span", {class: "badge offline", id: "following"}, "connecting");
  const cancel = cancelSection();
  const executions = executionsSection();
  replace(main, h("p", {}, h("a", {href: "#/jobs"}, "← Jobs")), head, progressBox, cancel.section, executions.section);

  function show(job) {
    const before = view.job;
    view.job = job;
    replace(head, h("h1", {}, job.jobId),
      h("dl", {class: "facts"},
        h("dt", {}, "Status"), h("dd", {}, statusBadge(job.status, "job-status")),
        h("dt", {}, "Targets"), h("dd", {class: "value"}, targetsOf(job)),
        h("dt", {}, "Created"), h("dd", {}, time(job.createdAt)),
        h("dt", {}, job.completedAt ? "Completed" : "Ends"), h("dd", {}, time(job.completedAt || job.endsAt)),
        job.abortedBy ? [h("dt", {}, "Aborted by"), h("dd", {}, text(job.abortedBy))] : "",
        h("dt", {}, "Following"), h("dd", {}, followBadge)),
      h("p", {}, "Desired: ", h("code", {id: "job-desired-shown", class: "value"}, text(job.desired)),
        job.expiresIn ? ` expires in ${job.expiresIn} s` : "", job.clearOnConfirm ? ", cleared on confirm" : "",
        job.rollout ? `, at most ${job.rollout.maxPerMinute} writes a minute` : ""));
    replace(progressBox.querySelector("#progress"), progress(job));
    cancel.update(job);
    if (before && before.status !== job.status) announce(`Job ${words(job.status)}`);
    executions.changed();
  }

  function following(status) {
    followBadge.className = `badge ${status === "live" ? "online" : "offline"}`;
    followBadge.textContent = status;
  }

  /** The job, then each change of it: a waiting read answers when its ETag moves (304 when not). */
  async function follow() {
    if (view.following) return;
    view.following = true;
    for (let failures = 0; !view.left;) {
      const started = Date.now();
      const waiting = view.etag !== null;
      const answer = await answered(request("GET", route, {query: waiting ? {waitSeconds: WAIT_SECONDS} : {},
                                                           headers: waiting ? {"If-None-Match": view.etag} : {},
                                                           signal: aborter.signal}));
      if (view.left) break;
      if (answer.status === 304) {
        failures = 0;
        following("live");
        continue;
      }
      if (answer.ok) {
        failures = 0;
        view.etag = answer.etag;
        show(answer.data);
        if (answer.data.completedAt) { // nothing queued or in progress: it changes no more
          following("ended");
          break;
        }
        following("live");
        await sleep(MIN_READ_MS - (Date.now() - started));
        continue;
      }
      if (FINAL_REFUSALS.includes(answer.status)) {  // asked again, it answers the same
        if (answer.status === 404) {
          replace(head, h("h1", {}, id), h("p", {class: "problem", role: "status"}, "No such job (or it is past its retention)."));
        } else {
          problemBox(head, answer.problem);
        }
        following("ended");
        progressBox.hidden = cancel.section.hidden = executions.section.hidden = true;
        break;
      }
      following("reconnecting");
      if (!view.job) problemBox(head, answer.problem);
      await sleep(BACKOFF_MS[Math.min(failures++, BACKOFF_MS.length - 1)]);
    }
    view.following = false;
  }

  // --- executions ---
  function executionsSection() {
    const select = h("select", {id: "execution-state"}, h("option", {value: ""}, "every state"),
      STATES.map((state) => h("option", {value: state, selected: state === view.state}, words(state))));
    const table = h("table", {class: "executions", id: "executions"});
    const pager = h("nav", {"aria-label": "Pages of executions", class: "pager"});
    const problem = h("div");
    select.addEventListener("change", () => {
      view.state = select.value;
      view.cursors = [null];
      view.page = 0;
      history.replaceState(null, "", `#/jobs/${encodeURIComponent(id)}${view.state ? "?state=" + view.state : ""}`);
      read();
    });
    const section = h("section", {"aria-labelledby": "executions-heading"},
      h("h2", {id: "executions-heading"}, "Executions"),
      h("div", {class: "row"}, h("label", {for: "execution-state"}, "State"), select), problem,
      h("div", {class: "table-wrap", tabindex: 0, role: "region", "aria-labelledby": "executions-heading"}, table), pager);

    /** The page shown, read again (one read at a time; a change during a read asks for one more). */
    async function read() {
      if (view.reading) {
        view.readAgain = true;
        return;
      }
      view.reading = true;
      try {
        do {
          view.readAgain = false;
          await sleep(EXECUTIONS_MS - (Date.now() - view.lastRead));
          if (view.left) break;
          view.lastRead = Date.now();
          const answer = await answered(request("GET", `${route}/executions`,
                                                {query: {state: view.state, limit: PAGE, cursor: view.cursors[view.page]}}));
          if (view.left) break;
          if (!answer.ok) {
            problemBox(problem, answer.problem);  // the job's next change reads again
            replace(pager, pagerControls(view.page, view.cursors[view.page + 1], turn));  // a click waits no more
            continue;
          }
          replace(problem);
          view.cursors[view.page + 1] = answer.data.nextCursor;
          render(answer.data.items, answer.data.nextCursor);
        } while (view.readAgain);
      } finally {
        view.reading = false;  // whatever happened, the next change reads again
      }
    }

    function render(items, nextCursor) {
      const rows = items.map((execution) => h("tr", {},
        h("th", {scope: "row"}, h("a", {href: `#/devices/${encodeURIComponent(execution.deviceId)}`}, execution.deviceId)),
        h("td", {}, stateTag(execution.state)),
        h("td", {class: "number"}, execution.version ? String(execution.version) : "—"),  // 0: never written
        h("td", {}, time(execution.updatedAt)),
        h("td", {class: "number"}, execution.code === undefined ? "" : String(execution.code)),
        h("td", {class: "value reason"}, execution.reason === undefined ? "" : visible(execution.reason))));
      replace(table, h("caption", {class: "visually-hidden"},
        `Executions${view.state ? " " + words(view.state) : ""}, page ${view.page + 1}`),
      h("thead", {}, h("tr", {}, ["Device", "State", "Version", "Updated", "Code", "Reason"].map((name) =>
        h("th", {scope: "col"}, name)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", {colspan: 6}, "No execution here."))));
      replace(pager, pagerControls(view.page, nextCursor, turn));
    }

    function turn(step) {
      view.page += step;
      read();
    }

    return {section, changed: read};
  }

  // --- cancel ---
  function cancelSection() {
    const outcome = h("div", {id: "cancel-outcome"});
    const ask = h("div", {id: "cancel-ask", class: "confirm", role: "group", "aria-labelledby": "cancel-question", hidden: true});
    const openCancel = h("button", {type: "button", id: "cancel-job", on: {click: () => confirm(false)}}, "Cancel job…");
    const openForce = h("button", {type: "button", id: "force-cancel", on: {click: () => confirm(true)}}, "Force cancel…");
    const section = h("section", {class: "panel", "aria-labelledby": "cancel-heading", id: "cancel-section"},
      h("h2", {id: "cancel-heading"}, "Cancel"), h("p", {class: "muted", id: "cancel-help"}),
      h("div", {class: "row"}, openCancel, openForce), ask, outcome);

    function update(job) {
      const inProgress = job.counts?.IN_PROGRESS || 0;
      openCancel.hidden = job.status !== "IN_PROGRESS";
      openForce.hidden = !(job.status === "IN_PROGRESS" || (job.status === "CANCELED" && inProgress > 0));
      section.querySelector("#cancel-help").textContent = openCancel.hidden && openForce.hidden
        ? `The job is ${words(job.status)}: there is nothing to cancel.`
        : "Canceling stops the job: what is queued is never written; devices in progress stay tracked. "
          + "Forcing also removes the job's leaves from the devices still in progress where the job still owns them.";
      if (openCancel.hidden && openForce.hidden) ask.hidden = true;
    }

    function confirm(force) {
      const inProgress = view.job?.counts?.IN_PROGRESS || 0;
      replace(ask,
        h("p", {id: "cancel-question"}, force
          ? `Force cancel: stop queuing and remove the job's leaves from the ${inProgress} device${inProgress === 1 ? "" : "s"} `
            + "still in progress (a leaf another writer set since is left alone)?"
          : "Cancel: stop queuing (what is queued is never written; devices in progress stay tracked)?"),
        h("div", {class: "row"},
          h("button", {type: "button", id: "cancel-confirm", class: "danger", on: {click: () => send(force)}},
            force ? "Force cancel the job" : "Cancel the job"),
          h("button", {type: "button", id: "cancel-keep", on: {click: () => { ask.hidden = true; (force ? openForce : openCancel).focus(); }}},
            "Keep it")));
      ask.hidden = false;
      replace(outcome);
      ask.querySelector("#cancel-confirm").focus();
    }

    async function send(force) {
      ask.hidden = true;
      const answer = await answered(request("POST", `${route}/cancel`, {query: {force: force ? "true" : ""}}));
      if (view.left) return;
      if (!answer.ok) {
        problemBox(outcome, answer.problem);
        return;
      }
      view.etag = answer.etag;
      show(answer.data);
      replace(outcome, h("p", {role: "status", class: "ok"}, force ? "Force-canceled." : "Canceled."));
      section.querySelector("#cancel-heading").setAttribute("tabindex", "-1");
      section.querySelector("#cancel-heading").focus();
      follow();
    }

    return {section, update};
  }

  follow();
  return {
    leave() {
      view.left = true;
      aborter.abort();
    },
  };
}
