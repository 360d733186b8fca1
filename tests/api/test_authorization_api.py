"""Who may call what, over the real dev server (its authorizer step, then the handler):
every principal kind against every route and every body shape of a write (the sections it
sets, in a route's body or a transaction's operation), with nothing written by a refusal."""

from __future__ import annotations

import itertools
import json
import re
import uuid

import pytest

from functions.api.routes import BY_ASSERTION, BY_METHOD_AND_RULE, PUBLIC
from functions.device_state import new_credential_id
from tests.api.test_http import server  # noqa: F401  (the real server, module scoped)
from tests.auth import NO_CREDENTIALS, bearer, token
from tests.unit.test_auth import BAD_TOKENS

pytestmark = pytest.mark.dynamodb_local
ADMIN = bearer()
MERGE = "application/merge-patch+json"
_numbers = itertools.count()


def _principals(device: str) -> dict:
    """Name -> headers, for a request about ``device``."""
    return {
        "none": NO_CREDENTIALS,
        "expired": {"Authorization": f"Bearer {token(exp=1_000_000, iat=999_000, nbf=999_000)}"},
        "nobody": bearer([]),
        "read": bearer(["devices.read"]),
        "write": bearer(["devices.write"]),
        "report": bearer(["devices.report"]),
        "write+report": bearer(["devices.write", "devices.report"]),
        "admin": bearer(["devices.admin"]),
        "self": bearer(device=device),
        "other": bearer(device=f"{device}-other"),
    }


# (method, path, body, content type, success status, the principals allowed). {d}: the device, {lease}: a lease
# a back-end holds on it ({fencing}: that lease's fencing token), {new}: a device id that does not exist yet.
# Scopes add up: "write+report" may do whatever "write" or "report" may, and what only both together may
# (a write that sets reported and something under the write right) names it alone.
CASES = [
    ("GET", "/devices", None, None, 200, {"read"}),
    ("GET", "/devices/count?filter=exists(state/site)", None, None, 200, {"read"}),
    ("GET", '/devices?filter=eq(state/site,"x")', None, None, 200, {"read"}),
    ("POST", "/devices", {"deviceId": "{new}", "state": {}}, "application/json", 201, {"write"}),
    ("POST", "/devices", {"deviceId": "{new}", "state": {}, "desired": {"p": 1}}, "application/json", 201, {"write"}),
    ("POST", "/devices", {"deviceId": "{new}", "state": {}, "reported": {"p": 1}}, "application/json", 201,
     {"write+report"}),
    ("POST", "/devices", {"deviceId": "{new}", "state": {}, "desired": {"p": 1}, "reported": {"p": 1}},
     "application/json", 201, {"write+report"}),
    ("GET", "/devices/{d}", None, None, 200, {"read", "self"}),
    ("HEAD", "/devices/{d}", None, None, 200, {"read", "self"}),
    ("PUT", "/devices/{d}", {"state": {"a": 1}}, "application/json", 200, {"write"}),
    ("PUT", "/devices/{d}", {"state": {"a": 1}, "desired": {"p": 1}}, "application/json", 200, {"write"}),
    ("PUT", "/devices/{d}", {"state": {"a": 1}, "reported": {"p": 1}}, "application/json", 200, {"write+report"}),
    ("PUT", "/devices/{d}", {"state": {"a": 1}, "desired": {"p": 1}, "reported": {"p": 1}}, "application/json", 200,
     {"write+report"}),
    ("PUT", "/devices/{new}", {"state": {}, "reported": {"p": 1}}, "application/json", 201, {"write+report"}),
    ("PATCH", "/devices/{d}", {"a": 2}, MERGE, 200, {"write"}),
    ("DELETE", "/devices/{d}", None, None, 204, {"write"}),
    ("PATCH", "/devices/{d}/desired", {"power": "on"}, MERGE, 200, {"write"}),
    ("PUT", "/devices/{d}/desired", {"desired": {"power": "on"}}, "application/json", 200, {"write"}),
    ("PATCH", "/devices/{d}/reported", {"power": "on"}, MERGE, 200, {"report", "self"}),
    ("PATCH", "/devices/{d}/desired?expiresIn=60&clearOnConfirm=true", {"power": "on"}, MERGE, 200, {"write"}),
    # the device has no desired leaf to answer: the allowed get as far as the 409 (desire-moved)
    ("POST", "/devices/{d}/desired/acks", {"acks": [{"path": "/power", "version": 1, "code": 400}]},
     "application/json", 409, {"report", "self"}),
    ("PUT", "/devices/{d}/reported", {"reported": {"power": "on"}}, "application/json", 200, {"report", "self"}),
    ("GET", "/devices/{d}/delta", None, None, 200, {"read", "self"}),
    ("GET", "/devices/{d}/versions/1", None, None, 200, {"read", "self"}),  # the current version
    ("GET", "/devices/{d}/changes?since=0", None, None, 200, {"read", "self"}),
    ("GET", "/devices/{d}/leases", None, None, 200, {"read", "self"}),
    ("POST", "/devices/{d}/leases", {"ttlSeconds": 30}, "application/json", 201, {"write", "self"}),
    ("PUT", "/devices/{d}/leases/{lease}", {"ttlSeconds": 30}, "application/json", 200, {"write", "self"}),
    ("DELETE", "/devices/{d}/leases/{lease}", None, None, 204, {"write", "self"}),
    ("DELETE", "/devices/{d}/leases/{fencing}", None, None, 204, {"write"}),  # end someone else's lease
    ("POST", "/devices/{d}/token", None, None, 200, {"self"}),  # a device token: the device's alone, no scope's
    # devices' identity: the admin scope's alone (the allowed get as far as the 404 of an id never registered)
    ("POST", "/devices/{d}/credentials", {"type": "secret"}, "application/json", 201, {"admin"}),
    ("GET", "/devices/{d}/credentials", None, None, 200, {"admin"}),
    ("DELETE", "/devices/{d}/credentials/{credential}", None, None, 404, {"admin"}),
    ("GET", "/devices/{d}/jobs", None, None, 200, {"read", "self"}),
    ("POST", "/jobs", {"deviceIds": ["{d}"], "desired": {"p": 1}}, "application/json", 201, {"write"}),
    ("GET", "/jobs", None, None, 200, {"read"}),
    ("GET", "/jobs/{job}", None, None, 404, {"read"}),
    ("GET", "/jobs/{job}/executions", None, None, 404, {"read"}),
    ("POST", "/jobs/{job}/cancel", None, None, 404, {"write"}),
    ("POST", "/enrollments", {"idPattern": "lamp-[0-9]+", "maxDevices": 1}, "application/json", 201, {"admin"}),
    ("GET", "/enrollments", None, None, 200, {"admin"}),
    ("GET", "/enrollments/{enrollment}", None, None, 404, {"admin"}),
    ("DELETE", "/enrollments/{enrollment}", None, None, 404, {"admin"}),
    ("POST", "/transactions", {"operations": [{"deviceId": "{d}", "mergePatch": {"a": 3}}]}, "application/json",
     200, {"write"}),
    ("POST", "/transactions", {"operations": [{"deviceId": "{d}", "mergePatch": {"p": 1}, "section": "reported"}]},
     "application/json", 200, {"report", "self"}),
    ("POST", "/transactions", {"operations": [{"deviceId": "{d}", "check": True}]}, "application/json", 200,
     {"read", "self"}),
    *[("POST", "/transactions", {"operations": [operation]}, "application/json", 200, allowed) for operation, allowed in [
        ({"deviceId": "{d}", "jsonPatch": [{"op": "add", "path": "/p", "value": 1}], "section": "desired"}, {"write"}),
        ({"deviceId": "{d}", "jsonPatch": [{"op": "add", "path": "/p", "value": 1}], "section": "reported"},
         {"report", "self"}),
        ({"deviceId": "{d}", "delete": True}, {"write"}),
        ({"deviceId": "{d}", "put": {"state": {"a": 1}}}, {"write"}),
        ({"deviceId": "{d}", "put": {"state": {"a": 1}, "desired": {"p": 1}}}, {"write"}),
        ({"deviceId": "{d}", "put": {"state": {"a": 1}, "reported": {"p": 1}}}, {"write+report"}),
        ({"deviceId": "{d}", "put": {"state": {"a": 1}, "desired": {"p": 1}, "reported": {"p": 1}}}, {"write+report"}),
        ({"deviceId": "{d}", "put": {"state": {"a": 1}, "reported": {"p": 1}}, "ifMatch": '"1"'}, {"write+report"}),
        ({"deviceId": "{new}", "put": {"state": {}}, "ifNoneMatch": "*"}, {"write"}),
        ({"deviceId": "{new}", "put": {"state": {}, "desired": {"p": 1}}, "ifNoneMatch": "*"}, {"write"}),
        ({"deviceId": "{new}", "put": {"state": {}, "reported": {"p": 1}}, "ifNoneMatch": "*"}, {"write+report"}),
    ]],
]
PRINCIPALS = list(_principals("x"))


def _may(principal: str, allowed: set) -> bool:
    return principal in allowed or (principal == "write+report" and bool({"write", "report"} & allowed))


def _shape(body) -> str:
    """A test id's word for a body: its members, a transaction's operation's too."""
    if not isinstance(body, dict):
        return ""
    operation = (body.get("operations") or [None])[0]
    if isinstance(operation, dict):
        return "+".join(key if not isinstance(value, dict) else f"{key}({'+'.join(value)})"
                        for key, value in operation.items() if key != "deviceId")
    return "+".join(key for key in body if key != "deviceId")


def _fill(value, names: dict):
    text = json.dumps(value) if not isinstance(value, str) else value
    for name, replacement in names.items():
        text = text.replace("{" + name + "}", replacement)
    return json.loads(text) if not isinstance(value, str) else text


def _snapshot(server, device: str) -> tuple:
    """What a refusal must leave as it was: the device (status, version) and its lease queue."""
    status, headers, _ = server.request("GET", f"/devices/{device}", headers=ADMIN)
    leases = json.loads(server.request("GET", f"/devices/{device}/leases", headers=ADMIN)[2])
    return status, headers.get("etag"), leases.get("holder"), leases.get("queue")


@pytest.mark.parametrize("principal", PRINCIPALS)
@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case[0]} {case[1]} {_shape(case[2])} "
                                                          f"{','.join(sorted(case[5]))}")
def test_each_principal_on_each_route(server, case, principal):
    method, path, body, content_type, success, allowed = case
    device, new = f"authz-{next(_numbers)}-{uuid.uuid4().hex[:6]}", f"authz-new-{uuid.uuid4().hex[:8]}"
    status, _, _ = server.request("POST", "/devices", {"deviceId": device, "state": {"a": 0}}, headers=ADMIN)
    assert status == 201
    names = {"d": device, "new": new, "credential": new_credential_id(), "enrollment": "no-such-line",
             "job": "no-such-job"}  # never registered
    if "{lease}" in path or "{fencing}" in path:
        status, _, grant = server.request("POST", f"/devices/{device}/leases", {"ttlSeconds": 60}, headers=ADMIN)
        assert status == 201
        names["lease"], names["fencing"] = json.loads(grant)["leaseId"], str(json.loads(grant)["fencingToken"])
    before = _snapshot(server, device)
    headers = dict(_principals(device)[principal])
    if content_type:
        headers["Content-Type"] = content_type
    raw = None if body is None else json.dumps(_fill(body, names)).encode()
    status, response_headers, payload = server.request(method, _fill(path, names), headers=headers, raw=raw)

    if _may(principal, allowed):
        assert status == success, payload
        return
    expected = 401 if principal in ("none", "expired") else 403
    assert status == expected, payload
    if method != "HEAD":
        problem = json.loads(payload)
        assert response_headers["content-type"] == "application/problem+json"
        assert problem["status"] == expected and problem["type"].endswith("unauthorized" if expected == 401
                                                                          else "forbidden")
    if expected == 401:
        assert response_headers["www-authenticate"] == (
            'Bearer error="invalid_token"' if principal == "expired" else "Bearer")
    assert _snapshot(server, device) == before  # nothing written
    assert server.request("GET", f"/devices/{new}", headers=ADMIN)[0] == 404


def test_the_table_covers_every_route():
    """Each registered route (a HEAD aside: it is its GET) appears in CASES."""
    covered = {(method, re.sub(r"\{\w+\}", "<x>", path.split("?")[0])) for method, path, *_ in CASES}
    for (method, rule), declaration in BY_METHOD_AND_RULE.items():
        if declaration.right in (PUBLIC, BY_ASSERTION):  # provisioning: test_identity_clients.py
            continue
        shape = re.sub(r"<\w+>", "<x>", rule).replace("/versions/<x>", "/versions/1")
        assert (method, shape) in covered or (method == "HEAD" and ("GET", shape) in covered), (method, rule)


def test_a_device_naming_another_device_learns_nothing_of_whether_it_exists(server):
    status, _, _ = server.request("POST", "/devices", {"deviceId": "exists-1", "state": {}}, headers=ADMIN)
    assert status in (201, 409)
    lamp = bearer(device="lamp-zz")
    for suffix in ("", "/changes", "/delta"):
        answers = []
        for device in ("exists-1", "ghost-1"):
            status, _, payload = server.request("GET", f"/devices/{device}{suffix}", headers=lamp)
            problem = json.loads(payload)  # refused before anything is read: what the request named, nothing more
            assert status == 403 and problem["detail"].startswith(f"read on device:{device}"), payload
            assert set(problem) == {"type", "title", "status", "detail", "instance", "action", "resource"}
            answers.append(payload.replace(device.encode(), b"<id>"))
        assert answers[0] == answers[1], answers
    assert server.request("GET", "/devices/ghost-1", headers=bearer(["devices.read"]))[0] == 404  # the control


def test_a_transaction_naming_a_foreign_device_is_refused_whole(server):
    for device in ("tx-own", "tx-foreign"):
        server.request("PUT", f"/devices/{device}", {"state": {"n": 0}}, headers=ADMIN)
    before = [server.request("GET", f"/devices/{device}", headers=ADMIN)[1]["etag"] for device in ("tx-own", "tx-foreign")]
    operations = [{"deviceId": "tx-own", "mergePatch": {"n": 1}, "section": "reported"},
                  {"deviceId": "tx-foreign", "mergePatch": {"n": 1}, "section": "reported"}]
    status, _, payload = server.request("POST", "/transactions", {"operations": operations},
                                        headers=bearer(device="tx-own"))
    problem = json.loads(payload)
    assert status == 403 and problem["index"] == 1 and problem["resource"] == "device:tx-foreign/reported", problem
    forbidden_section = [{"deviceId": "tx-own", "mergePatch": {"n": 1}, "section": "desired"}]
    status, _, payload = server.request("POST", "/transactions", {"operations": forbidden_section},
                                        headers=bearer(device="tx-own"))
    assert status == 403 and json.loads(payload)["index"] == 0
    after = [server.request("GET", f"/devices/{device}", headers=ADMIN)[1]["etag"] for device in ("tx-own", "tx-foreign")]
    assert after == before
    status, _, _ = server.request("POST", "/transactions", {"operations": operations[:1]},
                                  headers=bearer(device="tx-own"))
    assert status == 200  # the control: its own reported alone is allowed


def test_what_a_device_reported_is_written_only_under_the_report_right_whatever_the_route(server):
    """A devices.write caller could overwrite a device's reported section through PUT /devices/{id}
    or a transaction's put (the replace right), while PATCH …/reported refused it. Each write
    needs write on every section it sets: reported is the report right's, on every route."""
    device, other = (f"authz-reported-{name}-{uuid.uuid4().hex[:6]}" for name in ("a", "b"))
    for name in (device, other):
        assert server.request("POST", "/devices", {"deviceId": name, "state": {}}, headers=ADMIN)[0] == 201
    status, _, _ = server.request("PATCH", f"/devices/{device}/reported", {"power": "off"},
                                  headers={**bearer(device=device), "Content-Type": MERGE})
    assert status == 200
    writer, both = bearer(["devices.write"]), bearer(["devices.write", "devices.report"])
    before = [_snapshot(server, name) for name in (device, other)]
    overwrite = {"state": {"owner": "app"}, "reported": {"power": "on"}}

    refusals = [
        ("PUT", f"/devices/{device}", overwrite, None),
        ("POST", "/transactions", {"operations": [{"deviceId": device, "put": overwrite}]}, 0),
        ("POST", "/transactions", {"operations": [{"deviceId": other, "mergePatch": {"p": 1}, "section": "desired"},
                                                  {"deviceId": device, "put": overwrite, "ifMatch": '"2"'}]}, 1),
    ]
    for method, path, body, index in refusals:
        status, _, payload = server.request(method, path, body, headers=writer)
        problem = json.loads(payload)
        assert status == 403 and (problem["action"], problem["resource"]) == ("write", f"device:{device}/reported"), \
            problem
        assert problem.get("index") == index
    assert [_snapshot(server, name) for name in (device, other)] == before  # the versions unmoved: nothing written
    status, _, payload = server.request("GET", f"/devices/{device}", headers=ADMIN)
    assert json.loads(payload)["reported"] == {"power": "off"}

    status, _, payload = server.request("PUT", f"/devices/{device}", overwrite, headers=both)  # the control
    assert status == 200 and json.loads(payload)["reported"] == {"power": "on"}, payload
    status, _, payload = server.request("PUT", f"/devices/{device}", overwrite, headers=bearer(["devices.report"]))
    assert status == 403, payload  # the report right alone never replaces a device's state


def test_a_request_with_a_token_and_an_unknown_method_still_gets_405(server):
    status, headers, _ = server.request("OPTIONS", "/devices/lamp-1", headers=bearer(device="lamp-1"))
    assert status == 405 and "GET" in headers["allow"]
    # the method is no route's, whoever asks: nothing about the device is read or said
    assert server.request("OPTIONS", "/devices/lamp-1", headers=NO_CREDENTIALS)[0] == 405


@pytest.mark.parametrize("kind", sorted(BAD_TOKENS))
def test_every_bad_token_is_401_over_http_and_writes_nothing(server, kind):
    device = f"bad-token-{uuid.uuid4().hex[:8]}"
    assert server.request("POST", "/devices", {"deviceId": device, "state": {"n": 0}}, headers=ADMIN)[0] == 201
    before = _snapshot(server, device)
    status, headers, payload = server.request("PATCH", f"/devices/{device}", {"n": 1}, headers={
        "Authorization": f"Bearer {BAD_TOKENS[kind]()}", "Content-Type": MERGE})
    assert status == 401 and headers["www-authenticate"] == 'Bearer error="invalid_token"', payload
    assert json.loads(payload)["type"].endswith("unauthorized")
    assert _snapshot(server, device) == before


def test_a_device_cannot_lock_out_its_owners(server):
    """Issue 27 row 4: a device leased itself for 900 s and heartbeated forever; every back-end
    write, DELETE included, answered 423 and no back-end could end the lease. Now a device's
    lease is capped at 60 s, and a back-end with the write right ends it by the fencing token
    that ``GET …/leases`` shows; the holder's next heartbeat is 410 and its token writes nothing."""
    device = f"authz-lockout-{uuid.uuid4().hex[:6]}"
    lamp, writer, reader = bearer(device=device), bearer(["devices.write"]), bearer(["devices.read"])
    assert server.request("POST", "/devices", {"deviceId": device, "state": {}}, headers=ADMIN)[0] == 201
    leases = f"/devices/{device}/leases"

    status, _, body = server.request("POST", leases, {"ttlSeconds": 900}, headers=lamp)
    assert status == 400 and "60" in json.loads(body)["detail"], body
    status, _, body = server.request("POST", leases, {"ttlSeconds": 60, "owner": "lamp"}, headers=lamp)
    assert status == 201, body
    grant = json.loads(body)
    beat = f"{leases}/{grant['leaseId']}"
    assert server.request("PUT", beat, {"ttlSeconds": 900}, headers=lamp)[0] == 400  # no longer by heartbeat
    assert server.request("PUT", beat, {"ttlSeconds": 60}, headers=lamp)[0] == 200
    desired = {**writer, "Content-Type": MERGE}
    assert server.request("PATCH", f"/devices/{device}/desired", {"power": "on"}, headers=desired)[0] == 423

    status, _, body = server.request("GET", leases, headers=reader)  # what it takes to end it, and no secret
    assert status == 200 and json.loads(body)["holder"]["fencingToken"] == grant["fencingToken"]
    assert grant["leaseId"] not in body.decode() and grant["leaseToken"] not in body.decode()
    end = f"{leases}/{grant['fencingToken']}"
    assert server.request("DELETE", end, headers=reader)[0] == 403  # ending is the write right's
    assert server.request("DELETE", end, headers=lamp)[0] == 403  # and never a device's
    assert server.request("DELETE", end, headers=writer)[0] == 204
    assert json.loads(server.request("GET", leases, headers=reader)[2])["holder"] is None

    status, _, body = server.request("PUT", beat, headers=lamp)  # the holder's next heartbeat
    assert status == 410 and json.loads(body)["type"].endswith("lease-gone"), body
    version = json.loads(server.request("GET", f"/devices/{device}", headers=ADMIN)[2])["version"]
    status, _, body = server.request("PATCH", f"/devices/{device}/reported", {"power": "off"},
                                     headers={**lamp, "Content-Type": MERGE, "Lease-Token": grant["leaseToken"]})
    assert status == 409 and json.loads(body)["type"].endswith("lease-not-held"), body
    assert json.loads(server.request("GET", f"/devices/{device}", headers=ADMIN)[2])["version"] == version
    assert server.request("PATCH", f"/devices/{device}/desired", {"power": "on"}, headers=desired)[0] == 200
    assert server.request("DELETE", end, headers=writer)[0] == 204  # ended already: still 204
    assert server.request("DELETE", f"/devices/{device}", headers=writer)[0] == 204
