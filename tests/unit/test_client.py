"""dynamodb_client() can be pointed anywhere from the environment, as docs/library.md tells a
script to: DYNAMODB_ENDPOINT, then AWS_REGION before AWS_DEFAULT_REGION; arguments win. A new
client signs with the credentials the environment holds when it is made."""

import contextlib
import http.server
import uuid

import botocore.session
import pytest

from functions.device_state import dynamodb_client, new_client
from tests.helpers import served


@pytest.fixture(autouse=True)
def fresh_clients(monkeypatch):
    for name in ("DYNAMODB_ENDPOINT", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    dynamodb_client.cache_clear()
    yield
    dynamodb_client.cache_clear()


def test_the_endpoint_comes_from_dynamodb_endpoint(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("DYNAMODB_ENDPOINT", "http://127.0.0.1:8123")
    assert dynamodb_client().meta.endpoint_url == "http://127.0.0.1:8123"


def test_aws_region_comes_before_aws_default_region(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert dynamodb_client().meta.region_name == "eu-west-1"


def test_aws_default_region_when_aws_region_is_unset(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    assert dynamodb_client().meta.region_name == "ap-south-1"


def test_arguments_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("DYNAMODB_ENDPOINT", "http://127.0.0.1:8123")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    client = dynamodb_client("http://127.0.0.1:9000", "us-west-2")
    assert (client.meta.endpoint_url, client.meta.region_name) == ("http://127.0.0.1:9000", "us-west-2")


def test_one_client_per_endpoint_and_region(monkeypatch):
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("DYNAMODB_ENDPOINT", "http://127.0.0.1:8123")
    first = dynamodb_client()
    assert dynamodb_client() is first
    monkeypatch.setenv("DYNAMODB_ENDPOINT", "http://127.0.0.1:8124")
    assert dynamodb_client() is not first


@contextlib.contextmanager
def signatures_received():
    """(endpoint, the Authorization headers it received): a local server answering any request."""
    seen = []

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(self.headers["Authorization"])
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"TableNames": []}'
            self.send_response(200)
            self.send_header("Content-Type", "application/x-amz-json-1.0")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    stop = served(server)
    try:
        yield f"http://127.0.0.1:{server.server_port}", seen
    finally:
        stop()


@pytest.fixture
def sessions(monkeypatch) -> list:
    """The boto3 sessions made from here on, in order; a secret key set for them."""
    made = []
    original = botocore.session.get_session
    monkeypatch.setattr(botocore.session, "get_session", lambda *a, **k: made.append(original(*a, **k)) or made[-1])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    return made


def new_key() -> str:
    """An access key id no earlier test used: an environment no session was made for."""
    return f"AKIA{uuid.uuid4().hex[:12].upper()}"


def test_a_new_client_signs_with_the_credentials_the_environment_holds_now(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    with signatures_received() as (endpoint, seen):
        for key in ("AKIAFIRSTKEY", "AKIASECONDKEY", "AKIAFIRSTKEY"):
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
            new_client("dynamodb", region_name="us-east-1", endpoint_url=endpoint).list_tables()
    assert [header.split("Credential=", 1)[1].split("/", 1)[0] for header in seen] == [
        "AKIAFIRSTKEY", "AKIASECONDKEY", "AKIAFIRSTKEY"]


def test_clients_made_in_the_same_environment_share_one_session(monkeypatch, sessions):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", new_key())
    first, second = new_client("dynamodb", region_name="us-east-1"), new_client("dynamodb", region_name="us-east-1")
    assert first is not second and len(sessions) == 1
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", new_key())
    new_client("dynamodb", region_name="us-east-1")
    assert len(sessions) == 2


def test_sessions_are_bounded_however_many_environments_come(monkeypatch, sessions):
    from functions.device_state import client

    first_key = new_key()
    for key in [first_key] + [new_key() for _ in range(client.MAX_SESSIONS)]:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        new_client("dynamodb", region_name="us-east-1")
    assert len(sessions) == client.MAX_SESSIONS + 1
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", first_key)  # the oldest, dropped: made again
    new_client("dynamodb", region_name="us-east-1")
    assert len(sessions) == client.MAX_SESSIONS + 2


def test_a_snapstart_restore_makes_sessions_afresh(monkeypatch, sessions):
    """A restored copy resolves its credentials again (Lambda gives each copy its own)."""
    from functions.device_state import restore

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", new_key())
    new_client("dynamodb", region_name="us-east-1")
    new_client("dynamodb", region_name="us-east-1")
    restore.after_restore()
    new_client("dynamodb", region_name="us-east-1")
    assert len(sessions) == 2
