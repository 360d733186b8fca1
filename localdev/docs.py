"""`GET /docs` on the dev server: Swagger UI (the pinned npm package ``swagger-ui-dist``,
served from node_modules) over the API's own ``/openapi.json``. Only ``make serve`` serves
it; the deployed function has no such route and never loads this module."""

from __future__ import annotations

import mimetypes

from localdev.dynamodb_local import REPO_ROOT

SWAGGER_UI_DIR = REPO_ROOT / "node_modules" / "swagger-ui-dist"
PREFIX = "/docs"

PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Device-state API</title>
  <link rel="stylesheet" href="/docs/swagger-ui.css">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="/docs/swagger-ui-bundle.js"></script>
  <script src="/docs/swagger-ui-standalone-preset.js"></script>
  <script>
    window.ui = SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui",
                                 presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
                                 layout: "StandaloneLayout"});
  </script>
</body>
</html>
"""


def handles(path: str) -> bool:
    path = path.split("?", 1)[0]
    return path == PREFIX or path.startswith(PREFIX + "/")


def response(path: str) -> tuple[int, dict, bytes]:
    """(status, headers, body) for a GET under /docs."""
    path = path.split("?", 1)[0]
    name = path[len(PREFIX):].lstrip("/")
    if name in ("", "index.html"):
        return 200, {"Content-Type": "text/html; charset=utf-8"}, PAGE.encode()
    if not SWAGGER_UI_DIR.is_dir():
        return 503, {"Content-Type": "text/plain"}, b"swagger-ui-dist is missing: run `make setup`\n"
    file = (SWAGGER_UI_DIR / name).resolve()
    if not file.is_relative_to(SWAGGER_UI_DIR.resolve()) or not file.is_file():
        return 404, {"Content-Type": "text/plain"}, b"Not found\n"
    content_type = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
    return 200, {"Content-Type": content_type, "Cache-Control": "max-age=3600"}, file.read_bytes()
