// Who the console acts for. It holds no rights of its own: every request carries the token of
// the person signed in. The token lives in this module's memory and the tab's session storage
// (so a reload of the tab needs no new sign-in, until the token is near its end or refused:
// a 401 renews it); never in a URL, never in local storage. A refresh token stays in memory.
//
// config.auth.kind:
//   "local"   make serve: its own issuer hands this page a token (POST tokenPath, same origin,
//             loopback only); nothing to sign in to. Never deployed.
//   "cognito" deployed: Cognito's hosted UI, authorization code with PKCE (S256), through the
//             console's own public app client (no secret).
//   "token"   any other issuer: paste a bearer token.

const RENEW_AT = 0.8; // of a token's life, where a new one comes silently (make serve's, a refresh token)
const LAST_SECONDS = 30; // otherwise the token is used until this close to its end
const STORED = "device-state-console.session";
const STORED_LOCAL = "device-state-console.local-session"; // make serve's, never taken for a person's
const PENDING = "device-state-console.sign-in";

let config;
let current = null; // {token, expiresAt (ms), subject, refreshToken?}
let renewing = null;

export async function signIn(consoleConfig) {
  config = consoleConfig;
  const auth = config.auth || {};
  if (auth.kind === "local") return (current = restored()) || keep(await localToken());
  if (auth.kind === "cognito") return cognito(auth);
  if (auth.kind === "token") return pasted();
  throw new Error(`config.json names no sign-in the console knows (auth.kind ${JSON.stringify(auth.kind)})`);
}

export function subject() {
  return current?.subject ?? "";
}

/** The bearer token to send now, renewed first when most of its life is gone and a new one comes
 *  without the operator; else only at its end (a sign-in asked for early, from a background read,
 *  would stop the page under an edit being typed). */
export async function token() {
  if (!current) throw new Error("not signed in");
  const left = current.expiresAt - Date.now();
  const silent = config.auth.kind === "local" || (config.auth.kind === "cognito" && current.refreshToken);
  if (left < (silent ? (1 - RENEW_AT) * (current.lifetime || 3600e3) : LAST_SECONDS * 1000)) await renew();
  return current.token;
}

/** A fresh token (after a 401, or near expiry); one renewal at a time. */
export function renew() {
  renewing ??= (async () => {
    try {
      const auth = config.auth;
      if (auth.kind === "local") keep(await localToken());
      else if (auth.kind === "cognito" && current?.refreshToken) keep(await refresh(auth, current.refreshToken));
      else if (auth.kind === "cognito") await signInAgain(auth);
      else await pasted(true);
    } finally {
      renewing = null;
    }
  })();
  return renewing;
}

export function signOut() {
  current = null;
  sessionStorage.removeItem(storageKey());
  const auth = config.auth;
  if (auth.kind === "cognito") {
    const logout = new URL("/logout", auth.domain);
    logout.search = new URLSearchParams({client_id: auth.clientId, logout_uri: home()}).toString();
    location.assign(logout.toString());
  } else {
    location.reload();
  }
}

function keep(session) {
  current = session;
  const {refreshToken, ...stored} = session; // a refresh token stays in memory only
  sessionStorage.setItem(storageKey(), JSON.stringify(stored));
  return session;
}

function fromToken(token, expiresIn, extra = {}) {
  const claims = claimsOf(token);
  const lifetime = (Number(expiresIn) || Math.max((claims.exp ?? 0) - Date.now() / 1000, 60)) * 1000;
  return {token, lifetime, expiresAt: Date.now() + lifetime,
          subject: claims.username || claims.email || claims.sub || claims.client_id || "signed in", ...extra};
}

function claimsOf(token) {
  try {
    const part = token.split(".")[1].replaceAll("-", "+").replaceAll("_", "/");
    return JSON.parse(atob(part.padEnd(part.length + (4 - part.length % 4) % 4, "=")));
  } catch {
    return {};
  }
}

async function localToken() {
  const response = await fetch(config.auth.tokenPath, {method: "POST", cache: "no-store",
                                                        headers: {"X-Console": "1"}});
  if (!response.ok) throw new Error(`make serve did not hand out a token (${response.status})`);
  const body = await response.json();
  return fromToken(body.token, body.expiresIn);
}

function storageKey() {
  return config.auth.kind === "local" ? STORED_LOCAL : STORED;
}

/** The tab's session, unless it ends within a minute. */
function restored() {
  try {
    const stored = JSON.parse(sessionStorage.getItem(storageKey()) || "null");
    return stored && stored.expiresAt > Date.now() + 60e3 ? stored : null;
  } catch {
    return null;
  }
}

function home() {
  return new URL(".", location.href.split("#")[0].split("?")[0]).toString();
}

// --- Cognito's hosted UI: authorization code with PKCE ---

async function cognito(auth) {
  const query = new URLSearchParams(location.search);
  if (query.has("code") || query.has("error")) return finishSignIn(auth, query);
  const stored = restored();
  if (stored) return (current = stored);
  return redirectToSignIn(auth);
}

function base64url(bytes) {
  return btoa(String.fromCharCode(...new Uint8Array(bytes))).replaceAll("+", "-").replaceAll("/", "_")
    .replace(/=+$/, "");
}

/** Leaves for the hosted UI; never settles, so whatever waits on it (a renewal) waits, not sends again. */
async function redirectToSignIn(auth) {
  const verifier = base64url(crypto.getRandomValues(new Uint8Array(32)));
  const state = base64url(crypto.getRandomValues(new Uint8Array(16)));
  const challenge = base64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
  sessionStorage.setItem(PENDING, JSON.stringify({verifier, state, returnTo: location.hash}));
  const authorize = new URL("/oauth2/authorize", auth.domain);
  authorize.search = new URLSearchParams({
    response_type: "code", client_id: auth.clientId, redirect_uri: home(), scope: auth.scopes,
    state, code_challenge: challenge, code_challenge_method: "S256",
  }).toString();
  location.assign(authorize.toString());
  return new Promise(() => {}); // the page is leaving
}

/** A renewal the hosted UI must do (no refresh token: the tab was reloaded): asked first, so the
 *  page never leaves by itself under an edit, then to the hosted UI and back. */
async function signInAgain(auth) {
  const {askToSignInAgain} = await import("./token-form.js");
  await askToSignInAgain();
  return redirectToSignIn(auth);
}

async function finishSignIn(auth, query) {
  const pending = JSON.parse(sessionStorage.getItem(PENDING) || "null");
  sessionStorage.removeItem(PENDING);
  history.replaceState(null, "", home() + (pending?.returnTo || "")); // the code leaves the address bar
  if (query.has("error")) throw new Error(`sign-in refused: ${query.get("error_description") || query.get("error")}`);
  if (!pending || query.get("state") !== pending.state) throw new Error("sign-in answer does not match the request made");
  const body = await tokenRequest(auth, {grant_type: "authorization_code", code: query.get("code"),
                                         redirect_uri: home(), code_verifier: pending.verifier});
  return keep(fromToken(body.access_token, body.expires_in, {refreshToken: body.refresh_token}));
}

async function refresh(auth, refreshToken) {
  const body = await tokenRequest(auth, {grant_type: "refresh_token", refresh_token: refreshToken});
  return fromToken(body.access_token, body.expires_in, {refreshToken});
}

async function tokenRequest(auth, fields) {
  const response = await fetch(new URL("/oauth2/token", auth.domain), {
    method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"},
    body: new URLSearchParams({client_id: auth.clientId, ...fields}),
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok || !body.access_token) throw new Error(`token request failed: ${body.error || response.status}`);
  return body;
}

// --- a pasted token (another issuer) ---

async function pasted(again = false) {
  const stored = again ? null : restored();
  if (stored) return (current = stored);
  const {askForToken} = await import("./token-form.js");
  return keep(fromToken(await askForToken(again), null));
}
