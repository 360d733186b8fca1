// The public API, called with the signed-in person's token. Answers come back as
// {status, ok, etag, data, problem}: a refusal is data to show (problem details), not an exception.
import {renew, token} from "./auth.js";
import {parse} from "./json.js";

let base = "";
/** What config.json says beyond the API's address: the WebSocket URL and the declared fields. */
export const settings = {webSocket: "", fleetFields: []};

export function configure(config) {
  base = new URL(config.api || "/", location.href).toString().replace(/\/?$/, "/");
  settings.webSocket = new URL(config.webSocket || "/ws", location.href.replace(/^http/, "ws")).toString();
  settings.fleetFields = Array.isArray(config.fleetFields) ? config.fleetFields : [];
}

export function path(...segments) {
  return segments.map((segment) => encodeURIComponent(segment)).join("/");
}

// Reads sent before their page asked (the first page's, as soon as the console is signed in), by URL.
const early = new Map();

/** Sends GET route now; the page's own request() of the same URL takes its answer, once. */
export function prefetch(route, options = {}) {
  const answer = request("GET", route, {...options, renewal: false}); // no page yet to show a sign-in
  answer.catch(() => {}); // a failure is the taker's to show; one no page took is nobody's
  early.set(address(route, options.query).href, answer);
}

/** Forgets the early reads no page took (called once the first page has made its requests). */
export function forgetPrefetched() {
  early.clear();
}

/**
 * request("GET", "devices", {query: {filter}}); body is JSON text (sent as typed, so numbers
 * keep their digits) or a value; signal (an AbortSignal) stops a waiting request when its page is left.
 * A 401 renews the sign-in and sends again once (renewal false: answered as it is).
 */
export async function request(method, route,
                              {query = {}, body, headers = {}, contentType, signal, renewal = true} = {}) {
  const url = address(route, query);
  const sentEarly = method === "GET" && early.get(url.href);
  let refusedEarly = false;
  if (sentEarly) {
    early.delete(url.href);
    const answer = await sentEarly;
    if (answer.status !== 401) return answer;
    refusedEarly = true; // the sign-in is renewed now, by the page that asked
  }
  const send = async () => fetch(url, {
    method, cache: "no-store", signal,
    headers: {Authorization: `Bearer ${await signedIn(token)}`,
              ...(body === undefined ? {} : {"Content-Type": contentType || "application/json"}), ...headers},
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
  });
  let response = refusedEarly ? null : await send();
  if (refusedEarly || (response.status === 401 && renewal)) {
    await signedIn(renew);
    response = await send();
  }
  for (let retry = 0; method === "GET" && retry < READ_RETRIES; retry++) {
    const wait = retryAfterSeconds(response);
    if (wait === null || signal?.aborted) break;
    await new Promise((resolve) => setTimeout(resolve, wait * 1000));
    response = await send();
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? parse(text) : null;
  } catch {
    data = null;
  }
  // The service's refusals are problem documents; a gateway's own answer ({"message": ...}) is not,
  // and is shown by its status, its message the detail.
  const problem = response.ok ? null : (data && typeof data === "object" && (data.type || data.title) ? data
    : {status: response.status, title: response.statusText || `Answered ${response.status}`,
       detail: typeof data?.message === "string" ? data.message : text.slice(0, 200)});
  return {status: response.status, ok: response.ok, etag: response.headers.get("ETag"), data, problem};
}

// A read answered 503 with Retry-After (a version written but not yet in the history, storage
// briefly unavailable) is asked again after that wait (at most MAX_RETRY_WAIT_SECONDS), this often.
const READ_RETRIES = 3;
const MAX_RETRY_WAIT_SECONDS = 5;

function retryAfterSeconds(response) {
  const header = response.headers.get("Retry-After") || "";
  return response.status === 503 && /^\d+$/.test(header) ? Math.min(Number(header), MAX_RETRY_WAIT_SECONDS) : null;
}

/** Thrown where no token could be had (a sign-in not renewed): the request was not sent, or was
 *  refused (401) and not sent again. Either way nothing was written. */
class NotSignedIn extends Error {}

async function signedIn(step) {
  try {
    return await step();
  } catch (error) {
    throw new NotSignedIn(String(error.message || error));
  }
}

/** A request's answer, or a problem to show when none came (the network or the service down) or
 *  when the sign-in could not be renewed (401: nothing was written, so no outcome is unknown). */
export async function answered(sent) {
  try {
    return await sent;
  } catch (error) {
    if (error instanceof NotSignedIn) {
      return {status: 401, ok: false, problem: {status: 401, title: "Not signed in: nothing was written",
                                                detail: `The sign-in could not be renewed: ${error.message}`}};
    }
    return {status: 0, ok: false, problem: {title: "No answer from the service", detail: String(error.message || error)}};
  }
}

/** Whether a write's outcome is unknown: no answer came (status 0, from answered()), the service
 *  could not tell (504 outcome-unknown), or a 5xx came from a gateway, not the service (no problem
 *  type: the function crashed or timed out, perhaps after its write). Sent again with the same
 *  Idempotency-Key, it learns which. */
export function outcomeUnknown(answer) {
  return answer.status === 0 || answer.status === 504 || (answer.status >= 500 && !answer.problem?.type);
}

function address(route, query = {}) {
  const url = new URL(route, base);
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, value);
  }
  return url;
}

/** The version an ETag names ("7" -> 7). */
export function versionOf(etag) {
  const match = /^"(\d+)"$/.exec(etag || "");
  return match ? Number(match[1]) : null;
}
