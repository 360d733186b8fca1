"""`/console` on the dev server: the browser console's static files (``console/``), its settings
(``config.json``, made per request: the WebSocket URL as this browser reached the server, the
declared fields) and, when the server trusts this checkout's own issuer, a token for the page
(``POST /console/local-token``), so that opening ``/console`` shows the fleet with no sign-in.

Only ``make serve`` serves any of this. The token route is the dev server's alone: the deployed
function never loads this module (it is not in the Lambda asset, ``functions/``), and the
deployed console's config.json (infra/console.py) names Cognito's hosted UI instead. It answers
only a loopback client that addressed the server by a loopback name (no DNS rebinding) with the
page's own header (``X-Console``, which no other origin may send without a CORS preflight that
this server never grants)."""

from __future__ import annotations

import ipaddress
import json
import mimetypes
from urllib.parse import urlsplit

from localdev.dynamodb_local import REPO_ROOT

CONSOLE_DIR = REPO_ROOT / "console"
PREFIX = "/console"
TOKEN_PATH = f"{PREFIX}/local-token"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".html": "text/html; charset=utf-8", ".json": "application/json", ".svg": "image/svg+xml"}

_issuer = None  # this checkout's issuer, when the server trusts it (configure)


def configure(issuer) -> None:
    """Before the workers fork: the issuer whose tokens the page gets (None: the page asks for one)."""
    global _issuer
    _issuer = issuer


def handles(path: str) -> bool:
    path = urlsplit(path).path
    return path == PREFIX or path.startswith(PREFIX + "/")


def content_security_policy(websocket_origin: str) -> str:
    """The page's policy: its own scripts and styles only (no inline script or style), calls to
    its own origin and WebSocket only, Trusted Types required (no string ever becomes HTML), never
    framed. The deployed distribution sends the same with its API's origins (infra/console.py)."""
    return ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
            f"connect-src 'self' {websocket_origin}; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; "
            "require-trusted-types-for 'script'; trusted-types 'none'")


def response(method: str, target: str, headers, client_address: str, tls: bool) -> tuple[int, dict, bytes]:
    """(status, headers, body) for a request under /console."""
    path = urlsplit(target).path
    host = headers.get("Host") or "127.0.0.1"
    websocket_origin = f"{'wss' if tls else 'ws'}://{host}"
    common = {"Content-Security-Policy": content_security_policy(websocket_origin),
              "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
              "Cache-Control": "no-cache"}
    if path == TOKEN_PATH:
        return _local_token(method, headers, client_address, common)
    if method not in ("GET", "HEAD"):
        return _text(405, "GET only\n", {**common, "Allow": "GET, HEAD"})
    if path == PREFIX:
        return 301, {**common, "Location": f"{PREFIX}/"}, b""
    name = path[len(PREFIX) + 1:] or "index.html"
    if name == "config.json":
        return 200, {**common, "Content-Type": TYPES[".json"]}, json.dumps(_config(websocket_origin)).encode()
    file = (CONSOLE_DIR / name).resolve()
    if not file.is_relative_to(CONSOLE_DIR.resolve()) or not file.is_file():
        return _text(404, "Not found\n", common)
    content_type = TYPES.get(file.suffix) or mimetypes.guess_type(file.name)[0] or "application/octet-stream"
    return 200, {**common, "Content-Type": content_type}, file.read_bytes()


def _config(websocket_origin: str) -> dict:
    from functions.config import fleet_index

    auth = {"kind": "local", "tokenPath": TOKEN_PATH} if _issuer is not None else {"kind": "token"}
    return {"api": "/", "webSocket": f"{websocket_origin}/ws", "auth": auth,
            "fleetFields": [{"path": field.path, "type": field.type} for field in fleet_index().fields]}


def _local_token(method: str, headers, client_address: str, common: dict) -> tuple[int, dict, bytes]:
    from functions.auth.principals import READ_SCOPE, WRITE_SCOPE
    from localdev.issuer import TOKEN_SECONDS

    if method != "POST":
        return _text(405, "POST only\n", {**common, "Allow": "POST"})
    if _issuer is None:
        return _text(404, "This server trusts another issuer (AUTH_JWKS): sign in with one of its tokens\n", common)
    if not (_loopback_address(client_address) and _loopback_host(headers.get("Host") or "")
            and headers.get("X-Console") == "1" and headers.get("Sec-Fetch-Site", "same-origin") == "same-origin"):
        return _text(403, "Only the console, on this machine, gets a token here\n", common)
    token = _issuer.token((READ_SCOPE, WRITE_SCOPE), lifetime=TOKEN_SECONDS)
    body = {"token": token, "tokenType": "Bearer", "expiresIn": TOKEN_SECONDS}
    return 200, {**common, "Content-Type": TYPES[".json"], "Cache-Control": "no-store"}, json.dumps(body).encode()


def _loopback_address(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.removeprefix("::ffff:")).is_loopback
    except ValueError:
        return False


def _loopback_host(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1:].split("]", 1)[0]
    return name in LOOPBACK_NAMES


def _text(status: int, text: str, headers: dict) -> tuple[int, dict, bytes]:
    return status, {**headers, "Content-Type": "text/plain; charset=utf-8"}, text.encode()


def signs_in() -> bool:
    """Whether the page is handed a token (the server trusts this checkout's issuer)."""
    return _issuer is not None
