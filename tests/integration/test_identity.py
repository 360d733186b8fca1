"""A device's credentials, enrollments and provisioning in the library, on moto and DynamoDB
Local: every request of the device's own finds its credential on the state item, so a revoke
shuts out the next one at once, reads and writes alike, with nothing written for it."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from functions.device_state import (MAX_CREDENTIALS, SECRET, AssertionReplayed, ChangeLog, CredentialNotFound,
                                    CredentialRecord, CredentialRevoked, DeviceNotFound, DeviceStateManager,
                                    Enrollment, EnrollmentExists, Holder, InvalidCursor, InvalidEnrollment, InvalidSince,
                                    MergePatch, Operation,
                                    JsonPatch, ProvisioningRefused, TooManyConnections, TooManyCredentials, certificate_id,
                                    new_credential_id, table)
from functions.device_state.item.credentials import provisioned_credential_id, registered
from tests.helpers import Clock, RecordingClient

PATCH = MergePatch({"brightness": 1})


def key(kind="publicKey", **fields) -> CredentialRecord:
    return CredentialRecord(new_credential_id(), kind, public_key="-----BEGIN PUBLIC KEY-----", **fields)


def item_of(manager, device_id):
    return manager.live_state(device_id)


def test_a_credential_is_listed_and_named_on_the_item_until_it_is_revoked(manager):
    manager.create("lamp", {})
    first, second = manager.add_credential("lamp", key()), manager.add_credential("lamp", key(SECRET, secret=b"x"))
    assert {record.credential_id for record in manager.credentials("lamp")} == {first.credential_id,
                                                                               second.credential_id}
    assert set(registered(item_of(manager, "lamp"))) == {first.credential_id, second.credential_id}
    manager.revoke_credential("lamp", first.credential_id)
    assert [record.credential_id for record in manager.credentials("lamp")] == [second.credential_id]
    with pytest.raises(CredentialNotFound):
        manager.revoke_credential("lamp", first.credential_id)
    assert manager.get("lamp").version == 1  # credentials make no version


def test_at_most_five_credentials_and_a_revoke_makes_room(manager):
    manager.create("lamp", {})
    held = [manager.add_credential("lamp", key()) for _ in range(MAX_CREDENTIALS)]
    with pytest.raises(TooManyCredentials):
        manager.add_credential("lamp", key())
    manager.revoke_credential("lamp", held[0].credential_id)
    manager.add_credential("lamp", key())
    assert len(manager.credentials("lamp")) == MAX_CREDENTIALS


def test_a_device_whose_last_credential_was_revoked_takes_a_new_one(manager):
    """Revoking the last credential leaves the item's map of them empty: the next one goes in it
    (the key rotation of a device holding one, done as revoke first, then add)."""
    manager.create("lamp", {})
    manager.revoke_credential("lamp", manager.add_credential("lamp", key()).credential_id)
    again = manager.add_credential("lamp", key())
    assert set(registered(item_of(manager, "lamp"))) == {again.credential_id}
    assert [record.credential_id for record in manager.credentials("lamp")] == [again.credential_id]


def test_an_expired_credential_holds_no_place_among_the_five(timed):
    """Listed no more once expired, and no longer counted: the next registration takes it off the
    item in its own write, and the limit counts the live ones."""
    manager, clock, _ = timed
    manager.create("lamp", {})
    kept = [manager.add_credential("lamp", key()) for _ in range(MAX_CREDENTIALS - 1)]
    soon = manager.add_credential("lamp", key(expires_at=int(clock.now) + 2))
    with pytest.raises(TooManyCredentials):
        manager.add_credential("lamp", key())
    clock.now += 2
    assert len(manager.credentials("lamp")) == MAX_CREDENTIALS - 1
    added = manager.add_credential("lamp", key())
    assert set(registered(item_of(manager, "lamp"))) == {record.credential_id for record in [*kept, added]}
    assert soon.credential_id not in registered(item_of(manager, "lamp"))
    with pytest.raises(TooManyCredentials):
        manager.add_credential("lamp", key())


def test_an_expired_credential_registered_again_replaces_itself_and_a_revoked_one_is_not_taken_off(timed):
    """A certificate's id is its thumbprint's: registered again once expired, it takes its own
    place (not 409 credential-exists). A registration planned while another expired entry was
    there takes that entry off only at the expiry it read: one revoked and registered again
    meanwhile stays."""
    manager, clock, _ = timed
    manager.create("lamp", {})
    soon = key(expires_at=int(clock.now) + 2)
    manager.add_credential("lamp", soon)
    other = manager.add_credential("lamp", key(expires_at=int(clock.now) + 2))
    clock.now += 2
    again = manager.add_credential("lamp", replace(soon, expires_at=None))
    assert registered(item_of(manager, "lamp")) == {again.credential_id: 0}  # the other expired one went
    assert [record.credential_id for record in manager.credentials("lamp")] == [soon.credential_id]
    assert other.credential_id not in registered(item_of(manager, "lamp"))


def test_a_registration_does_not_take_off_an_expired_credential_revoked_and_registered_again_meanwhile(
        dynamodb_local, local_table):
    """Certificate X expired; a registration of Y is planned (X to be taken off), and before it
    reaches DynamoDB X is revoked and registered again (its id is its thumbprint's). X is live: the
    registration is refused at the expiry it read and planned again, and X stays. (Holding X by
    its presence alone, as the first version of the pruning did, took the live X off: this test
    failed on it.)"""
    from functions.device_state.client import dynamodb_client
    from localdev.faults import Forwarder

    client, name = local_table
    other = DeviceStateManager(client, name)
    forwarder = Forwarder(dynamodb_local.port)
    try:
        clock = Clock()
        manager = DeviceStateManager(dynamodb_client(forwarder.endpoint, "us-east-1"), name, clock=clock)
        manager.create("lamp", {})
        x = key(expires_at=int(clock.now) + 2)
        manager.add_credential("lamp", x)
        clock.now += 2
        y = key()

        def revoke_and_register_x_again():
            other.revoke_credential("lamp", x.credential_id)
            other.add_credential("lamp", replace(x, expires_at=None))
        forwarder.before("TransactWriteItems", revoke_and_register_x_again,
                         when=lambda body: y.credential_id.encode() in body)
        manager.add_credential("lamp", y)
    finally:
        forwarder.close()
    assert registered(item_of(other, "lamp")) == {x.credential_id: 0, y.credential_id: 0}


def test_a_credential_for_a_missing_device_is_refused(manager):
    with pytest.raises(DeviceNotFound):
        manager.add_credential("nobody", key())


def test_a_revoked_credential_opens_nothing_read_or_write_and_writes_nothing(manager):
    manager.create("lamp", {"n": 0})
    record = manager.add_credential("lamp", key())
    device = manager.as_device("lamp", Holder(record.credential_id))
    device.update_with_retry("lamp", PATCH, section="reported")  # read-free
    device.update_with_retry("lamp", lambda state: {**state, "x": 1})  # read-modify-write
    assert device.get("lamp").version == 3
    manager.revoke_credential("lamp", record.credential_id)
    for attempt in (lambda: device.get("lamp"), lambda: device.check_holder("lamp"),
                    lambda: device.update_with_retry("lamp", PATCH, section="reported"),
                    lambda: device.update_with_retry("lamp", lambda state: {**state, "x": 2}),
                    lambda: device.connected("lamp", "c1", time.time() + 60),
                    lambda: device.wait_for_sections("lamp", 1, 0)):
        with pytest.raises(CredentialRevoked):
            attempt()
    assert manager.get("lamp").version == 3  # nothing written
    assert manager.as_device("lamp").get("lamp").version == 3  # the device without a credential: its owner's rule


def test_the_devices_feed_versions_leases_and_jobs_check_its_credential_on_the_state_item_they_read(engine):
    """The requests each read sends are at most those of a device holding none: the feed's
    Query reads the state item after the changes (it sorts right after them), so a page that
    reaches the newest change, and a device caught up, send that one Query; only a page that
    stops short of the newest change reads the state item on its own. After the revoke each
    read is refused."""
    client, name = engine
    spy = RecordingClient(client)
    manager, log = DeviceStateManager(spy, name), ChangeLog(spy, name)
    manager.create("lamp", {"n": 0})
    holder = Holder(manager.add_credential("lamp", key()).credential_id)
    for _ in range(2):
        old = manager.live_state("lamp")
        manager.as_device("lamp", holder).update_with_retry("lamp", PATCH, section="reported")
        log.record(old, manager.live_state("lamp"))
    manager.as_device("lamp", holder).update_with_retry("lamp", PATCH, section="reported")  # not in the feed yet
    reads = {"a page": lambda who: log.read("lamp", 1, holder=who),
             "a page short of the newest change": lambda who: log.read("lamp", 1, 1, holder=who),
             "caught up": lambda who: log.read("lamp", 4, holder=who),
             "the feed behind": lambda who: log.read("lamp", 3, holder=who),
             "a version": lambda who: log.at_version("lamp", 2, holder=who),
             "lease status": lambda who: manager.lease_queue().status("lamp", who),
             "jobs": lambda who: manager.jobs().device_jobs("lamp", who)}
    sent = {}
    for what, read in reads.items():
        for who in (None, holder):
            spy.calls.clear()
            read(who)
            sent[what, who] = list(spy.calls)
    assert sent["a page", holder] == sent["a page", None] == ["query"]
    assert sent["a page short of the newest change", None] == ["query"]
    assert sent["a page short of the newest change", holder] == ["query", "get_item"]
    assert sent["caught up", None] == ["query", "get_item"] and sent["caught up", holder] == ["query"]
    assert sent["the feed behind", None] == ["query", "get_item"] and sent["the feed behind", holder] == ["query"]
    for what in ("a version", "lease status", "jobs"):
        assert sent[what, holder] == sent[what, None], what
    assert [change.version for change in log.read("lamp", 1, holder=holder)] == [2, 3]
    assert [change.version for change in log.read("lamp", 1, 1, holder=holder)] == [2]
    with pytest.raises(InvalidSince):
        log.read("lamp", 5, holder=holder)
    manager.revoke_credential("lamp", holder.credential_id)
    for what, read in reads.items():
        with pytest.raises(CredentialRevoked):
            read(holder)
    manager.delete("lamp")
    for what, read in reads.items():
        with pytest.raises(DeviceNotFound):
            read(holder)


class RevokingAfterRead(RecordingClient):
    """Revokes the credential (``revoke``) right after the device's read of ``operation``
    answers: the moment between a write's read and the write itself."""

    def __init__(self, client, operation: str):
        super().__init__(client)
        self.operation, self.revoke = operation, None

    def __getattr__(self, name):
        call = super().__getattr__(name)
        if name != self.operation or not callable(call):
            return call

        def then_revoke(*args, **kwargs):
            answer = call(*args, **kwargs)
            if self.revoke is not None:
                revoke, self.revoke = self.revoke, None
                revoke()
            return answer

        return then_revoke


def test_the_devices_leases_and_transactions_carry_its_credential_in_the_writes_condition(engine):
    """A lease taken, heartbeaten and released, a transaction and a keyed transaction send the
    requests of a device holding none (nothing read for the check), and after the revoke each is
    refused with nothing written: the lease stays as it was, the device at its version."""
    client, name = engine
    spy = RecordingClient(client)
    manager = DeviceStateManager(spy, name)
    manager.create("plain", {"n": 0})  # holds no credential
    manager.create("lamp", {"n": 0})
    holder = Holder(manager.add_credential("lamp", key()).credential_id)
    queue = manager.lease_queue()
    sent = {}
    for device_id, who in (("plain", None), ("lamp", holder)):
        device = manager.as_device(device_id, who)
        spy.calls.clear()
        grant = queue.acquire(device_id, 30, credential=who)
        sent["take", who] = list(spy.calls)
        for what, step in {
                "heartbeat": lambda: queue.heartbeat(device_id, grant.lease_id, 30, who),
                "release": lambda: queue.release(device_id, grant.lease_id, who),
                "transaction": lambda: device.transact([Operation.update(device_id, lambda s: {**s, "n": 1})]),
        }.items():
            spy.calls.clear()
            step()
            sent[what, who] = list(spy.calls)
    for what in ("take", "heartbeat", "release", "transaction"):
        assert sent[what, holder] == sent[what, None], what
    grant = queue.acquire("lamp", 30, credential=holder)
    version = manager.get("lamp").version
    manager.revoke_credential("lamp", holder.credential_id)
    device = manager.as_device("lamp", holder)
    for attempt in (lambda: queue.heartbeat("lamp", grant.lease_id, 60, holder),
                    lambda: queue.release("lamp", grant.lease_id, holder),
                    lambda: device.transact([Operation.update("lamp", lambda s: {**s, "n": 2})]),
                    lambda: device.transact([Operation.check("lamp")]),
                    lambda: queue.acquire("lamp", 30, credential=holder)):
        with pytest.raises(CredentialRevoked):
            attempt()
    status = queue.status("lamp")
    assert (status.holder_token, status.holder_expires_at) == (grant.fencing_token, pytest.approx(grant.expires_at))
    assert manager.get("lamp").version == version


@pytest.mark.parametrize("naive", [False, True], ids=["in-the-condition", "naive-read-then-write"])
def test_a_revoke_landing_between_a_device_transactions_read_and_its_write_refuses_the_write(engine, naive):
    """The transaction reads the device, the credential is revoked, then it writes: the write's
    own condition refuses it. The naive control checks the credential by its read alone (what
    the route did before) and its write lands after the revoke."""
    client, name = engine
    racing = RevokingAfterRead(client, "batch_get_item")
    owner = DeviceStateManager(client, name)
    owner.create("lamp", {"n": 0})
    holder = Holder(owner.add_credential("lamp", key()).credential_id)
    device = DeviceStateManager(racing, name).as_device("lamp", holder)
    racing.revoke = lambda: owner.revoke_credential("lamp", holder.credential_id)
    update = [Operation.update("lamp", lambda state: {**state, "n": 1})]
    if naive:
        device.check_holder("lamp")  # the credential held at this read
        DeviceStateManager(racing, name).transact(update)  # the write, the revoke landing before it
        assert owner.get("lamp").state == {"n": 1}  # applied after the revoke
        return
    with pytest.raises(CredentialRevoked):
        device.transact(update)
    assert owner.get("lamp").state == {"n": 0}


def test_another_devices_credential_or_an_unknown_one_opens_nothing(manager):
    manager.create("lamp", {})
    manager.create("fan", {})
    fans = manager.add_credential("fan", key())
    for holder in (Holder(fans.credential_id), Holder(new_credential_id())):
        with pytest.raises(CredentialRevoked):
            manager.as_device("lamp", holder).update_with_retry("lamp", PATCH, section="reported")


def test_an_expired_credential_opens_nothing(timed):
    manager, clock, _ = timed
    manager.create("lamp", {})
    soon = manager.add_credential("lamp", key(expires_at=int(clock.now) + 2))
    holder = Holder(soon.credential_id)
    manager.as_device("lamp", holder).update_with_retry("lamp", PATCH, section="reported")
    clock.now += 2
    with pytest.raises(CredentialRevoked):
        manager.as_device("lamp", holder).update_with_retry("lamp", PATCH, section="reported")
    assert manager.credentials("lamp") == []


def test_certificates_of_the_ca_open_a_device_until_it_registers_one_and_then_only_registered_ones(manager):
    manager.create("lamp", {})
    factory, registered_cert = certificate_id(b"factory-cert"), certificate_id(b"registered-cert")
    unregistered = Holder(factory, certificate=True)
    manager.as_device("lamp", unregistered).update_with_retry("lamp", PATCH, section="reported")
    with pytest.raises(CredentialRevoked):  # the service may require registration
        manager.as_device("lamp", Holder(factory, certificate=True, required=True)).get("lamp")
    manager.add_credential("lamp", CredentialRecord(registered_cert, "certificate", public_key="pem", thumbprint="ab"))
    with pytest.raises(CredentialRevoked):
        manager.as_device("lamp", unregistered).update_with_retry("lamp", PATCH, section="reported")
    holder = Holder(registered_cert, certificate=True)
    manager.as_device("lamp", holder).update_with_retry("lamp", PATCH, section="reported")
    manager.revoke_credential("lamp", registered_cert)
    for who in (holder, unregistered):  # revoking the last one does not fall back to the CA's rule
        with pytest.raises(CredentialRevoked):
            manager.as_device("lamp", who).get("lamp")


def test_deleting_a_device_revokes_its_credentials_and_a_new_device_of_that_id_holds_none(manager):
    manager.create("lamp", {})
    record = manager.add_credential("lamp", key())
    manager.delete("lamp")
    manager.create("lamp", {})
    with pytest.raises(CredentialRevoked):
        manager.as_device("lamp", Holder(record.credential_id)).get("lamp")
    assert manager.credentials("lamp") == []


def test_a_connect_over_the_cap_is_still_too_many_connections_with_a_good_credential(manager):
    manager.create("lamp", {})
    device = manager.as_device("lamp", Holder(manager.add_credential("lamp", key()).credential_id))
    for number in range(4):
        assert device.connected("lamp", f"c{number}", time.time() + 60)
    with pytest.raises(TooManyConnections):
        device.connected("lamp", "c4", time.time() + 60)


def test_an_assertion_is_spent_once(manager):
    manager.spend_assertion("lamp", "jti-1", int(time.time()) + 600)
    with pytest.raises(AssertionReplayed):
        manager.spend_assertion("lamp", "jti-1", int(time.time()) + 600)
    manager.spend_assertion("fan", "jti-1", int(time.time()) + 600)  # per device


# -------------------------------------------------------------- enrollments


def enrollment(enrollment_id="factory", **fields) -> Enrollment:
    return Enrollment(enrollment_id, fields.pop("id_pattern", r"lamp-[0-9]+"), fields.pop("max_devices", 3),
                      fields.pop("initial", {"state": {"site": "berlin"}, "desired": {"power": "on"}}),
                      group_key=b"sealed", **fields)


def test_enrollments_list_a_page_at_a_time_past_deleted_ones_and_a_page_holds_what_a_lambda_may_answer(manager):
    """GET /enrollments answered every enrollment at once: 49 of 64 KB of quotes passed Lambda's 6 MB.
    A page holds at most ``limit``, and items of at most MAX_PAGE_BYTES as stored (the first always)."""
    for number in range(7):
        manager.create_enrollment(enrollment(f"e{number}"))
    manager.delete_enrollment("e1")
    manager.delete_enrollment("e2")
    pages, cursor = [], None
    while True:
        found, cursor = manager.enrollments(2, cursor)
        pages.append([each.enrollment_id for each in found])
        if cursor is None:
            break
    assert pages == [["e0", "e3"], ["e4", "e5"], ["e6"]]
    with pytest.raises(InvalidCursor):
        manager.enrollments(2, "not-a-cursor")
    large = {"state": {"note": '"' * 60_000}}  # 60 KB stored, 120 KB as JSON, 240 KB in Lambda's answer
    for number in range(8):
        manager.create_enrollment(enrollment(f"large{number}", initial=large))
    found, cursor = manager.enrollments(100)
    assert cursor is not None and 1 < len(found) < 13 and "e0" in {each.enrollment_id for each in found}
    seen = [each.enrollment_id for each in found]
    while cursor is not None:
        found, cursor = manager.enrollments(100, cursor)
        seen += [each.enrollment_id for each in found]
    assert seen == ["e0", "e3", "e4", "e5", "e6", *(f"large{number}" for number in range(8))]


def test_enrollments_are_created_listed_read_and_deleted_and_an_id_names_one_for_good(manager):
    created = manager.create_enrollment(enrollment())
    assert created.created_at and manager.enrollment("factory").provisioned == 0
    manager.create_enrollment(enrollment("other"))
    assert [each.enrollment_id for each in manager.enrollments()[0]] == ["factory", "other"]
    with pytest.raises(InvalidEnrollment):
        manager.create_enrollment(enrollment())
    manager.delete_enrollment("other")
    assert [each.enrollment_id for each in manager.enrollments()[0]] == ["factory"]
    assert manager.enrollment("other").deleted
    with pytest.raises(InvalidEnrollment):
        manager.create_enrollment(enrollment("other"))
    for dots in (".", ".."):  # no URL reaches them: a client resolves /enrollments/.. to /
        with pytest.raises(InvalidEnrollment, match="dot segments"):
            manager.create_enrollment(enrollment(dots))


def test_a_create_of_a_taken_id_in_the_same_millisecond_is_refused_though_neither_has_a_group_key(engine):
    """A create knows its own landed copy (after a lost answer) by its time and its sealed group
    key; one without a key is never taken for it (the API always seals a new one)."""
    manager = DeviceStateManager(engine[0], engine[1], clock=Clock())
    manager.create_enrollment(Enrollment("same", r"lamp-[0-9]+", 3, {}))
    with pytest.raises(EnrollmentExists):
        manager.create_enrollment(Enrollment("same", r"lamp-[0-9]+", 5, {}))
    assert manager.enrollment("same").max_devices == 3


@pytest.mark.parametrize("pattern", ["(a+)+", "(a|aa)*", r"(x)\1", "[", "", "a" * 300, "a{4294967295}",
                                     "a{1,99999999999999999999}"])
def test_an_id_pattern_whose_matching_could_run_away_or_that_is_no_pattern_is_refused(manager, pattern):
    with pytest.raises(InvalidEnrollment):
        manager.create_enrollment(enrollment(id_pattern=pattern))


def derived_secret(credential_id: str) -> CredentialRecord:
    return CredentialRecord(credential_id, SECRET, secret=b"derived")


def provision(manager, device_id, by="factory", jti=None):
    found = manager.enrollment(by)
    return manager.provision(device_id, found, derived_secret,
                             jti or f"jti-{time.monotonic_ns()}", int(time.time()) + 600)


def test_a_device_provisions_itself_once_with_the_enrollments_documents_and_its_first_credential(manager):
    manager.create_enrollment(enrollment())
    first = provision(manager, "lamp-1")
    device = manager.get("lamp-1")
    assert first.created and first.credential_id == provisioned_credential_id("factory", "lamp-1", device.created_at)
    assert (device.version, device.state, device.desired) == (1, {"site": "berlin"}, {"power": "on"})
    assert [record.credential_id for record in manager.credentials("lamp-1")] == [first.credential_id]
    assert manager.as_device("lamp-1", Holder(first.credential_id)).get("lamp-1").version == 1
    again = provision(manager, "lamp-1")
    assert not again.created and again.credential_id == first.credential_id
    assert manager.enrollment("factory").provisioned == 1 and manager.get("lamp-1").version == 1


def test_a_device_deleted_and_provisioned_again_holds_a_credential_of_another_id(manager):
    manager.create_enrollment(enrollment())
    first = provision(manager, "lamp-1")
    manager.delete("lamp-1")
    again = provision(manager, "lamp-1")
    assert again.created and again.credential_id != first.credential_id
    assert list(registered(item_of(manager, "lamp-1"))) == [again.credential_id]
    with pytest.raises(CredentialRevoked):  # a token minted before the delete
        manager.as_device("lamp-1", Holder(first.credential_id)).get("lamp-1")
    assert provision(manager, "lamp-1").credential_id == again.credential_id  # and provisioning again finds it


def test_a_device_provisioned_under_the_earlier_id_is_provisioned_again_with_it(manager, monkeypatch):
    """A device provisioned before credential ids were derived from its createdAt holds the
    earlier id: provisioning it again (a reset, a resend) answers with that credential, not 403."""
    from functions.device_state.identity import provisioning
    from functions.device_state.item.credentials import earlier_provisioned_credential_id

    manager.create_enrollment(enrollment())
    with monkeypatch.context() as earlier:  # as provisioning gave ids then
        earlier.setattr(provisioning, "provisioned_credential_id",
                        lambda enrollment_id, device_id, _created_at: earlier_provisioned_credential_id(
                            enrollment_id, device_id))
        first = provision(manager, "lamp-1")
    assert first.credential_id == earlier_provisioned_credential_id("factory", "lamp-1")
    again = provision(manager, "lamp-1")
    assert not again.created and again.credential_id == first.credential_id
    manager.delete("lamp-1")
    assert provision(manager, "lamp-1").credential_id != first.credential_id  # a new device: a new id


def test_a_device_provisioned_again_in_the_millisecond_its_deleted_one_was_created_waits_for_the_next(engine):
    """The credential's id is derived from when the device is created: a device created again in
    the millisecond the deleted one was would take its id, so provisioning tries again later."""
    from tests.helpers import Clock

    client, name = engine
    clock = Clock(int(time.time()))
    started = clock.now
    manager = DeviceStateManager(client, name, clock=clock, sleep=lambda seconds: setattr(
        clock, "now", clock.now + max(seconds, 0.001)))
    manager.create_enrollment(enrollment())
    first = provision(manager, "lamp-1")
    manager.delete("lamp-1")
    again = provision(manager, "lamp-1")  # the clock has not moved
    assert again.credential_id != first.credential_id and clock.now > started
    assert list(registered(item_of(manager, "lamp-1"))) == [again.credential_id]


def test_provisioning_is_refused_for_each_reason_and_writes_nothing(manager):
    manager.create_enrollment(enrollment(max_devices=1))
    manager.create_enrollment(enrollment("other", id_pattern=".*"))
    with pytest.raises(ProvisioningRefused) as refused:
        provision(manager, "fan-1")
    assert refused.value.reason == "id-not-allowed"
    provision(manager, "lamp-1")
    with pytest.raises(ProvisioningRefused) as refused:
        provision(manager, "lamp-2")
    assert refused.value.reason == "enrollment-full"
    with pytest.raises(ProvisioningRefused) as refused:
        provision(manager, "lamp-1", by="other")
    assert refused.value.reason == "device-exists"
    manager.create("kettle", {})
    with pytest.raises(ProvisioningRefused) as refused:
        provision(manager, "kettle", by="other")
    assert refused.value.reason == "device-exists"
    manager.delete_enrollment("other")
    with pytest.raises(ProvisioningRefused) as refused:
        provision(manager, "fan-1", by="other")
    assert refused.value.reason == "enrollment-ended"
    with pytest.raises(DeviceNotFound):
        manager.get("lamp-2")
    with pytest.raises(DeviceNotFound):
        manager.get("fan-1")
    assert manager.enrollment("factory").provisioned == 1


def test_an_expired_enrollment_provisions_nobody(manager):
    manager.create_enrollment(enrollment(expires_at=int(time.time()) - 1))
    with pytest.raises(ProvisioningRefused) as refused:
        provision(manager, "lamp-1")
    assert refused.value.reason == "enrollment-ended"


def test_a_provisioning_assertion_is_spent_once_and_a_revoked_credential_is_not_provisioned_again(manager):
    manager.create_enrollment(enrollment())
    provisioned = provision(manager, "lamp-1", jti="once")
    with pytest.raises(AssertionReplayed):  # provisioning again spends its assertion too
        provision(manager, "lamp-1", jti="once")
    provision(manager, "lamp-1", jti="twice")
    manager.revoke_credential("lamp-1", provisioned.credential_id)
    with pytest.raises(ProvisioningRefused) as refused:
        provision(manager, "lamp-1")
    assert refused.value.reason == "credential-revoked"


def test_a_device_with_the_largest_state_still_takes_its_credentials(local_table):
    """DynamoDB Local only (moto sizes items more coarsely): credentials live in the room the
    state leaves, beside a busy journal and the most connections."""
    from functions.device_state import DeviceStateManager, ItemTooLarge
    from functions.device_state.item.room import MAX_STATE_ITEM_BYTES

    manager = DeviceStateManager(*local_table)
    low, high = MAX_STATE_ITEM_BYTES - 2000, MAX_STATE_ITEM_BYTES
    while high - low > 1:
        middle = (low + high) // 2
        try:
            manager.put("big", {"blob": "x" * middle})
            low = middle
        except ItemTooLarge:
            high = middle
    for number in range(MAX_CREDENTIALS):
        manager.add_credential("big", key(expires_at=int(time.time()) + 10 ** 8))
    device = manager.as_device("big", Holder(manager.credentials("big")[0].credential_id))
    for number in range(4):
        device.connected("big", f"connection-{number:032d}", time.time() + 7200)
    device.update_with_retry("big", lambda state: state)
    assert table.CREDENTIALS in manager.live_state("big")


def test_a_devices_own_lease_handle_carries_its_credential(manager):
    """``as_device(id, holder).lease(...)``: taken, heartbeaten and released only while the device
    holds its credential; once revoked, the heartbeat is refused and the lease counts as lost."""
    manager.create("lamp", {})
    holder = Holder(manager.add_credential("lamp", key()).credential_id)
    device = manager.as_device("lamp", holder)
    lease = device.lease("lamp", ttl_seconds=30).acquire()
    lease.heartbeat()
    manager.revoke_credential("lamp", holder.credential_id)
    with pytest.raises(CredentialRevoked):
        lease.heartbeat()
    with pytest.raises(CredentialRevoked):
        device.lease("lamp", ttl_seconds=30).acquire()
    assert manager.lease_queue().status("lamp").holder_token == lease.fencing_token  # nothing released


def test_a_devices_subscription_to_itself_from_behind_sends_what_one_holding_none_sends(engine, monkeypatch):
    """The subscribe's check of ``since`` reads the first page of the catch-up, and the catch-up
    starts from it: a device holding a credential reads its state item in that same Query (its
    check), so it sends the requests of a device holding none. Revoked: 401, nothing subscribed."""
    import json

    from functions.auth.principals import Principal
    from functions.push import handler
    from functions.push.delivery import Delivery
    from functions.push.subscriptions import Subscriptions

    client, name = engine
    monkeypatch.setenv("TABLE_NAME", name)  # the push configuration (credentials optional)
    spy = RecordingClient(client)
    manager, log = DeviceStateManager(spy, name), ChangeLog(spy, name)
    posted = []
    subscriptions = Subscriptions(spy, name)
    monkeypatch.setattr(handler, "services", lambda: (subscriptions, Delivery(
        subscriptions, log, lambda connection, message: posted.append((connection, message)))))
    monkeypatch.setattr(handler.connections, "post", lambda connection, message: posted.append((connection, message)))
    principals = {None: Principal.device("plain"), "held": None}
    for device_id in ("plain", "held"):
        manager.create(device_id, {"n": 0})
        for n in range(3):
            old = manager.live_state(device_id)
            manager.update_with_retry(device_id, MergePatch({"n": n + 1}), section="reported")
            log.record(old, manager.live_state(device_id))
    holder = Holder(manager.add_credential("held", key()).credential_id)
    principals["held"] = Principal.device("held", credential_id=holder.credential_id)

    def subscribe(principal, connection_id):
        subscriptions.open(connection_id, principal.subject)
        spy.calls.clear()
        posted.clear()
        answer = handler.lambda_handler({
            "requestContext": {"routeKey": "subscribe", "connectionId": connection_id,
                               "authorizer": {"principalId": principal.subject, **principal.as_context()}},
            "body": json.dumps({"action": "subscribe", "deviceId": principal.device_id, "since": 1})}, None)
        return answer, [message for _, message in posted], list(spy.calls)

    plain, held = subscribe(principals[None], "c-plain"), subscribe(principals["held"], "c-held")
    for answer, messages, _ in (plain, held):
        assert answer["statusCode"] == 200
        assert [message.get("version") for message in messages] == [None, 2, 3, 4]  # subscribed, then 3 changes
    assert held[2] == plain[2] and held[2].count("query") >= 1
    manager.revoke_credential("held", holder.credential_id)
    answer, messages, _ = subscribe(principals["held"], "c-held-2")
    assert answer["statusCode"] == 200 and [m["type"] for m in messages] == ["error"]
    assert messages[0]["problem"]["status"] == 401
    assert [s.connection_id for s in subscriptions.of_device("held")] == ["c-held"]


# A device's own write whose plan refuses it on the item it read (a version it names moved on, a
# JSON Patch test fails, ...) tells what the device holds; one whose credential was revoked is
# refused as revoked before that, as its reads are.
REFUSED_ON_ITS_PLAN = {
    "update naming a stale version": lambda device, k: device.update(
        "lamp", MergePatch({"a": 2}), 1, section="reported", idempotency=k),
    "section replaced naming a stale version": lambda device, k: device.replace_section(
        "lamp", "reported", {"a": 2}, 1, idempotency=k),
    "a JSON Patch test that fails": lambda device, k: device.update_with_retry(
        "lamp", JsonPatch([{"op": "test", "path": "/a", "value": 0}, {"op": "replace", "path": "/a", "value": 2}]),
        section="reported", idempotency=k),
}


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "its-key-landed-after-its-first-look"])
@pytest.mark.parametrize("case", REFUSED_ON_ITS_PLAN)
def test_a_revoked_devices_write_refused_on_its_plan_is_refused_as_revoked(manager, monkeypatch, case, keyed):
    """Keyed: the same request lands right after the write's first look for its record, then
    the credential is revoked: the write's look again must not answer the record either."""
    from functions.device_state import IdempotencyKey
    from functions.device_state.write.keyed import RecordedAnswers

    manager.create("lamp", {"n": 0}, sections={"reported": {"a": 0}})
    record = manager.add_credential("lamp", key(SECRET, secret=b"x"))
    device = manager.as_device("lamp", Holder(record.credential_id))
    send, k = REFUSED_ON_ITS_PLAN[case], IdempotencyKey("k-1", "PATCH", "f") if keyed else None
    if keyed:
        original, landed = RecordedAnswers.results, []

        def results(self, partition, idempotency):
            found = original(self, partition, idempotency)
            if not landed:
                landed.append("the same request")
                send(device, k)
                manager.revoke_credential("lamp", record.credential_id)
            return found

        monkeypatch.setattr(RecordedAnswers, "results", results)
    else:
        manager.update("lamp", MergePatch({"a": 1}), 1, section="reported")
        manager.revoke_credential("lamp", record.credential_id)
    with pytest.raises(CredentialRevoked):
        send(device, k)
