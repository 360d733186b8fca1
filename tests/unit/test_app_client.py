"""The app client's requests (clients/python, ``AppClient``), against the scripted HTTP server of
tests/unit/test_device_client.py: each write's shape and its Idempotency-Key, kept across
retries after 429, 503 and 504 as Retry-After says; refusals typed by problem type and status
with the problem's members; a lease's grant sent again only after answers that wrote nothing;
pages read only as the caller reaches them; a job's cancel under its key and a job followed by
long-polls on its ETag; exact numbers both ways; tokens from a command,
renewed at 80 % of their life and after a 401. The real routes: tests/api/test_app_client.py."""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import socket
import sys
import threading
import time
import urllib.error
from decimal import Decimal
from itertools import islice

import pytest

from tests.helpers import served
from tests.make_serve import REPO_ROOT
from tests.unit.test_device_client import ScriptedServer, scripted  # noqa: F401 - the fixture

sys.path.insert(0, str(REPO_ROOT / "clients" / "python"))
from device_state_client import (AppClient, ApiError, ChangesExpired, CommandCredentials, Conflict,  # noqa: E402
                                 CredentialsError, DeviceClient, DeviceExists, NotFound, OutcomeUnknown,
                                 PreconditionFailed, ServerError, TokenCredentials, TransactionFailed, Unprocessable)
from device_state_client import errors  # noqa: E402

DEVICE = {"deviceId": "lamp-1", "version": 4, "state": {}, "desired": {}, "reported": {}, "delta": {}}
UNKNOWN = {"type": "urn:device-state:problem:outcome-unknown", "status": 504, "title": "The change may or may not "
           "have been applied", "detail": "lost"}


def _client(server: ScriptedServer, sleeps=None, credentials=None) -> AppClient:
    return AppClient(f"http://127.0.0.1:{server.port}", credentials or TokenCredentials("t0k"),
                     sleep=(sleeps.append if sleeps is not None else lambda seconds: None))


def _problem(status: int, slug: str, **members) -> dict:
    return {"type": f"urn:device-state:problem:{slug}", "title": slug, "status": status, "detail": slug, **members}


def test_a_write_keeps_its_idempotency_key_and_body_across_429_503_and_504_waiting_as_retry_after_says(scripted):
    server = scripted((429, {"Retry-After": "2"}, _problem(429, "signing-throttled")),
                      (503, {"Retry-After": "1"}, _problem(503, "contention")), (504, {}, UNKNOWN),
                      (200, {"Idempotent-Replayed": "true"}, DEVICE))
    sleeps = []
    assert _client(server, sleeps).patch("lamp-1", [{"op": "increment", "path": "/n", "value": 1}]) == DEVICE
    assert sleeps[:2] == [2.0, 1.0] and 0 < sleeps[2] <= 2  # the 504 has no Retry-After: a backoff
    keys = {headers["Idempotency-Key"] for _, _, headers, _, _ in server.requests}
    assert len(server.requests) == 4 and len(keys) == 1 and len(set(server.raw)) == 1


def test_a_refusal_is_not_sent_again_and_one_outcome_unknown_to_the_last_attempt_is_raised(scripted):
    refused = scripted((422, {}, _problem(422, "idempotency-key-reused")))
    with pytest.raises(Unprocessable):
        _client(refused).create("lamp-1")
    assert len(refused.requests) == 1
    unknown = scripted((504, {}, UNKNOWN))
    client = _client(unknown)
    client.write_attempts = 3
    with pytest.raises(OutcomeUnknown) as lost:
        client.delete("lamp-1")
    assert len(unknown.requests) == 3 and lost.value.slug == "outcome-unknown"
    assert {headers["Idempotency-Key"] for _, _, headers, _, _ in unknown.requests} == {lost.value.idempotency_key}



class HangingUp:
    """Reads each of the first ``hangups`` requests whole and closes the connection without an
    answer (a write that may have applied), then stops listening: later copies are refused
    their connection and never reach it."""

    def __init__(self, hangups: int):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port, self.keys = self.listener.getsockname()[1], []
        threading.Thread(target=self._serve, args=(hangups,), daemon=True).start()

    def _serve(self, hangups: int):
        for _ in range(hangups):
            connection, _ = self.listener.accept()
            with connection:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += connection.recv(65536)
                head, body = data.split(b"\r\n\r\n", 1)
                headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
                while len(body) < int(headers.get("Content-Length", 0)):
                    body += connection.recv(65536)
                self.keys.append(headers["Idempotency-Key"])
        self.listener.close()


@pytest.mark.parametrize("hangups", [1, 3], ids=["first-copy-then-refused", "every-copy"])
def test_a_write_whose_copy_reached_the_service_unanswered_ends_unknown_whatever_follows(hangups):
    """A copy read whole and not answered may have applied: OutcomeUnknown, with its key, also
    when the later copies find no connection (they say nothing of the first)."""
    server = HangingUp(hangups)
    client = AppClient(f"http://127.0.0.1:{server.port}", TokenCredentials("t0k"), sleep=lambda seconds: None)
    client.write_attempts = 3
    with pytest.raises(OutcomeUnknown) as unknown:
        client.patch("lamp-1", [{"op": "increment", "path": "/n", "value": 1}])
    assert server.keys and set(server.keys) == {unknown.value.idempotency_key}
    assert f"Idempotency-Key {unknown.value.idempotency_key}" in unknown.value.problem["detail"]


def test_a_token_that_could_not_be_had_before_a_write_is_no_copy_of_it(scripted):
    """Device credentials exchange a token before the write: that exchange unanswered is not an
    unanswered copy of the write (nothing of it was sent), so it is not OutcomeUnknown."""
    class Unreachable(TokenCredentials):
        def bearer_token(self, client, renew=False):
            raise http.client.RemoteDisconnected("the token exchange went unanswered")

    server = scripted((200, {}, DEVICE))
    client = AppClient(f"http://127.0.0.1:{server.port}", Unreachable("t0k"), sleep=lambda seconds: None)
    client.write_attempts = 2
    with pytest.raises(http.client.RemoteDisconnected) as failed:
        client.patch("lamp-1", [{"op": "increment", "path": "/n", "value": 1}], idempotency_key="k-3")
    assert not isinstance(failed.value, OutcomeUnknown) and failed.value.idempotency_key == "k-3"
    assert server.requests == []

@pytest.mark.parametrize("call", [lambda c: c.get("lamp-1"), lambda c: c.create("lamp-1", {"state": {}})],
                         ids=["GET", "POST"])
def test_a_redirect_is_answered_as_it_is_never_followed_with_the_token(scripted, call):
    """An endpoint answering 301 (http:// behind a load balancer that sends to https://): followed,
    urllib sends a POST on as a GET and the token to the host ``Location`` names."""
    with socket.create_server(("127.0.0.1", 0)) as elsewhere:
        elsewhere.settimeout(0.2)
        location = f"http://localhost:{elsewhere.getsockname()[1]}/devices"
        server = scripted((301, {"Location": location}, b""))
        client = _client(server)
        client.timeout = 2  # followed, the request would wait on ``elsewhere``'s backlog
        with pytest.raises(ApiError) as redirected:
            call(client)
        with pytest.raises(TimeoutError):
            elsewhere.accept()  # nothing went on
    assert redirected.value.status == 301 and location in redirected.value.problem["detail"]
    assert len(server.requests) == 1


def test_an_empty_id_is_refused_before_anything_is_sent(scripted):
    """``devices/`` and ``jobs/`` name the collections: an empty id would read the fleet's first
    page as if it were the device."""
    server = scripted((200, {}, {"items": [], "nextCursor": None}))
    client = _client(server)
    for call in (lambda: client.get(""), lambda: client.job(""), lambda: client.delete(""),
                 lambda: DeviceClient(f"http://127.0.0.1:{server.port}", "", TokenCredentials("t0k"))):
        with pytest.raises(ValueError, match="not empty"):
            call()
    assert server.requests == []


def test_a_body_past_the_apis_1_mib_is_refused_413_before_it_is_sent(scripted):
    """Sent, the API refuses it before reading it whole and closes: the client would meet a
    broken pipe and call a write nothing could apply unknown (and send it again, in vain)."""
    server = scripted((200, {}, DEVICE))
    client = _client(server)
    with pytest.raises(ApiError) as refused:
        client.patch("lamp-1", {"blob": "x" * (1024 * 1024)}, idempotency_key="k-5")
    assert refused.value.status == 413 and not isinstance(refused.value, OutcomeUnknown)
    assert refused.value.idempotency_key == "k-5" and server.requests == []


class FailingRenewal(TokenCredentials):
    """A token until it is refused; then its renewal fails (the token command's service down)."""

    renews_refused_tokens = True

    def bearer_token(self, client=None, renew: bool = False):
        if renew:
            raise CredentialsError("the token command exited 1: the issuer is down")
        return super().bearer_token(client)


@pytest.mark.parametrize("first", [(504, {}, UNKNOWN), None], ids=["first-copy-unanswered", "no-copy-before"])
def test_a_write_whose_token_cannot_be_renewed_is_unknown_once_a_copy_went_unanswered(scripted, first):
    """A copy unanswered, then a 401 whose token cannot be renewed: the first copy may have
    applied, so OutcomeUnknown under its key (a credentials error says nothing of it); with no
    copy sent before, the credentials error, carrying the key (nothing was written)."""
    server = scripted(*[answer for answer in (first, (401, {}, _problem(401, "unauthorized"))) if answer])
    client = _client(server, credentials=FailingRenewal("t0k"))
    client.write_attempts = 3
    expected = OutcomeUnknown if first else CredentialsError
    with pytest.raises(expected) as failed:
        client.patch("lamp-1", [{"op": "increment", "path": "/n", "value": 1}], idempotency_key="k-4")
    assert failed.value.idempotency_key == "k-4"
    assert {headers["Idempotency-Key"] for _, _, headers, _, _ in server.requests} == {"k-4"}


def test_a_write_no_copy_of_which_reached_the_service_raises_its_connection_error_with_its_key():
    """Nothing listens: no copy was sent, nothing was written, and the error says so by its type."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
    client = AppClient(f"http://127.0.0.1:{port}", TokenCredentials("t0k"), sleep=lambda seconds: None)
    client.write_attempts = 2
    with pytest.raises(urllib.error.URLError) as refused:
        client.patch("lamp-1", [{"op": "increment", "path": "/n", "value": 1}], idempotency_key="k-2")
    assert not isinstance(refused.value, OutcomeUnknown) and refused.value.idempotency_key == "k-2"


@pytest.mark.parametrize("first", [(504, {}, UNKNOWN), (502, {}, b"<html>bad gateway</html>"),
                                   (200, {}, b"<html>a proxy's page</html>")], ids=["504", "502", "200-no-json"])
@pytest.mark.parametrize("last", [503, 429, 401])
def test_a_write_whose_first_copy_went_unanswered_ends_unknown_under_its_key_not_refused(scripted, first, last):
    """Its first copy may have applied: a last answer given before the key is looked at (a token
    run out, throttling, a busy service) says nothing of it, so the write is OutcomeUnknown and
    names the key to send it again under (asking again under a new key would apply it twice)."""
    server = scripted(first, (last, {"Retry-After": "0"}, _problem(last, "said-nothing")))
    client = _client(server)
    client.write_attempts = 3
    with pytest.raises(OutcomeUnknown) as unknown:
        client.patch("lamp-1", [{"op": "increment", "path": "/n", "value": 1}])
    keys = {headers["Idempotency-Key"] for _, _, headers, _, _ in server.requests}
    assert keys == {unknown.value.idempotency_key} and len(server.requests) >= 2


def test_control_a_write_every_copy_of_which_was_answered_503_is_unavailable_under_its_key(scripted):
    server = scripted((503, {"Retry-After": "0"}, _problem(503, "contention")))
    client = _client(server)
    client.write_attempts = 3
    with pytest.raises(errors.Unavailable) as busy:
        client.patch("lamp-1", [{"op": "increment", "path": "/n", "value": 1}], idempotency_key="k-9")
    assert busy.value.idempotency_key == "k-9" and len(server.requests) == 3


CALLS = [  # (call on the client, method, path, Content-Type, headers it must carry, body)
    (lambda c: c.create("lamp:1", {"state": {"on": True}, "desired": {"on": False}}), "POST", "/devices",
     "application/json", {}, {"deviceId": "lamp:1", "state": {"on": True}, "desired": {"on": False}}),
    (lambda c: c.create("lamp-1", metadata=True), "POST", "/devices?include=metadata", "application/json", {},
     {"deviceId": "lamp-1", "state": {}}),
    (lambda c: c.create("lamp-2", {"desired": {"on": True}}), "POST", "/devices", "application/json", {},
     {"deviceId": "lamp-2", "state": {}, "desired": {"on": True}}),  # the state the API asks for
    (lambda c: c.put("lamp-1", {"state": {}}, if_match=3), "PUT", "/devices/lamp-1", "application/json",
     {"If-Match": '"3"'}, {"state": {}}),
    (lambda c: c.put("lamp-1", {"state": {}}, create_only=True), "PUT", "/devices/lamp-1", "application/json",
     {"If-None-Match": "*"}, {"state": {}}),
    (lambda c: c.patch("lamp/1", {"on": None}, lease_token="ab" * 16), "PATCH", "/devices/lamp%2F1",
     "application/merge-patch+json", {"Lease-Token": "ab" * 16}, {"on": None}),
    (lambda c: c.patch("lamp-1", [{"op": "test", "path": "/on", "value": True}], if_match=2), "PATCH",
     "/devices/lamp-1", "application/json-patch+json", {"If-Match": '"2"'}, [{"op": "test", "path": "/on",
                                                                               "value": True}]),
    (lambda c: c.desire("lamp-1", {"power": "on"}, expires_in=60, clear_on_confirm=True), "PATCH",
     "/devices/lamp-1/desired?expiresIn=60&clearOnConfirm=true", "application/merge-patch+json", {},
     {"power": "on"}),
    (lambda c: c.report("lamp-1", {"power": "on"}), "PATCH", "/devices/lamp-1/reported",
     "application/merge-patch+json", {}, {"power": "on"}),
    (lambda c: c.transaction([{"deviceId": "lamp-1", "check": True}], metadata=True), "POST",
     "/transactions?include=metadata", "application/json", {}, {"operations": [{"deviceId": "lamp-1",
                                                                                   "check": True}]}),
    (lambda c: c.delete("lamp-1", if_match=7), "DELETE", "/devices/lamp-1", None, {"If-Match": '"7"'}, None),
    (lambda c: c.create_job({"mode": "eco"}, filter='eq(state/site,"porch")', job_id="porch-eco", expires_in=60,
                            clear_on_confirm=True, max_per_minute=10, timeout_seconds=120, continuous=True,
                            ends_at="2026-12-01T00:00:00Z",
                            abort=[{"on": "FAILED", "thresholdPercent": Decimal("12.5"), "minExecuted": 8}]),
     "POST", "/jobs", "application/json", {},
     {"jobId": "porch-eco", "filter": 'eq(state/site,"porch")', "desired": {"mode": "eco"}, "expiresIn": 60,
      "clearOnConfirm": True, "rollout": {"maxPerMinute": 10},
      "abort": [{"on": "FAILED", "thresholdPercent": Decimal("12.5"), "minExecuted": 8}], "timeoutSeconds": 120,
      "targets": "continuous", "endsAt": "2026-12-01T00:00:00Z"}),
    (lambda c: c.create_job({"mode": "eco"}, device_ids=("lamp-1", "lamp-2")), "POST", "/jobs", "application/json",
     {}, {"deviceIds": ["lamp-1", "lamp-2"], "desired": {"mode": "eco"}}),
]


@pytest.mark.parametrize("call, method, path, content_type, headers, body", CALLS)
def test_each_write_is_sent_as_the_contract_says_under_a_key_of_its_own(scripted, call, method, path,
                                                                        content_type, headers, body):
    server = scripted((200, {}, DEVICE))
    client = _client(server)
    call(client)
    call(client)
    (sent_method, sent_path, sent_headers, sent_body, _), second = server.requests
    assert (sent_method, sent_path, sent_body) == (method, path, body)
    assert sent_headers.get("Content-Type") == content_type and sent_headers["Authorization"] == "Bearer t0k"
    assert {name: sent_headers.get(name) for name in headers} == headers
    assert sent_headers["Idempotency-Key"] != second[2]["Idempotency-Key"]  # each call is a change of its own


@pytest.mark.parametrize("status, problem, kind, members", [
    (412, _problem(412, "version-conflict", deviceId="lamp-1", currentVersion=4), PreconditionFailed,
     {"device_id": "lamp-1", "current_version": 4}),
    (409, _problem(409, "device-exists", deviceId="lamp-1", currentVersion=1), DeviceExists,
     {"current_version": 1}),
    (404, _problem(404, "device-not-found", deviceId="lamp-9"), NotFound, {"device_id": "lamp-9"}),
    (410, _problem(410, "changes-expired", currentVersion=30), ChangesExpired, {"current_version": 30}),
    (412, _problem(412, "transaction-failed", operations=[{"index": 1, "status": 412}]), TransactionFailed,
     {"operations": [{"index": 1, "status": 412}]}),
    (400, _problem(400, "invalid-filter", position=21), errors.BadRequest, {"position": 21, "limit": None}),
    (423, _problem(423, "locked", leaseExpiresAt="2026-01-01T00:00:00.000Z"), errors.Locked,
     {"lease_expires_at": "2026-01-01T00:00:00.000Z"}),
    (500, _problem(500, "internal-error"), ServerError, {}),
    (400, _problem(400, "invalid-job", member="desired"), errors.InvalidJob, {"member": "desired"}),
    (404, _problem(404, "job-not-found", jobId="eco"), errors.JobNotFound, {"job_id": "eco"}),
    (409, _problem(409, "job-exists", jobId="eco"), errors.JobExists, {"job_id": "eco"}),
    (409, _problem(409, "job-ended", jobId="eco", jobStatus="COMPLETED"), errors.JobEnded,
     {"job_id": "eco", "job_status": "COMPLETED"}),
])
def test_a_refusal_is_raised_as_its_problem_type_with_the_problems_members(scripted, status, problem, kind,
                                                                          members):
    server = scripted((status, {"Content-Type": "application/problem+json"}, problem))
    client = _client(server)
    client.write_attempts = 1
    with pytest.raises(kind) as refused:
        client.get("lamp-1")
    assert isinstance(refused.value, ApiError) and refused.value.status == status
    assert refused.value.slug == problem["type"].rsplit(":", 1)[1] and refused.value.problem == problem
    assert {name: getattr(refused.value, name) for name in members} == members
    assert isinstance(refused.value, Conflict) == (status == 409)


JOB = {"jobId": "eco", "status": "CANCELED", "counts": {"QUEUED": 0, "CANCELED": 2}, "total": 2}
ENDED = (409, {}, _problem(409, "job-ended", jobId="eco", jobStatus="CANCELED"))


def test_a_cancel_goes_under_a_key_kept_across_its_resends_and_job_ended_is_raised(scripted):
    server = scripted((504, {"Retry-After": "0"}, _problem(504, "outcome-unknown")), (200, {}, JOB))
    assert _client(server).cancel_job("eco", force=True) == JOB
    (method, path, first, body, _), (_, again_path, second, _, _) = server.requests
    assert (method, path, again_path, body) == ("POST", "/jobs/eco/cancel?force=true", path, None)
    assert first["Idempotency-Key"] and second["Idempotency-Key"] == first["Idempotency-Key"]
    named = scripted((200, {}, JOB))
    assert _client(named).cancel_job("eco", idempotency_key="mine") == JOB
    assert [(path, headers["Idempotency-Key"]) for _, path, headers, _, _ in named.requests] == [
        ("/jobs/eco/cancel", "mine")]
    with pytest.raises(errors.JobEnded):  # the service's word, as it is: no reading of it
        _client(scripted(ENDED)).cancel_job("eco")


def test_following_a_job_long_polls_on_its_etag_and_ends_once_nothing_is_left_to_happen(scripted):
    running = {**JOB, "status": "IN_PROGRESS", "counts": {"QUEUED": 1, "IN_PROGRESS": 1}}
    final = {**JOB, "status": "IN_PROGRESS", "counts": {"QUEUED": 0, "IN_PROGRESS": 0, "SUCCEEDED": 2}}
    server = scripted((200, {"ETag": '"a"'}, running), (304, {"ETag": '"a"'}, None), (200, {"ETag": '"b"'}, final),
                      (200, {"ETag": '"c"'}, running))
    assert list(islice(_client(server).follow_job("eco", wait_seconds=7), 4)) == [running, final]
    assert [(path, headers.get("If-None-Match")) for _, path, headers, _, _ in server.requests] == [
        ("/jobs/eco", None), ("/jobs/eco?waitSeconds=7", '"a"'), ("/jobs/eco?waitSeconds=7", '"a"')]
    continuous = {**final, "targets": "continuous"}  # devices may still come to match
    server = scripted((200, {"ETag": '"a"'}, continuous), (200, {"ETag": '"b"'}, {**continuous, "status": "CANCELED"}))
    assert [job["status"] for job in islice(_client(server).follow_job("eco"), 4)] == ["IN_PROGRESS", "CANCELED"]


def test_a_lease_grant_is_sent_again_only_after_answers_that_wrote_nothing(scripted):
    grant = {"deviceId": "lamp-1", "leaseId": "1.ab", "leaseToken": "cd" * 16, "fencingToken": 3,
             "expiresAt": "2026-01-01T00:00:00.000Z", "ttlSeconds": 60}
    busy = scripted((503, {"Retry-After": "0"}, _problem(503, "contention")), (201, {}, grant), (204, {}, None))
    with _client(busy).lease("lamp-1", ttl_seconds=60, wait_seconds=5, owner="job", heartbeat=False) as lease:
        assert (lease.token, lease.fencing_token) == ("cd" * 16, 3)
    assert [(method, path) for method, path, *_ in busy.requests] == [
        ("POST", "/devices/lamp-1/leases"), ("POST", "/devices/lamp-1/leases"), ("DELETE", "/devices/lamp-1/leases/1.ab")]
    assert busy.requests[0][3] == {"ttlSeconds": 60, "waitSeconds": 5, "owner": "job"}
    unknown = scripted((504, {}, UNKNOWN))
    with pytest.raises(OutcomeUnknown):  # a second grant would queue a second ticket behind the first
        _client(unknown).lease("lamp-1")
    assert len(unknown.requests) == 1


def test_a_held_lease_heartbeats_every_half_ttl_and_says_when_it_was_lost(scripted):
    grant = {"deviceId": "lamp-1", "leaseId": "1.ab", "leaseToken": "cd" * 16, "fencingToken": 3,
             "expiresAt": "2026-01-01T00:00:00.000Z", "ttlSeconds": 0.2}
    server = scripted((201, {}, grant), (200, {}, {**grant, "expiresAt": "2026-01-01T00:00:01.000Z"}),
                      (410, {}, _problem(410, "lease-gone")), (204, {}, None))
    lost = []
    with _client(server).lease("lamp-1", ttl_seconds=0.2, on_lost=lost.append) as lease:
        deadline = time.monotonic() + 5
        while not lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lease.expires_at == "2026-01-01T00:00:01.000Z" and lease.lost is lost[0]
    assert [method for method, *_ in server.requests] == ["POST", "PUT", "PUT", "DELETE"]
    assert lost[0].slug == "lease-gone"


@pytest.mark.parametrize("answer", ["cut off", "token command fails"])
def test_a_lease_whose_heartbeats_get_no_answer_past_its_ttl_says_it_was_lost(scripted, answer):
    """Each heartbeat's answer is a proxy's page (not JSON), or the token cannot be renewed: the
    heartbeats go on while the lease may still be held, and once its ttl has passed since the
    last one answered it is lost (the lease may be another's), where the heartbeat thread died
    at the first such failure and the holder went on as if it held it."""
    from device_state_client.credentials import CredentialsError

    grant = {"deviceId": "lamp-1", "leaseId": "1.ab", "leaseToken": "cd" * 16, "fencingToken": 3,
             "expiresAt": "2026-01-01T00:00:00.000Z", "ttlSeconds": 0.4}
    server = scripted((201, {}, grant), (200, {}, b"<html>a proxy's page</html>"))
    client, lost = _client(server), []
    lease = client.lease("lamp-1", ttl_seconds=0.4, on_lost=lost.append)
    if answer == "token command fails":
        def no_token():
            raise CredentialsError("the token command exited 7")
        client.request = lambda *args, **kwargs: no_token()
    deadline = time.monotonic() + 10
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lost and lease.lost is lost[0] and lost[0].slug == "lease-gone"
    assert "no heartbeat answered within the lease's 0.4 s" in lost[0].problem["detail"]
    lease._stop.set()


def test_a_heartbeat_answered_after_a_retry_holds_the_lease_from_the_copy_answered(scripted, monkeypatch):
    """The service extends the lease when it answers: from the copy it answered (after a 503 and
    its wait), not from the first copy sent, or a later beat's failure would call a lease lost
    that the service still holds."""
    from types import SimpleNamespace

    from device_state_client import app

    grant = {"deviceId": "lamp-1", "leaseId": "1.ab", "leaseToken": "cd" * 16, "fencingToken": 3,
             "expiresAt": "2026-01-01T00:00:00.000Z", "ttlSeconds": 30}
    server = scripted((201, {}, grant), (503, {"Retry-After": "0"}, _problem(503, "busy")),
                      (200, {}, {**grant, "expiresAt": "2026-01-01T00:00:35.000Z"}))
    now = [100.0]
    monkeypatch.setattr(app, "time", SimpleNamespace(monotonic=lambda: now[0]))

    def waited(seconds):  # the 503's wait, and the time its answer took
        now[0] += 20

    client = _client(server, sleeps=[])
    client.sleep = waited
    lease = client.lease("lamp-1", ttl_seconds=30, heartbeat=False)
    assert lease.held_until == 130
    lease.heartbeat()
    assert lease.held_until == 150 and lease.expires_at == "2026-01-01T00:00:35.000Z"


def test_a_retry_after_longer_than_a_minute_is_answered_not_waited_out(scripted):
    """A proxy asking for a day is the caller's to decide on: the refusal, at once, not a day's sleep."""
    from device_state_client.errors import ApiError

    server = scripted((503, {"Retry-After": "86400"}, _problem(503, "busy")))
    sleeps = []
    with pytest.raises(ApiError) as refused:
        _client(server, sleeps).get("lamp-1")
    assert refused.value.status == 503 and sleeps == [] and len(server.requests) == 1


def test_a_listing_reads_each_page_only_when_the_caller_reaches_it(scripted):
    first = {"items": [{"deviceId": "a"}, {"deviceId": "b"}], "nextCursor": "61.7374617465"}
    server = scripted((200, {}, first), (200, {}, {"items": [{"deviceId": "c"}], "nextCursor": None}))
    client = _client(server)
    devices = client.list(filter='eq(state/site,"x y")', sort="-reported/battery", page_size=2)
    assert next(devices)["deviceId"] == "a" and len(server.requests) == 1
    assert [device["deviceId"] for device in devices] == ["b", "c"]
    assert [path for _, path, *_ in server.requests] == [
        "/devices?filter=eq%28state%2Fsite%2C%22x+y%22%29&sort=-reported%2Fbattery&limit=2",
        "/devices?filter=eq%28state%2Fsite%2C%22x+y%22%29&sort=-reported%2Fbattery&limit=2&cursor=61.7374617465"]
    limited = scripted((200, {}, first))
    assert [device["deviceId"] for device in _client(limited).list(limit=1)] == ["a"]
    assert [path for _, path, *_ in limited.requests] == ["/devices?limit=1"]


def test_the_enrollments_are_listed_page_after_page(scripted):
    server = scripted((200, {}, {"items": [{"enrollmentId": "a"}], "nextCursor": "61.62"}),
                      (200, {}, {"items": [{"enrollmentId": "b"}], "nextCursor": None}))
    assert [enrollment["enrollmentId"] for enrollment in _client(server).list_enrollments()] == ["a", "b"]
    assert [path for _, path, *_ in server.requests] == ["/enrollments", "/enrollments?cursor=61.62"]


def test_the_change_feed_is_read_to_its_end_or_followed_with_long_polls(scripted):
    change = {"deviceId": "lamp-1", "version": 2, "previousVersion": 1, "kind": "updated"}
    server = scripted((200, {}, {"changes": [change], "nextSince": 2}), (200, {}, {"changes": [], "nextSince": 2}))
    assert list(_client(server).changes("lamp-1", since=1)) == [change]
    assert [path for _, path, *_ in server.requests] == ["/devices/lamp-1/changes?since=1&limit=100",
                                                         "/devices/lamp-1/changes?since=2&limit=100"]
    followed = scripted((200, {}, {"changes": [], "nextSince": 2}), (200, {}, {"changes": [change], "nextSince": 2}))
    assert next(iter(_client(followed).changes("lamp-1", since=1, follow=True, wait_seconds=5))) == change
    assert followed.requests[0][1] == "/devices/lamp-1/changes?since=1&limit=100&waitSeconds=5"


def test_numbers_go_out_and_come_back_with_every_digit(scripted):
    exact = Decimal("0.10000000000000000000000000000000000001")
    server = scripted((200, {}, b'{"deviceId": "lamp-1", "version": 2, "state": {"level": 1.10, "big": 1E+41}}'))
    answer = _client(server).patch("lamp-1", {"level": exact, "count": 3})
    assert b'"level": 0.10000000000000000000000000000000000001' in server.raw[0]
    assert answer["state"] == {"level": Decimal("1.10"), "big": Decimal("1E+41")}
    assert str(answer["state"]["level"]) == "1.10"


def test_following_ends_when_a_renewed_token_is_refused_too_and_tells_each_reconnect():
    """A WebSocket API that refuses every connect 401: the follower renews its token once, and
    when the renewed one is refused too, renewing cannot cure it (a FollowError, not a silent
    retry forever); ``on_reconnect`` hears why each connection ended."""
    from device_state_client.follow import FollowError

    class Refusing(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    stop = served(server)
    try:
        client = AppClient(f"http://127.0.0.1:{server.server_port}", CommandCredentials("echo t0k"))
        told, ended = [], []
        follower = client.follow(["lamp-1"], since=0, on_reconnect=told.append)

        def follow():
            try:
                next(iter(follower))
            except Exception as error:  # noqa: BLE001 - what ended it is the test's
                ended.append(error)
        following = threading.Thread(target=follow, daemon=True)
        following.start()
        following.join(30)  # a follower that renews without end never returns
        assert len(ended) == 1 and isinstance(ended[0], FollowError) and "renewed too" in str(ended[0]), told
        assert len(told) == 1 and "401" in told[0]
    finally:
        stop()


def test_following_takes_one_to_a_hundred_devices_on_its_one_connection(scripted):
    client = _client(scripted((200, {}, DEVICE)))
    for devices in ([], [f"lamp-{number}" for number in range(101)]):
        with pytest.raises(ValueError):
            client.follow(devices, since=0)
    assert client.follow(["lamp-1", "lamp-2", "lamp-1"], since={"lamp-2": 5}).positions == {"lamp-1": 0, "lamp-2": 5}


def _jwt(exp: float) -> str:
    part = base64.urlsafe_b64encode(json.dumps({"exp": exp}).encode()).rstrip(b"=").decode()
    return f"e30.{part}.sig"


def test_a_token_command_runs_again_at_80_percent_of_the_tokens_life_and_after_a_401(scripted, tmp_path):
    runs, token_file = tmp_path / "runs", tmp_path / "token"
    now = [1_000_000.0]
    token_file.write_text(_jwt(now[0] + 100) + "\n")
    credentials = CommandCredentials(f"echo run >> {runs}; cat {token_file}", clock=lambda: now[0])
    server = scripted((200, {}, DEVICE), (200, {}, DEVICE), (200, {}, DEVICE),
                      (401, {}, _problem(401, "unauthorized")), (200, {}, DEVICE))
    client = _client(server, credentials=credentials)
    client.get("lamp-1")
    now[0] += 79
    client.get("lamp-1")
    assert runs.read_text().count("run") == 1  # still young
    now[0] += 2
    client.get("lamp-1")
    assert runs.read_text().count("run") == 2
    client.get("lamp-1")  # 401: the command runs again and the request goes once more
    assert runs.read_text().count("run") == 3 and len(server.requests) == 5


def test_a_token_command_may_print_an_oauth_answer_and_a_failing_one_says_why(tmp_path):
    now = [50.0]
    answer = json.dumps({"access_token": "opaque-token", "expires_in": 3600, "token_type": "Bearer"})
    credentials = CommandCredentials(f"echo '{answer}'", clock=lambda: now[0])
    assert credentials.bearer_token() == "opaque-token"
    now[0] += 0.8 * 3600 - 1
    assert credentials.bearer_token() == "opaque-token"
    with pytest.raises(CredentialsError, match="exited 3: .*no key"):
        CommandCredentials("echo no key >&2; exit 3").bearer_token()
    for printed in ("echo two words", """echo '{"access_token": 5}'""", """echo '{"token": ["a"]}'"""):
        with pytest.raises(CredentialsError, match="no single token"):  # not a TypeError's traceback
            CommandCredentials(printed).bearer_token()
    with pytest.raises(CredentialsError, match="DEVICE_STATE_TOKEN_NOT_SET"):
        TokenCredentials.from_environment("DEVICE_STATE_TOKEN_NOT_SET")


@pytest.mark.parametrize("connected_first", [True, False], ids=["after-a-connection", "never-connected"])
def test_a_follow_whose_token_command_fails_once_connects_again_rather_than_ending(monkeypatch, connected_first):
    """A watch outlives a token hiccup: once a connection was made, a connect that could not get a
    token is tried again after the backoff, as a refused connect is, where the follow (and the
    watch) ended. A token command that never worked ends it at once (exit 2), not a loop."""
    import contextlib

    from device_state_client import follow as follow_module
    from device_state_client.credentials import CredentialsError
    from device_state_client.follow import FollowError, Follower

    class Flaky:
        renewable, calls = True, 0

        def bearer_token(self, client=None, renew=False):
            self.calls += 1
            if connected_first and self.calls == 1:
                return "t0k"
            raise CredentialsError("the token command exited 7")

    client = type("Client", (), {"credentials": Flaky(), "websocket_url": "ws://127.0.0.1:9/ws"})()
    monkeypatch.setattr(follow_module, "connect", lambda *args, **kwargs: contextlib.nullcontext("socket"))
    follower = Follower(client, {"lamp-1": 0}, None, read_device=None, read_version=None, read_changes=None,
                        backoff=type("NoWait", (), {"next_delay": lambda self: 0.0})())

    def dropped(websocket):  # the connection drops at once
        raise OSError("connection reset")
        yield

    monkeypatch.setattr(follower, "_follow", dropped)
    reasons = []

    class Enough(Exception):
        pass

    def ended(error):  # the follower's own reconnect bookkeeping, stopped after the third
        reasons.append(error)
        if len(reasons) == 3:
            raise Enough

    monkeypatch.setattr(follower, "_ended", ended)
    if not connected_first:
        with pytest.raises(FollowError, match="exited 7"):
            next(iter(follower))
        assert client.credentials.calls == 1
        return
    with pytest.raises(Enough):
        next(iter(follower))
    assert client.credentials.calls == 3 and isinstance(reasons[0], OSError)
    assert all(isinstance(reason, CredentialsError) for reason in reasons[1:])
