"""Credential writes and provisioning whose DynamoDB answers are lost (every send of their
transaction, so the store's own resend cannot tell either), alone and with another writer
landing in between, apply once and answer truthfully: the state item's part carries a journal
entry, and the pipeline settles by it. Naive controls in the same harness apply twice."""

from __future__ import annotations

import time

import boto3
import pytest
from botocore.config import Config

from functions.device_state import SECRET, CredentialRecord, DeviceStateManager, Enrollment, new_credential_id, table
from functions.device_state.client import dynamodb_client
from functions.device_state.item.credentials import registered
from localdev.faults import Forwarder
from tests.helpers import once

pytestmark = pytest.mark.dynamodb_local
BETWEEN = pytest.mark.parametrize("between", [False, True], ids=["alone", "another-writer-between"])
SENDS = 3  # the store sends a transaction with a ClientRequestToken at most this often


class Rig:
    def __init__(self, dynamodb_local, client, name):
        self.forwarder = Forwarder(dynamodb_local.port)
        self.client, self.name = client, name
        self.manager = DeviceStateManager(dynamodb_client(self.forwarder.endpoint, "us-east-1"), name,
                                          settle_seconds=2)
        self.other = DeviceStateManager(client, name)

    def held(self, device_id) -> dict:
        return registered(self.other.live_state(device_id))


@pytest.fixture
def rig(dynamodb_local, local_table):
    rig = Rig(dynamodb_local, *local_table)
    yield rig
    rig.forwarder.close()


def secret_credential(credential_id: str | None = None) -> CredentialRecord:
    """A secret credential (as provisioning makes one: of the id it is given)."""
    return CredentialRecord(credential_id or new_credential_id(), SECRET, secret=b"sealed")


@BETWEEN
def test_a_credential_added_with_its_answers_lost_is_registered_once(rig, between):
    rig.other.create("lamp", {})
    other = secret_credential()
    rig.forwarder.lose("TransactWriteItems", times=SENDS,
                       then=once(lambda: rig.other.add_credential("lamp", other)) if between else None)
    added = rig.manager.add_credential("lamp", secret_credential())
    assert rig.forwarder.lost == ["TransactWriteItems"] * SENDS
    assert set(rig.held("lamp")) == {added.credential_id} | ({other.credential_id} if between else set())
    assert {record.credential_id for record in rig.other.credentials("lamp")} == set(rig.held("lamp"))


@BETWEEN
def test_a_certificate_registered_with_its_answers_lost_holds_one_entry_of_its_own(rig, between):
    """A certificate's entry is drawn at each attempt (its registration's own): every send of the
    first attempt lost, the settle finds it applied, so the item holds that attempt's entry alone,
    not a second one of another attempt."""
    from functions.device_state import CERTIFICATE, CredentialExists, certificate_id
    from functions.device_state.item.credentials import CERTIFICATE_NEVER, entries

    rig.other.create("lamp", {})
    thumbprint = "ab" * 32
    certificate = CredentialRecord(certificate_id(bytes.fromhex(thumbprint)), CERTIFICATE, thumbprint=thumbprint)
    rig.forwarder.lose("TransactWriteItems", times=SENDS,
                       then=once(lambda: rig.other.add_credential("lamp", secret_credential())) if between else None)
    rig.manager.add_credential("lamp", certificate)
    assert rig.forwarder.lost == ["TransactWriteItems"] * SENDS
    held = entries(rig.other.live_state("lamp"))
    assert int(held[certificate.credential_id]) >= CERTIFICATE_NEVER and len(held) == 1 + between
    with pytest.raises(CredentialExists):
        rig.other.add_credential("lamp", certificate)
    assert entries(rig.other.live_state("lamp")) == held


@BETWEEN
def test_a_credential_revoked_with_its_answers_lost_is_revoked_and_says_so(rig, between):
    rig.other.create("lamp", {})
    kept, revoked = rig.other.add_credential("lamp", secret_credential()), rig.other.add_credential(
        "lamp", secret_credential())
    rig.forwarder.lose("TransactWriteItems", times=SENDS,
                       then=once(lambda: rig.other.update_with_retry("lamp", lambda state: {**state, "x": 1}))
                       if between else None)
    rig.manager.revoke_credential("lamp", revoked.credential_id)  # no CredentialNotFound: it was this one
    assert set(rig.held("lamp")) == {kept.credential_id}


@BETWEEN
def test_a_device_provisioned_with_its_answers_lost_exists_once_and_is_counted_once(rig, between):
    rig.other.create_enrollment(Enrollment("factory", "lamp-.*", 10, {"desired": {"power": "on"}}, b"sealed"))
    enrollment = rig.other.enrollment("factory")
    rig.forwarder.lose("TransactWriteItems", times=SENDS,
                       then=once(lambda: rig.other.update_with_retry("lamp-1", lambda state: {**state, "x": 1}))
                       if between else None)
    provisioned = rig.manager.provision("lamp-1", enrollment, secret_credential, "jti-1", int(time.time()) + 600)
    assert provisioned.created
    assert rig.other.enrollment("factory").provisioned == 1
    assert list(rig.held("lamp-1")) == [provisioned.credential_id]
    assert len(rig.other.credentials("lamp-1")) == 1
    assert rig.other.get("lamp-1").version == 1 + between


# ------------------------------------------------------------------ naive controls


def naive_client(endpoint):
    """One send per call, as the service's client; what a caller does without an answer is its own."""
    return boto3.session.Session().client("dynamodb", endpoint_url=endpoint, region_name="us-east-1",
                                          config=Config(retries={"total_max_attempts": 1}, read_timeout=3))


def test_control_a_naive_provisioning_sent_again_after_a_lost_answer_counts_the_device_twice(rig):
    """Without a journal entry to settle by, the caller sends the provisioning again (botocore
    gives the new call a new ClientRequestToken), and the enrollment counts the device twice."""
    rig.other.create_enrollment(Enrollment("factory", "lamp-.*", 10, {}, b"sealed"))
    client = naive_client(rig.forwarder.endpoint)

    def naive_provision():
        client.transact_write_items(TransactItems=[
            {"Put": {"TableName": rig.name, "Item": {**table.state_key("lamp-1"), "version": {"N": "1"},
                                                     "state": {"M": {}}}}},
            {"Update": {"TableName": rig.name, "Key": {"deviceId": {"S": "~enrollments"},
                                                        "sk": {"S": "enrollment#factory"}},
                        "UpdateExpression": "ADD provisioned :one", "ExpressionAttributeValues": {":one": {"N": "1"}}}}])

    rig.forwarder.lose("TransactWriteItems")
    with pytest.raises(Exception):  # noqa: B017 - the lost answer, whatever botocore calls it
        naive_provision()
    naive_provision()
    assert rig.other.enrollment("factory").provisioned == 2  # one device, counted twice


def test_control_a_naive_credential_write_added_again_after_a_lost_answer_holds_two(rig):
    """Without a journal entry on the item there is nothing to settle by: the caller, told
    nothing, adds the credential again, and the device holds it twice."""
    rig.other.create("lamp", {"n": 0})
    rig.other.add_credential("lamp", secret_credential())  # the map exists: entries are SET into it
    client = naive_client(rig.forwarder.endpoint)

    def naive_add():
        credential = new_credential_id()
        client.transact_write_items(TransactItems=[
            {"Put": {"TableName": rig.name, "Item": {"deviceId": {"S": "lamp"}, "sk": {"S": f"credential#{credential}"},
                                                     "kind": {"S": "secret"}}}},
            {"Update": {"TableName": rig.name, "Key": table.state_key("lamp"),
                        "UpdateExpression": "SET #c.#i = :never", "ExpressionAttributeValues": {":never": {"N": "0"}},
                        "ExpressionAttributeNames": {"#c": table.CREDENTIALS, "#i": credential}}}])

    rig.forwarder.lose("TransactWriteItems")
    with pytest.raises(Exception):  # noqa: B017 - the lost answer, whatever botocore calls it
        naive_add()
    naive_add()
    assert len(rig.held("lamp")) == 3  # the first, and the naive one twice
