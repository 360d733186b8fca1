"""`make serve` as the README describes it: on-disk data at a relative DYNAMODB_DATA_DIR,
Swagger UI on /docs with both URLs printed at start; the deployed handler has no /docs; a
DescribeTable slower than the library's read timeout stops none of its processes."""

from __future__ import annotations

import json
import shutil
import uuid

import pytest

from functions.device_state.client import READ_TIMEOUT_SECONDS
from localdev.faults import Forwarder
from tests.make_serve import REPO_ROOT, checkout_bearer, get, make_serve

pytestmark = pytest.mark.dynamodb_local


def post_device(port: int, device_id: str) -> int:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/devices", body=json.dumps({"deviceId": device_id, "state": {"n": 1}}),
                           headers={"Content-Type": "application/json", **checkout_bearer()})
        return connection.getresponse().status
    finally:
        connection.close()


def test_a_relative_data_dir_is_taken_from_where_make_runs_and_keeps_data_across_restarts():
    relative = f".dynamodb-local/test-{uuid.uuid4().hex[:8]}"  # .gitignored, as the README's example
    try:
        with make_serve(DYNAMODB_DATA_DIR=relative) as served:
            assert post_device(served.port, "kept") == 201
            assert f"on disk in {relative}" in served.output
        assert any((REPO_ROOT / relative).iterdir())  # the database file is there, not in node_modules
        with make_serve(DYNAMODB_DATA_DIR=relative) as served:
            status, _, body = get(served.port, "/devices/kept")
            assert status == 200 and json.loads(body)["state"] == {"n": 1}
    finally:
        shutil.rmtree(REPO_ROOT / relative, ignore_errors=True)


def test_a_describe_table_slower_than_the_librarys_read_timeout_stops_no_process(dynamodb_local):
    """DynamoDB Local counts a table's items at each DescribeTable: about 2 s at 100,000 devices on a
    2-core machine, more than the library's read timeout once several processes ask at once. The
    stream processor and the push fan-out read the table's stream ARN from it as they start; given
    the library's client, each timed out, exited and was replaced until the server stopped for
    workers exiting too often, and the console's benchmark found nothing listening."""
    forwarder = Forwarder(dynamodb_local.port)
    forwarder.slow["DescribeTable"] = READ_TIMEOUT_SECONDS + 1
    try:
        with make_serve(DYNAMODB_ENDPOINT=forwarder.endpoint, TABLE_NAME=f"slow-{uuid.uuid4().hex[:8]}") as served:
            assert post_device(served.port, "slow-1") == 201
            status, _, body = get(served.port, "/devices/slow-1/changes?since=0&waitSeconds=20")
            assert status == 200 and [change["version"] for change in json.loads(body)["changes"]] == [1], body
            assert "exited unexpectedly" not in served.output, served.output
    finally:
        forwarder.close()


@pytest.fixture(scope="module")
def served():
    with make_serve() as served:
        yield served


def test_make_serve_prints_the_api_and_docs_urls(served):
    assert f"http://127.0.0.1:{served.port} " in served.output
    assert f"http://127.0.0.1:{served.port}/docs" in served.output
    assert f"http://127.0.0.1:{served.port}/openapi.json" in served.output


def test_docs_serve_swagger_ui_over_the_openapi_document(served):
    status, headers, body = get(served.port, "/docs")
    assert status == 200 and headers["content-type"].startswith("text/html")
    page = body.decode()
    assert 'url: "/openapi.json"' in page
    for asset in ("/docs/swagger-ui-bundle.js", "/docs/swagger-ui-standalone-preset.js", "/docs/swagger-ui.css"):
        assert asset in page
        status, headers, body = get(served.port, asset)
        shipped = (REPO_ROOT / "node_modules" / "swagger-ui-dist" / asset.rsplit("/", 1)[1]).read_bytes()
        assert status == 200 and body == shipped, asset
    assert "javascript" in get(served.port, "/docs/swagger-ui-bundle.js")[1]["content-type"]
    assert get(served.port, "/docs/../package.json")[0] == 404
    assert get(served.port, "/docs/%2e%2e/package.json")[0] == 404
    assert get(served.port, "/openapi.json")[0] == 200


def test_swagger_ui_is_pinned_and_the_deployed_api_has_no_docs_route():
    package = json.loads((REPO_ROOT / "package.json").read_text())
    assert package["devDependencies"]["swagger-ui-dist"].split(".")[0].isdigit()  # an exact version
    from functions.api.routes import ROUTES  # every route the deployed function answers

    assert not any(declaration.rule.startswith("/docs") for declaration in ROUTES)
    for source in (REPO_ROOT / "functions").rglob("*.py"):
        assert "localdev" not in source.read_text() and "swagger" not in source.read_text().lower(), source


def test_a_busy_port_is_one_clear_line_and_a_failed_exit():
    import os
    import socket
    import subprocess

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        env = {key: value for key, value in os.environ.items() if key != "DYNAMODB_ENDPOINT"}
        result = subprocess.run(["make", "-s", "serve"], cwd=REPO_ROOT, env=dict(env, PORT=str(port)),
                                capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output and "DynamoDB Local on" not in output, output
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in output, output
