"""Devices' identity writes over HTTP, through the real dev server (``localdev.server``) whose
DynamoDB is DynamoDB Local behind ``localdev/faults.py``'s forwarder: registering a credential
(``POST /devices/{id}/credentials``), revoking one (``DELETE .../credentials/{credentialId}``) and
a device provisioning itself by its enrollment (``POST /devices/{id}/provision``), each

- with DynamoDB's answers lost after the write landed (every send of its transaction, so the
  store's own resend under the same ClientRequestToken cannot tell), alone and with another
  writer landing in between;
- sent to a DynamoDB that never got it;
- with DynamoDB silent from the landing on (504 outcome-unknown: the only case it may answer);
- with DynamoDB Local stalled (SIGSTOP) as the transaction reaches it, briefly (the write is
  answered as it happened) and for longer than the server waits (504, and once DynamoDB resumes,
  what landed is there once at most), alone and with another writer queued behind it; the three
  verbs wait out each stall side by side, each on its own device.

Each answer is the truth: a success only when the write applied, once; a refusal only when
nothing was written. Beside them, naive controls: the same handler with its settling step
replaced by a plain resend (the write planned again from a fresh read) answers a write that
applied with a refusal (409, 404, 401)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import threading
import time
import uuid

import pytest

from functions.auth.principals import ADMIN_SCOPE
from functions.device_state import (CREDENTIAL_SK_PREFIX, SECRET, CredentialRecord, DeviceStateManager, MergePatch,
                                    dynamodb_client, new_credential_id, registered_credentials, table)
from functions.device_state.write.outcomes import NeverApplied
from functions.device_state.write.pipeline import WritePipeline
from functions.device_state.write.store import SEND_ATTEMPTS
from tests.api.test_http import launch
from tests.auth import assertion, bearer
from tests.conftest import new_table_name, table_admin
from tests.helpers import Stall, once
from tests.helpers import own_dynamodb_local  # noqa: F401 - this module stalls its own DynamoDB Local

pytestmark = pytest.mark.dynamodb_local

BETWEEN = pytest.mark.parametrize("between", [False, True], ids=["alone", "another-writer-between"])
TRANSACTION = "TransactWriteItems"
SETTLE_SECONDS = 2
BRIEF_STALL_SECONDS = 4.5  # past the server's 3 s read timeout: the first send's answer is lost
ADMIN = bearer((ADMIN_SCOPE,))


@pytest.fixture(scope="module")
def table_name(dynamodb_local):
    name = new_table_name()
    table.create_table(table_admin(dynamodb_local.endpoint), name, stream=False)  # its server runs no stream processor
    return name


@pytest.fixture(scope="module")
def server(forwarder, table_name):
    process, candidate = launch(DYNAMODB_ENDPOINT=forwarder.endpoint, TABLE_NAME=table_name, WORKERS="4",
                                STREAM_PROCESSOR="off", SETTLE_SECONDS=str(SETTLE_SECONDS))
    yield candidate
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(autouse=True)
def healthy(forwarder, dynamodb_local):
    """Each test starts and ends with DynamoDB answering and nothing armed."""
    yield
    dynamodb_local.resume()
    forwarder.faults.clear()
    forwarder.hooks.clear()
    forwarder.lost.clear()
    forwarder.unreachable = False


@pytest.fixture(scope="module")
def raw(dynamodb_local, table_name):
    """(a client straight to DynamoDB Local, the table's name)."""
    return dynamodb_client(dynamodb_local.endpoint, "us-east-1"), table_name


@pytest.fixture(scope="module")
def other(raw) -> DeviceStateManager:
    """Another writer, straight to DynamoDB Local."""
    return DeviceStateManager(*raw)


def call(server, method, path, body=None, headers=None, timeout=60) -> tuple[int, dict]:
    status, _, payload = server.request(method, path, body, headers=headers, timeout=timeout)
    return status, (json.loads(payload) if payload else {})


def new_device(server) -> str:
    device = f"d-{uuid.uuid4().hex[:10]}"
    assert call(server, "POST", "/devices", {"deviceId": device, "state": {"n": 0}})[0] == 201
    return device


def held(other, device) -> set[str]:
    """The credentials the device's state item names."""
    return set(registered_credentials(other.live_state(device)))


def credential_items(raw, device) -> set[str]:
    """The ids of every credential item in the device's partition (an orphan one too)."""
    client, name = raw
    answer = client.query(
        TableName=name, ConsistentRead=True,
        KeyConditionExpression="#p = :p AND begins_with(#s, :c)",
        ExpressionAttributeNames={"#p": table.PARTITION_KEY, "#s": table.SORT_KEY},
        ExpressionAttributeValues={":p": {"S": device}, ":c": {"S": CREDENTIAL_SK_PREFIX}})
    return {item[table.SORT_KEY]["S"].removeprefix(CREDENTIAL_SK_PREFIX) for item in answer["Items"]}


def secret_record(credential_id: str | None = None) -> CredentialRecord:
    """A secret credential (as provisioning makes one: of the id it is given)."""
    return CredentialRecord(credential_id or new_credential_id(), SECRET, secret=b"sealed")


def token_by_secret(server, device, credential_id, secret) -> tuple[int, dict]:
    signed = assertion(device, credential_id, base64.b64decode(secret))
    return call(server, "POST", f"/devices/{device}/token", headers={"Authorization": f"Bearer {signed}"})


def in_thread(action) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(action()), daemon=True)
    thread.start()
    return thread, result


def assert_outcome_unknown(server, status: int, problem: dict) -> None:
    """A 504 outcome-unknown; otherwise the server's log is printed (what it answered, and when)."""
    if status != 504:
        print(server.log[-4000:])
    assert status == 504 and problem["type"].endswith(":outcome-unknown"), problem


# ------------------------------------------------------------------ registering a credential


@pytest.mark.parametrize("between", [None, "another-credential", "the-device-deleted"])
def test_a_credential_registered_whose_answers_are_lost_is_201_once_and_its_secret_opens_the_device(
        server, forwarder, raw, other, between):
    device = new_device(server)
    another = secret_record()
    writers = {"another-credential": lambda: other.add_credential(device, another),
               "the-device-deleted": lambda: other.delete(device)}
    forwarder.lose(TRANSACTION, times=SEND_ATTEMPTS, then=once(writers[between]) if between else None)
    status, added = call(server, "POST", f"/devices/{device}/credentials", {"type": "secret"}, ADMIN)
    assert status == 201, added  # not 404 when the device went after it landed: it did apply
    assert forwarder.lost == [TRANSACTION] * SEND_ATTEMPTS
    if between == "the-device-deleted":  # it landed, once (a deleted device's items stay, named by no item)
        assert other.live_state(device) is None and credential_items(raw, device) == {added["credentialId"]}
        return
    expected = {added["credentialId"]} | ({another.credential_id} if between else set())
    assert held(other, device) == credential_items(raw, device) == expected
    assert token_by_secret(server, device, added["credentialId"], added["secret"])[0] == 200


@pytest.mark.parametrize("between", [None, "another-credential"])
def test_a_registration_taking_an_expired_credential_off_whose_answers_are_lost_is_201_once(
        server, forwarder, other, between):
    """The write that registers a credential also takes an expired one off the item: its answers
    lost, alone or with another registration landing between, it is settled as applied, once."""
    device = new_device(server)
    expiring = CredentialRecord(new_credential_id(), SECRET, secret=b"sealed", expires_at=int(time.time()) + 2)
    other.add_credential(device, expiring)
    time.sleep(2.2)
    another = secret_record()
    forwarder.lose(TRANSACTION, times=SEND_ATTEMPTS,
                   then=once(lambda: other.add_credential(device, another)) if between else None)
    status, added = call(server, "POST", f"/devices/{device}/credentials", {"type": "secret"}, ADMIN)
    assert status == 201, added
    assert forwarder.lost == [TRANSACTION] * SEND_ATTEMPTS
    assert held(other, device) == {added["credentialId"]} | ({another.credential_id} if between else set())


def test_a_credential_whose_transaction_never_reached_dynamodb_is_registered_once(
        server, forwarder, raw, other):
    device = new_device(server)
    forwarder.lose(TRANSACTION, times=SEND_ATTEMPTS, land=False)
    status, added = call(server, "POST", f"/devices/{device}/credentials", {"type": "secret"}, ADMIN)
    assert status == 201, added
    assert held(other, device) == credential_items(raw, device) == {added["credentialId"]}
    assert token_by_secret(server, device, added["credentialId"], added["secret"])[0] == 200


def test_a_credential_whose_outcome_dynamodb_never_tells_is_504_and_registered_at_most_once(
        server, forwarder, raw, other):
    device = new_device(server)
    forwarder.lose(TRANSACTION, then=lambda: setattr(forwarder, "unreachable", True))
    status, problem = call(server, "POST", f"/devices/{device}/credentials", {"type": "secret"}, ADMIN)
    assert_outcome_unknown(server, status, problem)
    forwarder.unreachable = False
    assert len(held(other, device)) == 1  # it landed, once
    assert held(other, device) == credential_items(raw, device)


# ------------------------------------------------------------------ revoking a credential


def registered_device(server) -> tuple[str, dict, str]:
    """A device with a secret credential and a device token minted from it."""
    device = new_device(server)
    status, added = call(server, "POST", f"/devices/{device}/credentials", {"type": "secret"}, ADMIN)
    assert status == 201, added
    status, minted = token_by_secret(server, device, added["credentialId"], added["secret"])
    assert status == 200, minted
    return device, added, minted["token"]


def shut_out(server, device, token) -> bool:
    status, problem = call(server, "GET", f"/devices/{device}", headers={"Authorization": f"Bearer {token}"})
    return status == 401 and problem["type"].endswith(":credential-revoked")


@pytest.mark.parametrize("between", [None, "a-state-write", "the-device-deleted"])
def test_a_revocation_whose_answers_are_lost_is_204_and_its_tokens_are_shut_out(
        server, forwarder, raw, other, between):
    device, added, token = registered_device(server)
    kept = other.add_credential(device, secret_record())
    writers = {"a-state-write": lambda: other.update_with_retry(device, MergePatch({"n": 1})),
               "the-device-deleted": lambda: other.delete(device)}
    forwarder.lose(TRANSACTION, times=SEND_ATTEMPTS, then=once(writers[between]) if between else None)
    path = f"/devices/{device}/credentials/{added['credentialId']}"
    status, answer = call(server, "DELETE", path, headers=ADMIN)
    assert status == 204, answer  # not 404: it was this request that revoked it
    assert forwarder.lost == [TRANSACTION] * SEND_ATTEMPTS
    if between == "the-device-deleted":  # it landed (a deleted device's items stay, named by no state item)
        assert other.live_state(device) is None and credential_items(raw, device) == {kept.credential_id}
        return
    assert held(other, device) == credential_items(raw, device) == {kept.credential_id}
    assert shut_out(server, device, token)
    assert other.get(device).state == {"n": 1 if between else 0}


def test_a_revocation_whose_transaction_never_reached_dynamodb_is_204_once(server, forwarder, raw, other):
    device, added, token = registered_device(server)
    forwarder.lose(TRANSACTION, times=SEND_ATTEMPTS, land=False)
    path = f"/devices/{device}/credentials/{added['credentialId']}"
    status, answer = call(server, "DELETE", path, headers=ADMIN)
    assert status == 204, answer
    assert held(other, device) == credential_items(raw, device) == set()
    assert shut_out(server, device, token)


def test_a_revocation_whose_outcome_dynamodb_never_tells_is_504_and_then_known(server, forwarder, raw, other):
    device, added, token = registered_device(server)
    forwarder.lose(TRANSACTION, then=lambda: setattr(forwarder, "unreachable", True))
    path = f"/devices/{device}/credentials/{added['credentialId']}"
    status, problem = call(server, "DELETE", path, headers=ADMIN)
    assert_outcome_unknown(server, status, problem)
    forwarder.unreachable = False
    assert held(other, device) == credential_items(raw, device) == set()  # it landed
    assert shut_out(server, device, token)
    assert call(server, "DELETE", path, headers=ADMIN)[0] == 404  # asked again: gone


# ------------------------------------------------------------------ provisioning


def derived_key(group_key: str, device: str) -> bytes:
    return hmac.new(base64.b64decode(group_key), device.encode(), hashlib.sha256).digest()


def new_enrollment(server, max_devices=10) -> tuple[str, str]:
    enrollment = f"e-{uuid.uuid4().hex[:10]}"
    status, created = call(server, "POST", "/enrollments", {
        "enrollmentId": enrollment, "idPattern": "p-[0-9a-f]{10}", "maxDevices": max_devices,
        "initial": {"desired": {"power": "on"}}}, ADMIN)
    assert status == 201, created
    return enrollment, created["groupKey"]


def provision(server, device, enrollment, group_key, timeout=60) -> tuple[int, dict]:
    signed = assertion(device, enrollment, derived_key(group_key, device))
    return call(server, "POST", f"/devices/{device}/provision", headers={"Authorization": f"Bearer {signed}"},
                timeout=timeout)


def provisioned_count(server, enrollment) -> int:
    status, found = call(server, "GET", f"/enrollments/{enrollment}", headers=ADMIN)
    assert status == 200, found
    return found["provisioned"]


def assert_provisioned_once(server, raw, other, device, enrollment, group_key, credential_id, version=1):
    assert provisioned_count(server, enrollment) == 1
    assert held(other, device) == credential_items(raw, device) == {credential_id}
    assert other.get(device).version == version and other.get(device).desired == {"power": "on"}
    again, answer = provision(server, device, enrollment, group_key)  # a device asking again: the same one
    assert (again, answer.get("credentialId")) == (200, credential_id), answer
    assert provisioned_count(server, enrollment) == 1


def new_device_id() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("between", [None, "a-write-of-the-device", "the-device-provisioning-again",
                                     "the-device-deleted"])
def test_a_provisioning_whose_answers_are_lost_is_201_once_and_counted_once(
        server, forwarder, raw, other, between):
    enrollment, group_key = new_enrollment(server)
    device = new_device_id()

    def another_writer():
        if between == "a-write-of-the-device":
            other.update_with_retry(device, MergePatch({"power": "off"}), section="desired")
        elif between == "the-device-deleted":
            other.delete(device)
        else:  # the same enrollment provisions it again, straight to DynamoDB: it finds it provisioned
            again = other.provision(device, other.enrollment(enrollment), secret_record, uuid.uuid4().hex,
                                    int(time.time()) + 300)
            assert not again.created
    forwarder.lose(TRANSACTION, times=SEND_ATTEMPTS, then=once(another_writer) if between else None)
    status, provisioned = provision(server, device, enrollment, group_key)
    assert status == 201, provisioned
    assert forwarder.lost == [TRANSACTION] * SEND_ATTEMPTS
    if between == "the-device-deleted":  # provisioned once, then deleted: not created again
        assert provisioned_count(server, enrollment) == 1 and other.live_state(device) is None
        assert credential_items(raw, device) == {provisioned["credentialId"]}
        return
    token = {"Authorization": f"Bearer {provisioned['token']}"}
    assert call(server, "GET", f"/devices/{device}", headers=token)[0] == 200
    if between == "a-write-of-the-device":
        other.update_with_retry(device, MergePatch({"power": "on"}), section="desired")
    versions = {None: 1, "a-write-of-the-device": 3, "the-device-provisioning-again": 1}
    assert_provisioned_once(server, raw, other, device, enrollment, group_key, provisioned["credentialId"],
                            version=versions[between])


def test_a_provisioning_whose_transaction_never_reached_dynamodb_is_201_once(server, forwarder, raw, other):
    enrollment, group_key = new_enrollment(server)
    device = new_device_id()
    forwarder.lose(TRANSACTION, times=SEND_ATTEMPTS, land=False)
    status, provisioned = provision(server, device, enrollment, group_key)
    assert status == 201, provisioned
    assert_provisioned_once(server, raw, other, device, enrollment, group_key, provisioned["credentialId"])


def test_a_provisioning_whose_outcome_dynamodb_never_tells_is_504_and_the_device_then_finds_itself(
        server, forwarder, raw, other):
    enrollment, group_key = new_enrollment(server)
    device = new_device_id()
    forwarder.lose(TRANSACTION, then=lambda: setattr(forwarder, "unreachable", True))
    status, problem = provision(server, device, enrollment, group_key)
    assert_outcome_unknown(server, status, problem)
    forwarder.unreachable = False
    [credential_id] = held(other, device)  # it landed
    assert_provisioned_once(server, raw, other, device, enrollment, group_key, credential_id)


# ------------------------------------------------------------------ DynamoDB Local stalled


class Stalled:
    """One verb's request against a stalled DynamoDB Local: ``send()`` answers (status, body);
    ``another()`` is another writer of the same items; ``stored()`` what is there to judge by."""

    def __init__(self, server, raw, other, verb):
        self.verb = verb
        if verb == "register":
            self.device = new_device(server)
            self.theirs = secret_record()
            self.send = lambda: call(server, "POST", f"/devices/{self.device}/credentials",
                                     {"type": "secret"}, ADMIN, timeout=120)
            self.another = lambda: other.add_credential(self.device, self.theirs)
        elif verb == "revoke":
            self.device, added, _ = registered_device(server)
            path = f"/devices/{self.device}/credentials/{added['credentialId']}"
            self.send = lambda: call(server, "DELETE", path, headers=ADMIN, timeout=120)
            self.another = lambda: other.update_with_retry(self.device, MergePatch({"n": 1}))
        else:
            self.enrollment, group_key = new_enrollment(server)
            self.device, neighbour = new_device_id(), new_device_id()
            self.send = lambda: provision(server, self.device, self.enrollment, group_key, timeout=120)
            # the same enrollment provisions another device, straight to DynamoDB
            self.another = lambda: other.provision(neighbour, other.enrollment(self.enrollment),
                                                   secret_record, uuid.uuid4().hex, int(time.time()) + 300)
        counted = verb == "provision"
        self.count = lambda: provisioned_count(server, self.enrollment) if counted else 0
        self.stored = lambda: (held(other, self.device), credential_items(raw, self.device), self.count())


@contextlib.contextmanager
def sent_into_one_stall(writes: list[Stalled], forwarder, dynamodb_local):
    """Each write sent, and DynamoDB Local stopped once every one's transaction has reached it:
    the three verbs wait out one stall together (each on its own device). Yields [(thread, its
    answers)] while the engine is stopped; resumed after."""
    stall = Stall(forwarder, dynamodb_local, TRANSACTION,
                  *(lambda body, device=write.device: json.dumps(device).encode() in body for write in writes))
    sent = [in_thread(write.send) for write in writes]
    try:
        assert stall.held(), f"transactions came for {[writes[index].verb for index in sorted(stall.came_for)]} only"
        yield sent
    finally:
        stall.disarm()
        dynamodb_local.resume()


VERBS = ("register", "revoke", "provision")


@BETWEEN
def test_a_write_dynamodb_stalls_under_briefly_is_answered_as_it_happened_once(
        server, forwarder, dynamodb_local, raw, other, between):
    writes = [Stalled(server, raw, other, verb) for verb in VERBS]
    before = [write.stored()[0] for write in writes]
    with sent_into_one_stall(writes, forwarder, dynamodb_local) as sent:
        writers = [in_thread(write.another)[0] for write in writes] if between else []  # queued behind, stalled too
        time.sleep(BRIEF_STALL_SECONDS)
    for thread in [request for request, _ in sent] + writers:
        thread.join(120)
    for write, was, (_, answered) in zip(writes, before, sent):
        [(status, answer)] = answered
        credentials, items, count = write.stored()
        assert credentials == items, write.verb
        if write.verb == "register":
            assert status == 201, answer
            theirs = {write.theirs.credential_id} if between else set()
            assert credentials == was | {answer["credentialId"]} | theirs
        elif write.verb == "revoke":
            assert status == 204, answer
            assert credentials == set() and other.get(write.device).state == {"n": 1 if between else 0}
        else:
            assert status == 201, answer
            assert credentials == {answer["credentialId"]} and count == 1 + between


def test_a_write_dynamodb_stalls_under_past_the_servers_patience_is_504_and_lands_at_most_once(
        server, forwarder, dynamodb_local, raw, other):
    writes = [Stalled(server, raw, other, verb) for verb in VERBS]
    before = [write.stored()[0] for write in writes]
    with sent_into_one_stall(writes, forwarder, dynamodb_local) as sent:
        for request, _ in sent:
            request.join(120)  # answered while DynamoDB is still stalled
    for _, [(status, problem)] in sent:
        assert_outcome_unknown(server, status, problem)
    time.sleep(1)  # what waited in the stalled engine lands, or is refused
    for write, was in zip(writes, before):
        credentials, items, count = write.stored()
        assert credentials == items, write.verb
        if write.verb == "register":
            assert was <= credentials and len(credentials - was) <= 1
        elif write.verb == "revoke":
            assert credentials in (was, set())
        else:
            assert len(credentials) == count <= 1


# ------------------------------------------------------------------ naive controls


@pytest.fixture
def engine(dynamodb_local, table_name):
    return dynamodb_client(dynamodb_local.endpoint, "us-east-1"), table_name


@pytest.fixture
def dynamodb_local_endpoint_for(forwarder, monkeypatch):
    monkeypatch.setenv("SETTLE_SECONDS", str(SETTLE_SECONDS))
    return lambda client: forwarder.endpoint  # the in-process handler talks to DynamoDB through the forwarder


@pytest.fixture
def plain_resend(monkeypatch):
    """The pipeline's settling step replaced by a plain resend: a write whose answers were lost
    is taken as never applied and planned again from a fresh read."""
    def resend(self, planned, lost):
        raise NeverApplied()
    monkeypatch.setattr(WritePipeline, "settle", resend)


def test_control_a_registration_resent_plainly_after_lost_answers_is_refused_409_though_it_applied(
        api, plain_resend, forwarder, other):
    device = f"d-{uuid.uuid4().hex[:10]}"
    other.create(device, {})
    forwarder.lose(TRANSACTION, times=SEND_ATTEMPTS)
    result = api("POST", f"/devices/{device}/credentials", {"type": "secret"}, headers=ADMIN)
    assert result.status == 409 and result.json["type"].endswith(":credential-exists")  # the caller told no
    assert len(held(other, device)) == 1  # yet it holds a credential whose secret nobody was shown


def test_control_a_revocation_resent_plainly_after_lost_answers_is_404_though_it_revoked(
        api, plain_resend, forwarder, other):
    device = f"d-{uuid.uuid4().hex[:10]}"
    other.create(device, {})
    revoked = other.add_credential(device, secret_record())
    forwarder.lose(TRANSACTION, times=SEND_ATTEMPTS)
    result = api("DELETE", f"/devices/{device}/credentials/{revoked.credential_id}", headers=ADMIN)
    assert result.status == 404 and result.json["type"].endswith(":credential-not-found")
    assert held(other, device) == set()  # this very request revoked it


def test_control_a_provisioning_resent_plainly_after_lost_answers_is_refused_401_though_it_provisioned(
        api, plain_resend, forwarder, other):
    created = api("POST", "/enrollments", {"idPattern": "p-.*", "maxDevices": 10}, headers=ADMIN).json
    device = new_device_id()
    forwarder.lose(TRANSACTION, times=SEND_ATTEMPTS)
    signed = assertion(device, created["enrollmentId"], derived_key(created["groupKey"], device))
    result = api("POST", f"/devices/{device}/provision", headers={"Authorization": f"Bearer {signed}"})
    assert result.status == 401 and result.json["type"].endswith(":assertion-replayed")
    assert len(held(other, device)) == 1 and other.enrollment(created["enrollmentId"]).provisioned == 1
