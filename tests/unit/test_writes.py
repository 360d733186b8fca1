"""The exact request each write sends, planned without an engine: its conditions
(version or liveness, lease fence, write identity) and its journal entry."""

from __future__ import annotations

import json
import re

import pytest

from functions.device_state import DeviceAlreadyExists, JsonPatch
from functions.device_state.write.compiled import compile_patch
from functions.device_state import table
from functions.device_state.model.device import Device
from functions.device_state.model.times import stored_time, time_attribute, timestamp
from functions.device_state.item.fencing import Fence, lease_key
from functions.device_state.item.journal import JOURNAL_KEEP, JOURNAL_MAX, TRIMMED_STAMPS_KEEP, WriteId, journal, trimmed_stamp
from functions.device_state.write.bookkeeping import STUB_SECONDS
from functions.device_state.write.planner import Planner

NOW = 1_800_000_000.0
STAMP = repr(timestamp(NOW))
MILLIS = int(NOW * 1000)  # how the state item stores createdAt and updatedAt
PLANNER = Planner("devices", Fence(), NOW, tombstone_seconds=100)
# Expressions as spelled(): placeholders replaced by the attribute names and values they stand for.
LIVE = "(attribute_exists(version) AND attribute_not_exists(deletedAt) AND " \
       f"(attribute_not_exists(expiresAt) OR expiresAt > {NOW}))"
UNFENCED = f"(attribute_not_exists(leaseToken) OR leaseUntil <= {NOW})"


def spelled(request: dict, expression: str) -> str:
    """``request[expression]`` with every placeholder replaced by the attribute name it
    stands for, and every value placeholder by its value (a number as its digits, a
    string quoted, anything else as compact JSON)."""
    names, values = request.get("ExpressionAttributeNames", {}), request.get("ExpressionAttributeValues", {})

    def replace(match):
        placeholder = match.group(0)
        if placeholder in names:
            return names[placeholder]
        value = values.get(placeholder)
        if value is None:
            raise AssertionError(f"{placeholder} is not declared")
        (kind, content), = value.items()
        return content if kind == "N" else repr(content) if kind == "S" else json.dumps(value, separators=(",", ":"))

    return re.sub(r"[#:][A-Za-z0-9_]+", replace, request[expression])


def item(version=3, journal_entries=(), **extra):
    base = {**table.state_key("d"), "version": {"N": str(version)}, "state": {"M": {"n": {"N": "1"}}},
            "createdAt": {"S": "2026-01-01T00:00:00.000Z"}, "updatedAt": {"S": "2026-01-01T00:00:00.000Z"},
            table.JOB_MARKS: {"M": {}}}  # as every device created or written since jobs carries it
    for write, produced in journal_entries:
        base[write.attribute] = {"N": str(produced)}
    return {**base, **extra}


def test_a_write_id_names_its_journal_attribute_and_reads_back():
    write = WriteId(1_800_000_000_123, "0a1b2c3d")
    assert write.attribute.startswith(table.JOURNAL_PREFIX) and len(write.attribute) == 2 + 9 + 8
    fresh = WriteId.new(NOW)
    assert len(fresh.attribute) == 2 + 9 + 6 and WriteId.parse(fresh.attribute) == fresh
    assert WriteId.parse(write.attribute) == write
    assert WriteId.parse("w:nonsense") is None and WriteId.parse("state") is None


def test_a_state_write_is_version_checked_fenced_and_journaled():
    planned = PLANNER.replace_state(item(), lambda state: {"n": 2}, None, "updated")
    request = planned.request["Update"]
    write = planned.write
    assert request["Key"] == table.state_key("d") and request["TableName"] == "devices"
    update = spelled(request, "UpdateExpression")
    assert re.fullmatch(re.escape(
        f'SET state = {{"M":{{"n":{{"N":"2"}}}}}}, updatedAt = {MILLIS}, version = 4, {write.attribute} = 4, '
        "itemBytes = ") + "[0-9]+" + re.escape(" REMOVE lastWrite"), update), update
    assert spelled(request, "ConditionExpression") == (
        f"version = 3 AND {LIVE} AND attribute_not_exists({write.attribute}) AND {UNFENCED}")
    assert write.stamp_ms == int(NOW * 1000)
    assert request["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"
    assert planned.device.version == 4 and planned.expected_version == 3


def test_a_fenced_write_names_its_lease_token():
    planned = Planner("devices", Fence({"d": "a" * 32}), NOW).replace_state(item(), lambda s: s, None, "updated")
    request = planned.request["Update"]
    assert spelled(request, "ConditionExpression").endswith(f"(leaseKey = {lease_key('a' * 32)!r} AND leaseUntil > {NOW})")
    assert "a" * 32 not in str(request)  # the secret itself is never sent


def test_a_state_write_keeps_the_newest_entries_and_raises_the_trim_watermark():
    entries = [(WriteId(1000 + version, f"{version:08x}"), version) for version in range(1, 12)]
    marker = (WriteId(int((NOW - 3600) * 1000), "deadbeef"), 0)  # an old "never applied" mark
    planned = PLANNER.replace_state(item(11, entries + [marker]), lambda state: state, None, "updated")
    request = planned.request["Update"]
    kept_after = JOURNAL_KEEP - 1  # plus this write's own entry
    assert removed_names(request) == {write.attribute for write, _ in entries[:len(entries) - kept_after]} | {
        marker[0].attribute}
    assert f"journalTrimmed = {entries[-kept_after - 1][0].stamp_ms}" in spelled(request, "UpdateExpression")


def test_a_create_over_nothing_requires_no_version_and_over_a_tombstone_continues_it():
    created = PLANNER.create("d", {"n": 0}, None)
    fresh = created.request["Update"]
    assert spelled(fresh, "ConditionExpression").startswith(
        f"attribute_not_exists(version) AND attribute_not_exists({created.write.attribute})")
    assert f"version = 1, {created.write.attribute} = 1" in spelled(fresh, "UpdateExpression")
    tombstone = item(5, deletedAt={"S": "x"}, expiresAt={"N": str(int(NOW) + 10)})
    again = PLANNER.create("d", {"n": 0}, tombstone)
    request = again.request["Update"]
    assert spelled(request, "ConditionExpression").startswith(
        f"version = 5 AND (attribute_not_exists(version) OR attribute_exists(deletedAt) OR expiresAt <= {NOW})")
    assert f"version = 6, {again.write.attribute} = 6" in spelled(request, "UpdateExpression")
    assert again.device.version == 6
    assert "REMOVE deletedAt, expiresAt, leaseToken, leaseKey, leaseUntil" in spelled(request, "UpdateExpression")
    with pytest.raises(DeviceAlreadyExists):
        PLANNER.create("d", {}, item())


def test_only_a_replacing_write_stores_last_write_for_the_stream_processor():
    """created, updated and deleted are told apart by the images; replaced is not."""
    replaced = spelled(PLANNER.replace_state(item(), lambda state: {"n": 2}, None, "replaced").request["Update"],
                       "UpdateExpression")
    assert "lastWrite = 'replaced'" in replaced and "REMOVE lastWrite" not in replaced, replaced
    updated = spelled(PLANNER.replace_state(item(), lambda state: {"n": 2}, None, "updated").request["Update"],
                      "UpdateExpression")
    assert "lastWrite =" not in updated and "REMOVE lastWrite" in updated, updated


def test_a_delete_leaves_a_tombstone_with_the_next_version():
    planned = PLANNER.delete(item(3))
    request = planned.request["Update"]
    assert spelled(request, "UpdateExpression").startswith(
        f"SET deletedAt = {STAMP}, updatedAt = {MILLIS}, expiresAt = {int(NOW) + 100}, version = 4, "
        f"{planned.write.attribute} = 4 REMOVE state, leaseToken, leaseKey, leaseUntil")
    assert planned.device.version == 3  # the device as it was


def test_a_compiled_patch_is_one_update_with_no_version_condition_guarded_by_its_write_id():
    planned = PLANNER.compiled("d", compile_patch(JsonPatch([{"op": "increment", "path": "/n", "value": 1}])))
    request = planned.request["Update"]
    write = planned.write.attribute
    assert (f", version = version + 1, updatedAt = {MILLIS}, {write} = version + 1"
            in spelled(request, "UpdateExpression"))
    condition = spelled(request, "ConditionExpression")
    assert condition.startswith(f"{LIVE} AND attribute_not_exists({write}) AND {UNFENCED}")
    assert "version =" not in condition and request["ReturnValues"] == "ALL_NEW"


def test_a_compiled_report_takes_a_removed_members_entry_with_it_where_one_entry_per_leaf_stays():
    """Its metadata entry goes in the same request as the member; it compiles only where no
    object's leaves lose their member under their entries, and no object is left empty."""
    from functions.device_state import MergePatch

    compiled = compile_patch(MergePatch({"gone": None, "o": {"x": None}, "n": 1}), "reported")
    request = PLANNER.compiled("d", compiled, None, "reported").request["Update"]
    update, condition = spelled(request, "UpdateExpression"), spelled(request, "ConditionExpression")
    sets, removes = update.split(" REMOVE ")
    assert "metaReported./n = version + " in sets and "metaReported./gone" not in sets
    assert {"reported.gone", "reported.o.x", "metaReported./gone", "metaReported./o/x"} <= set(removes.split(", "))
    for member in ("reported.gone", "reported.o.x", "reported.n"):
        assert f"NOT attribute_type({member}, 'M')" in condition
    assert "size(reported.o) > 1" in condition


def test_settling_marks_the_write_as_never_applied_only_if_its_entry_is_absent():
    write = WriteId(123, "abcdef01")
    on_device = PLANNER.settle_mark("d", write, True).request["Update"]
    assert spelled(on_device, "UpdateExpression") == f"SET {write.attribute} = 0"
    assert spelled(on_device, "ConditionExpression") == (
        f"attribute_not_exists({write.attribute}) AND attribute_exists(version)")
    stub = PLANNER.settle_mark("d", write, False).request["Update"]
    assert spelled(stub, "UpdateExpression") == f"SET {write.attribute} = 0, expiresAt = {int(NOW) + STUB_SECONDS}"
    assert spelled(stub, "ConditionExpression") == (
        f"attribute_not_exists({write.attribute}) AND attribute_not_exists(version)")


def test_lease_holder_changes_name_their_ticket_and_carry_no_journal_entry():
    taken = PLANNER.take_lease("d", 7, "secret-token", NOW + 30, {"N": "1700000000000"})
    request = taken.request["Update"]
    assert spelled(request, "UpdateExpression") == (
        f"SET leaseToken = 7, leaseKey = {lease_key('secret-token')!r}, leaseUntil = {NOW + 30}, leaseLast = 7")
    assert spelled(request, "ConditionExpression") == (  # on the device the ticket queued on, not one created since
        f"{LIVE} AND createdAt = 1700000000000 AND "
        f"(attribute_not_exists(leaseToken) OR leaseUntil <= {NOW} OR leaseToken = 7) AND "
        f"(attribute_not_exists(leaseLast) OR leaseLast <= 7)")
    extended = PLANNER.extend_lease("d", 7, NOW + 60).request["Update"]
    assert spelled(extended, "UpdateExpression") == f"SET leaseUntil = {NOW + 60}"
    assert spelled(extended, "ConditionExpression") == f"leaseToken = 7 AND leaseUntil > {NOW}"
    cleared = PLANNER.clear_lease("d", 7).request["Update"]
    assert spelled(cleared, "UpdateExpression") == "REMOVE leaseToken, leaseKey, leaseUntil"  # not leaseLast
    assert spelled(cleared, "ConditionExpression") == "leaseToken = 7"
    for planned in (taken, PLANNER.extend_lease("d", 7, NOW + 60), PLANNER.clear_lease("d", 7)):
        assert planned.write is None and planned.device_id == "d" and planned.request["Update"]["Key"] == \
            table.state_key("d")


def removed_names(request):
    """What the write REMOVEs but lastWrite (which every write but a replace removes) and
    the contention marks (which every compiled patch removes)."""
    if " REMOVE " not in request["UpdateExpression"]:
        return set()
    clause = request["UpdateExpression"].split(" REMOVE ")[1].split(" ADD ")[0].split(" DELETE ")[0]
    return {request["ExpressionAttributeNames"].get(name, name) for name in clause.split(", ")} - {
        table.LAST_WRITE, *table.CONTENTION_MARKS}


def test_a_write_keeps_the_entries_of_the_last_second_up_to_the_maximum():
    """A writer whose answer was lost settles a round trip later; on a hot device more than
    JOURNAL_KEEP writes land in that time, so young entries stay (up to JOURNAL_MAX)."""
    young = [(WriteId(int(NOW * 1000) - 500 + version, f"{version:08x}"), version) for version in range(1, 12)]
    request = PLANNER.replace_state(item(11, young), lambda state: state, None, "updated").request["Update"]
    assert removed_names(request) == set()  # all 11 young entries stay, with the write's own
    many = [(WriteId(int(NOW * 1000) - 500 + version, f"{version:08x}"), version) for version in range(1, 41)]
    request = PLANNER.replace_state(item(40, many), lambda state: state, None, "updated").request["Update"]
    assert removed_names(request) == {write.attribute for write, _ in many[:-(JOURNAL_MAX - 1)]}
    assert f"journalTrimmed = {many[-JOURNAL_MAX][0].stamp_ms}" in spelled(request, "UpdateExpression")


def test_a_compiled_patch_drops_what_the_container_last_saw_and_adds_the_newest_dropped_stamp_to_a_set():
    entries = [(WriteId(1000 + version, f"{version:08x}"), version) for version in range(1, 30)]
    seen = item(29, entries, journalTrimmed={"N": "950"}, journalTrimmedStamps={"NS": ["900"]})
    compiled = compile_patch(JsonPatch([{"op": "increment", "path": "/n", "value": 1}]))
    request = PLANNER.compiled("d", compiled, seen).request["Update"]
    assert removed_names(request) == {write.attribute for write, _ in entries[:len(entries) - (JOURNAL_KEEP - 1)]}
    newest_dropped = entries[-JOURNAL_KEEP][0].stamp_ms
    # the stamp itself, not a distance from this container's view: a set union adds up to nothing
    assert spelled(request, "UpdateExpression").endswith(f' ADD journalTrimmedStamps {{"NS":["{newest_dropped}"]}}')
    # the exact watermark is the readers' alone
    assert table.JOURNAL_TRIMMED not in request["ExpressionAttributeNames"].values()
    assert trimmed_stamp(seen) == 950 and trimmed_stamp({"journalTrimmedStamps": {"NS": ["990", "20"]}}) == 990
    unseen = PLANNER.compiled("d", compiled, None).request["Update"]
    assert removed_names(unseen) == set() and " ADD " not in unseen["UpdateExpression"]
    assert len(journal(item(3, entries))) == len(entries)


def test_a_compiled_patch_that_sees_many_stamps_prunes_them_and_drops_only_what_they_cover():
    entries = [(WriteId(1000 + version, f"{version:08x}"), version) for version in range(1, 30)]
    stamps = ["1003", "1010", "1001", "1012"][:TRIMMED_STAMPS_KEEP]
    seen = item(29, entries, journalTrimmedStamps={"NS": stamps})
    compiled = compile_patch(JsonPatch([{"op": "increment", "path": "/n", "value": 1}]))
    request = PLANNER.compiled("d", compiled, seen).request["Update"]
    update = spelled(request, "UpdateExpression")
    assert " ADD " not in update
    highest = max(int(stamp) for stamp in stamps)
    pruned = re.fullmatch(r".* DELETE journalTrimmedStamps (\{.*\})", update)
    assert pruned, update
    assert sorted(json.loads(pruned.group(1))["NS"]) == sorted(
        stamp for stamp in stamps if int(stamp) != highest)  # never the highest it saw
    assert removed_names(request) == {write.attribute for write, _ in entries if write.stamp_ms <= highest}


def test_a_write_that_read_the_item_folds_the_patches_watermarks_into_its_own():
    """Its version condition makes its view exact: the set's highest stamp."""
    stamps = item(5, journalTrimmed={"N": "700"}, journalTrimmedStamps={"NS": ["900", "800"]})
    request = PLANNER.replace_state(stamps, lambda state: state, None, "updated").request["Update"]
    assert "journalTrimmed = 900" in spelled(request, "UpdateExpression")
    assert removed_names(request) == {table.JOURNAL_TRIMMED_STAMPS}
    # a fold that raises nothing still removes the set, and declares no name it does not use
    covered = item(5, journalTrimmed={"N": "950"}, journalTrimmedStamps={"NS": ["900"]})
    request = PLANNER.replace_state(covered, lambda state: state, None, "updated").request["Update"]
    assert removed_names(request) == {table.JOURNAL_TRIMMED_STAMPS}
    assert table.JOURNAL_TRIMMED not in request["ExpressionAttributeNames"].values()
    quiet = PLANNER.replace_state(item(5, journalTrimmed={"N": "700"}), lambda state: state, None, "updated")
    assert removed_names(quiet.request["Update"]) == set()


def test_a_state_at_the_item_limit_leaves_room_for_its_change_record():
    """The change record (state + its keys and timestamps) of the largest state a write
    accepts always fits DynamoDB's item limit, so the feed can always record it."""
    from functions.device_state.feed.items import change_item_size
    from functions.device_state.model.device import Device
    from functions.device_state.errors import ItemTooLarge
    from functions.device_state.model.values import MAX_ITEM_BYTES, to_attribute
    from functions.device_state.item.room import MAX_STATE_ITEM_BYTES

    device_id = "d" * 128  # the longest id: the most key bytes on both items
    accepted, size = None, 1000
    while True:  # the largest blob a create accepts, to the byte
        try:
            PLANNER.create(device_id, {"blob": "x" * size}, None)
            accepted = size
            size += 1 if accepted > MAX_STATE_ITEM_BYTES - 600 else 100
        except ItemTooLarge:
            break
    assert accepted is not None and accepted > MAX_STATE_ITEM_BYTES - 600
    state = {"blob": "x" * accepted}
    stamp = "2026-11-23T00:00:00.000Z"
    device = Device(device_id, 10 ** 17, state, stamp, stamp)
    empty = to_attribute({})  # desired, reported and their metadata, as a create stores them
    attributes = {"state": to_attribute(state), "desired": empty, "reported": empty, "metaDesired": empty,
                  "metaReported": empty}
    assert change_item_size(device, attributes) <= MAX_ITEM_BYTES


def test_desired_reported_and_their_metadata_count_toward_the_item_size():
    """A state that fits alone is refused when desired or reported (stored beside it and
    copied into the change record) would fill the item."""
    from functions.device_state.errors import ItemTooLarge
    from functions.device_state.model.sections import REPORTED, SectionWrite
    from functions.device_state.model.values import to_attribute
    from functions.device_state.item.room import MAX_STATE_ITEM_BYTES

    half = {"blob": "x" * (MAX_STATE_ITEM_BYTES // 2)}
    PLANNER.create("d", half, None)
    with pytest.raises(ItemTooLarge):
        PLANNER.create("d", half, None, {"desired": half})
    stored = item(1, state=to_attribute(half), desired={"M": {}}, reported={"M": {}}, metaDesired={"M": {}},
                  metaReported={"M": {}})
    PLANNER.write_sections(stored, [SectionWrite(REPORTED, lambda reported: {"n": 1}, ("",))], None, "updated")
    with pytest.raises(ItemTooLarge):
        PLANNER.write_sections(stored, [SectionWrite(REPORTED, lambda reported: half, ("",))], None, "updated")


def test_every_name_and_value_a_planned_request_declares_is_used():
    """DynamoDB refuses a request that declares a placeholder it does not use."""

    entries = [(WriteId(1000 + version, f"{version:08x}"), version) for version in range(1, 30)]
    items = [item(5), item(29, entries), item(5, journalTrimmed={"N": "950"}, journalTrimmedStamps={"NS": ["900"]}),
             item(5, journalTrimmed={"N": "20"}),
             item(29, entries, journalTrimmedStamps={"NS": ["1", "2", "3", "4"]})]
    compiled = compile_patch(JsonPatch([{"op": "increment", "path": "/n", "value": 1}]))
    removal = compile_patch(JsonPatch([{"op": "remove", "path": "/n"}]), "reported")
    for seen in items:
        for planned in (PLANNER.replace_state(seen, lambda state: state, None, "updated"), PLANNER.delete(seen),
                        PLANNER.compiled("d", compiled, seen), PLANNER.compiled("d", removal, seen, "reported")):
            request = planned.request["Update"]
            text = request["UpdateExpression"] + " " + request["ConditionExpression"]
            used = set(re.findall(r"[#:][A-Za-z0-9_]+", text))
            assert set(request["ExpressionAttributeNames"]) <= used, request
            assert set(request["ExpressionAttributeValues"]) <= used, request


def test_the_state_item_stores_its_times_as_milliseconds_and_reads_both_forms():
    created = PLANNER.create("d", {"n": 0}, None)
    request = created.request["Update"]
    assert f"createdAt = {MILLIS}, updatedAt = {MILLIS}" in spelled(request, "UpdateExpression")
    assert created.device.created_at == created.device.updated_at == timestamp(NOW)
    for epoch in (NOW, NOW + 0.0005, NOW + 0.9995, 1_795_680_604.5619999):  # the text and the number agree
        assert stored_time(time_attribute(epoch)) == timestamp(epoch), epoch
    text = item(3)
    number = {**text, table.CREATED_AT: time_attribute(NOW), table.UPDATED_AT: time_attribute(NOW + 1)}
    as_text = {**text, table.CREATED_AT: {"S": timestamp(NOW)}, table.UPDATED_AT: {"S": timestamp(NOW + 1)}}
    assert Device.from_item(number).as_dict() == Device.from_item(as_text).as_dict()  # items written earlier


def test_contention_marks_live_in_the_room_the_state_leaves_and_never_refuse_a_state():
    """A state accepted by a write that raced no one is accepted by one that raced long and
    by one on a marked item: the marks go where the state leaves room, else nowhere."""
    from functions.device_state.item.contention import Raced
    from functions.device_state.errors import ItemTooLarge
    from functions.device_state.item.room import MAX_STATE_ITEM_BYTES

    long_race = Planner("devices", Fence(), NOW, tombstone_seconds=100, raced=Raced(1.0))
    until = {"N": str(MILLIS + 500)}
    marked = item(3, **{table.RACED_UNTIL: until, table.CONTENDED_UNTIL: until})
    accepted, size = None, MAX_STATE_ITEM_BYTES - 1000
    while True:  # the largest blob a write that raced no one accepts, to the byte
        try:
            PLANNER.replace_state(item(3), lambda state, size=size: {"blob": "x" * size}, None, "updated")
            accepted, size = size, size + 1
        except ItemTooLarge:
            break
    fill = {"blob": "x" * accepted}
    for planner, on in ((long_race, item(3)), (long_race, marked), (PLANNER, marked)):
        request = planner.replace_state(on, lambda state: fill, None, "updated").request["Update"]
        assert set(map(str, request["ExpressionAttributeNames"].values())) & {table.RACED_UNTIL,
                                                                              table.CONTENDED_UNTIL} <= removed_all(request)
    roomy = long_race.replace_state(marked, lambda state: {"n": 1}, None, "updated").request["Update"]
    assert table.CONTENDED_UNTIL in set_names(roomy)  # with room, a long race marks the device


def removed_all(request):
    clause = request["UpdateExpression"].split(" REMOVE ")[1] if " REMOVE " in request["UpdateExpression"] else ""
    return {request["ExpressionAttributeNames"].get(name, name) for name in clause.split(", ") if name}


def set_names(request):
    clause = request["UpdateExpression"].split(" REMOVE ")[0]
    return {request["ExpressionAttributeNames"].get(part.split(" = ")[0].strip(), "")
            for part in clause[len("SET "):].split(", ")}


# ---------------------------------------------------------------- credentials


def test_a_device_writing_itself_with_a_credential_names_it_in_every_kind_of_write():
    """The read-modify-write, the read-free patch and the connect of a device that comes with a
    credential each carry the same condition: the credential is on the item, unexpired."""
    from functions.device_state import Holder

    holder = Planner("devices", Fence(), NOW, seen_by="d", holder=Holder("abcdefgh"))
    entry = f"{table.CREDENTIALS}.abcdefgh"
    held = f"(attribute_exists({entry}) AND ({entry} = 0 OR {entry} > {int(NOW)}))"
    written = holder.replace_state(item(), lambda state: state, None, "updated").request["Update"]
    compiled = holder.compiled("d", compile_patch(JsonPatch([{"op": "increment", "path": "/n", "value": 1}])))
    connected = holder.connect("d", "1:c").request["Update"]
    for request in (written, compiled.request["Update"], connected):
        assert held in spelled(request, "ConditionExpression")
    other = holder.replace_state({**item(), **table.state_key("e")}, lambda state: state, None, "updated")
    assert f"attribute_exists({table.CREDENTIALS}." not in spelled(other.request["Update"],
                                                                   "ConditionExpression")  # not its own device


def test_a_certificate_of_the_ca_opens_a_device_that_requires_none_and_a_credential_change_is_journaled():
    from functions.device_state import Holder
    from functions.device_state.item.credentials import CERTIFICATE_NEVER

    condition = spelled(Planner("devices", Fence(), NOW, seen_by="d", holder=Holder("c" * 8, certificate=True))
                        .replace_state(item(), lambda state: state, None, "updated").request["Update"],
                        "ConditionExpression")
    assert f"OR attribute_not_exists({table.CERTIFICATE_REQUIRED}))" in condition
    registered = PLANNER.register_credential(item(), "abcdefgh", 0, certificate=True)
    update = spelled(registered.request["Update"], "UpdateExpression")
    # a certificate's entry is its registration's own: without an expiry, a second past CERTIFICATE_NEVER
    entry = re.fullmatch(f"SET {table.CREDENTIALS} = " + r'\{"M":\{"abcdefgh":\{"N":"([0-9]+)"\}\}\}, '
                         f"{table.CERTIFICATE_REQUIRED} = " + r'\{"BOOL":true\}, '
                         + registered.write.attribute + " = version", update)
    assert entry and int(entry.group(1)) >= CERTIFICATE_NEVER, update
    again = spelled(PLANNER.register_credential(item(), "abcdefgh", 0, certificate=True).request["Update"],
                    "UpdateExpression")
    assert again.split(",")[0] != update.split(",")[0]  # registered again, another entry
    assert f"attribute_not_exists({registered.write.attribute})" in spelled(registered.request["Update"],
                                                                           "ConditionExpression")
    revoked = PLANNER.revoke_credential(item(**{table.CREDENTIALS: {"M": {"abcdefgh": {"N": "0"}}}}), "abcdefgh")
    assert spelled(revoked.request["Update"], "UpdateExpression") == \
        f"SET {revoked.write.attribute} = version REMOVE {table.CREDENTIALS}.abcdefgh"


def test_never_applied_markers_stay_as_long_as_dynamodb_takes_their_writes_copies_the_newest_eight():
    """The newest MARKERS_KEEP markers stay SIGNED_KEEP_SECONDS (DynamoDB refuses a request
    signed 15 minutes before), the others SETTLED_KEEP_SECONDS, as do all before their time."""
    from functions.device_state.item.journal import (MARKERS_KEEP, SETTLED_KEEP_SECONDS, SIGNED_KEEP_SECONDS,
                                                     trimming)
    from functions.device_state.write.expressions import Expression

    now = 1_800_000_000.0
    ages = [5, 30, *range(100, 100 + 10 * (MARKERS_KEEP + 2), 10), SIGNED_KEEP_SECONDS + 1]
    markers = {WriteId(int((now - age) * 1000), f"{index:06d}"): age for index, age in enumerate(ages)}
    item = {write.attribute: {"N": "0"} for write in markers}
    expr = Expression()
    removed, _ = trimming(expr, item, 1, now)
    dropped = {markers[write] for write in markers if expr.name(write.attribute) in removed}
    newest = sorted(markers.values())[:MARKERS_KEEP]
    assert dropped == {age for age in ages if age not in newest and age > SETTLED_KEEP_SECONDS}
    assert max(newest) < SIGNED_KEEP_SECONDS and SIGNED_KEEP_SECONDS + 1 in dropped
