"""The fleet index on DynamoDB Local: every kind of write leaves the state item's index
attributes exactly as its sections say (one planner builds them into the write's own
request), the backfill of a field declared on a table with devices is resumable and
loses no race with writers, also when DynamoDB's answer is lost (beside a naive backfill
that does lose it), and queries wait for it with 503's reason."""

from __future__ import annotations

from decimal import Decimal

import time

import pytest

from functions.device_state import (DeviceStateManager, FleetIndex, IndexBuilding, JsonPatch, MergePatch,
                                    Operation, table)
from functions.device_state.client import dynamodb_client
from functions.device_state.item.schema import is_index_attribute
from functions.device_state.fleet.reindex import mark_ready
from functions.device_state.write.store import Store
from localdev.faults import Forwarder
from bench.fleet_load import clone_devices

from tests.conftest import new_table_name
from tests.helpers import own_dynamodb_local  # noqa: F401  (the fixture dynamodb_local: this module's own)

pytestmark = pytest.mark.dynamodb_local


FLEET = FleetIndex.parse("reported/firmware:string,reported/battery:number,reported/online:boolean,"
                         "state/site:string,desired/level/value:number")


def stored(client, name, device_id) -> dict:
    return client.get_item(TableName=name, Key={table.PARTITION_KEY: {"S": device_id}, table.SORT_KEY: {"S": "state"}},
                           ConsistentRead=True)["Item"]


def index_of(item: dict) -> dict:
    return {name: value for name, value in item.items() if is_index_attribute(name)}


def expected_index(manager, device_id) -> dict:
    device = manager.get(device_id)
    sets, _ = FLEET.attributes(device_id, {"state": device.state, "desired": device.desired,
                                           "reported": device.reported})
    return sets


@pytest.fixture
def fleet_table(dynamodb_local, local_table):
    client, name = local_table
    name += "-fleet"  # a table made with its indexes: quicker than adding five to the fixture's one by one
    table.create_table(client, name, FLEET, stream=False)
    manager = DeviceStateManager(client, name, fleet_index=FLEET)
    mark_ready(Store(manager.client, manager.table_name), FLEET.fields)
    yield client, name, manager
    client.delete_table(TableName=name)


@pytest.fixture
def indexed_table(dynamodb_local):
    """``indexed_table(declared)`` -> (client, name): a fresh table made with the declaration's
    indexes (deleted after). Devices written there without the declaration hold no index
    attribute, as on a table where the field is declared later; an index added by UpdateTable
    instead is built by DynamoDB Local in the background, where DescribeTable was seen to fail
    (InternalFailure) and the index to stay CREATING under load (ensure_table's own test adds
    one, to an empty table)."""
    client, made = dynamodb_client(dynamodb_local.endpoint, "us-east-1"), []

    def make(declared: FleetIndex) -> tuple:
        made.append(new_table_name())
        table.create_table(client, made[-1], declared, stream=False)
        return client, made[-1]

    yield make
    for name in made:
        client.delete_table(TableName=name)


def check(client, name, manager, device_id):
    assert index_of(stored(client, name, device_id)) == expected_index(manager, device_id)


def test_every_kind_of_write_leaves_the_index_attributes_its_sections_say(fleet_table):
    client, name, manager = fleet_table
    manager.create("d1", {"site": "berlin-1"}, sections={"reported": {"firmware": "2.0", "battery": 5, "online": True},
                                                         "desired": {"level": {"value": 3}}})
    check(client, name, manager, "d1")
    assert set(index_of(stored(client, name, "d1"))) == {field.attribute for field in FLEET.fields} | {"ixShard"}
    steps = [
        lambda: manager.update_with_retry("d1", MergePatch({"site": "paris"})),  # compiled, state
        lambda: manager.update_with_retry("d1", MergePatch({"firmware": "2.1"}), section="reported"),
        lambda: manager.update_with_retry("d1", MergePatch({"firmware": 21}), section="reported"),  # wrong type
        lambda: manager.update_with_retry("d1", MergePatch({"firmware": "x" * 101}), section="reported"),  # too long
        lambda: manager.update_with_retry("d1", MergePatch({"firmware": ""}), section="reported"),
        lambda: manager.update_with_retry("d1", JsonPatch([{"op": "increment", "path": "/battery", "value": 7}]),
                                          section="reported"),
        lambda: manager.update_with_retry("d1", MergePatch({"firmware": None}), section="reported"),
        lambda: manager.update_with_retry("d1", JsonPatch([{"op": "increment", "path": "/firmware", "value": 1}]),
                                          section="reported"),  # a string field becoming a number
        lambda: manager.update_with_retry("d1", JsonPatch([{"op": "remove", "path": "/online"}]), section="reported"),
        lambda: manager.update_with_retry("d1", MergePatch({"online": False}), section="reported"),
        lambda: manager.update_with_retry("d1", MergePatch({"level": None}), section="desired"),  # parent removed
        lambda: manager.update_with_retry("d1", JsonPatch([{"op": "add", "path": "/level", "value": {"value": 9}}]),
                                          section="desired"),  # parent set with the field inside
        lambda: manager.update_with_retry("d1", MergePatch({"level": {"value": {"deep": 1}}}), section="desired"),
        lambda: manager.update_with_retry("d1", lambda reported: {**reported, "battery": "low"}, section="reported"),
        lambda: manager.update("d1", lambda state: {**state, "site": "rome"}, manager.get("d1").version),
        lambda: manager.replace("d1", {"site": 4}),
        lambda: manager.transact([Operation.update("d1", MergePatch({"battery": 1, "firmware": "3"}),
                                                   section="reported")]),
        lambda: manager.transact([Operation.put("d1", {"site": "oslo"}, {"reported": {"online": True}})]),
        lambda: manager.replace_section("d1", "desired", {"level": {"value": Decimal("2.5")}}),
    ]
    for step in steps:
        step()
        check(client, name, manager, "d1")
    manager.delete("d1")
    assert index_of(stored(client, name, "d1")) == {}
    manager.create("d1", {"site": "again"})
    check(client, name, manager, "d1")
    assert manager.count_devices('eq(state/site,"again")') == {"count": 1}


def test_a_field_declared_on_a_table_with_devices_is_backfilled_resumably_and_queries_wait_for_it(indexed_table):
    declared = FleetIndex.parse("reported/battery:number")
    client, name = indexed_table(declared)
    plain = DeviceStateManager(client, name)  # writers before the declaration
    for number in range(130):  # more than a backfill page
        plain.create(f"b{number:03d}", {"site": f"s{number % 5}"}, sections={"reported": {"battery": number}})
    manager = DeviceStateManager(client, name, fleet_index=declared)
    with pytest.raises(IndexBuilding) as waiting:
        manager.count_devices("gt(reported/battery,100)")
    assert waiting.value.progress["state"] == "not-started"
    assert manager.reindex(budget_seconds=0) is False  # one page, then it stops
    with pytest.raises(IndexBuilding) as waiting:
        manager.query_devices("gt(reported/battery,100)")
    assert waiting.value.progress["scanned"] > 0
    assert manager.reindex() is True  # it resumes
    assert manager.count_devices("gt(reported/battery,100)") == {"count": 29}
    assert manager.reindex() is True  # nothing left: it writes nothing
    assert manager.count_devices("ge(reported/battery,0)") == {"count": 130}


@pytest.mark.parametrize("between", [False, True], ids=["alone", "another-writer-between"])
def test_a_backfill_write_whose_answer_is_lost_leaves_the_index_right(dynamodb_local, indexed_table, between):
    declared = FleetIndex.parse("reported/battery:number")
    client, name = indexed_table(declared)
    DeviceStateManager(client, name).create("r1", {}, sections={"reported": {"battery": 1}})
    forwarder = Forwarder(dynamodb_local.port)
    try:
        faulty = DeviceStateManager(dynamodb_client(forwarder.endpoint, "us-east-1"), name, fleet_index=declared)
        other = DeviceStateManager(client, name, fleet_index=declared)
        writer = (lambda: other.update_with_retry("r1", MergePatch({"battery": 2}), section="reported")) \
            if between else None
        forwarder.lose("UpdateItem", then=writer)
        assert faulty.reindex() is True
        assert forwarder.lost == ["UpdateItem"]
        item = stored(client, name, "r1")
        assert item[declared.fields[0].attribute] == {"N": "2" if between else "1"}
        assert other.count_devices(f"eq(reported/battery,{2 if between else 1})") == {"count": 1}
    finally:
        forwarder.close()


def test_a_naive_backfill_loses_the_race_with_a_writer(indexed_table):
    """The control: index attributes computed from a read and written unconditionally keep
    the value a writer replaced in between."""
    declared = FleetIndex.parse("reported/battery:number")
    client, name = indexed_table(declared)
    DeviceStateManager(client, name).create("n1", {}, sections={"reported": {"battery": 1}})
    other = DeviceStateManager(client, name, fleet_index=declared)
    item = stored(client, name, "n1")
    sets, _ = declared.attributes("n1", {"reported": {"battery": 1}})
    other.update_with_retry("n1", MergePatch({"battery": 2}), section="reported")  # lands between read and write
    client.update_item(TableName=name, Key={table.PARTITION_KEY: item[table.PARTITION_KEY],
                                             table.SORT_KEY: item[table.SORT_KEY]},
                       UpdateExpression="SET " + ", ".join(f"#a{i} = :v{i}" for i in range(len(sets))),
                       ExpressionAttributeNames={f"#a{i}": attribute for i, attribute in enumerate(sets)},
                       ExpressionAttributeValues={f":v{i}": value for i, value in enumerate(sets.values())})
    assert stored(client, name, "n1")[declared.fields[0].attribute] == {"N": "1"}  # stale: the device holds 2
    assert other.get("n1").reported["battery"] == 2


def test_a_count_waits_for_every_declared_field_it_names(indexed_table):
    """A count reads the index of each declared predicate: one still building answers 503,
    even when the and's cheapest branch is on a ready field."""
    declared = FleetIndex.parse("reported/online:boolean,reported/battery:number")
    client, name = indexed_table(declared)
    DeviceStateManager(client, name).create("w1", {}, sections={"reported": {"battery": 1, "online": True}})
    manager = DeviceStateManager(client, name, fleet_index=declared)
    mark_ready(Store(manager.client, manager.table_name), declared.fields[:1])  # online ready, battery still building
    for text in ("and(eq(reported/online,true),gt(reported/battery,0))",
                 "and(eq(reported/online,true),not(eq(reported/battery,5)))"):
        with pytest.raises(IndexBuilding) as waiting:
            manager.count_devices(text)
        assert waiting.value.fields == ["reported/battery"]


def test_a_field_declared_on_a_table_without_devices_is_ready_at_once(dynamodb_local, local_table):
    client, name = local_table
    sites = FleetIndex.parse("state/site:string")
    table.ensure_table(client, name, sites)
    manager = DeviceStateManager(client, name, fleet_index=sites)  # no ready marks: the table is empty
    assert manager.count_devices("exists(state/site)") == {"count": 0}
    manager.create("e1", {"site": "x"})
    assert manager.count_devices("exists(state/site)") == {"count": 1}


def test_a_field_taken_out_and_declared_again_is_filled_afresh(indexed_table):
    battery = FleetIndex.parse("reported/battery:number")
    both = FleetIndex.parse("reported/battery:number,state/site:string")
    sites = FleetIndex.parse("state/site:string")
    client, name = indexed_table(both)
    first = DeviceStateManager(client, name, fleet_index=both)
    first.create("r1", {"site": "a"}, sections={"reported": {"battery": 1}})
    assert first.reindex() is True
    without = DeviceStateManager(client, name, fleet_index=sites)  # battery taken out
    without.update_with_retry("r1", MergePatch({"battery": 2}), section="reported")  # nothing keeps its index
    assert without.reindex() is True  # forgets battery and removes its stale attribute
    assert battery.fields[0].attribute not in stored(client, name, "r1")
    again = DeviceStateManager(client, name, fleet_index=both)
    with pytest.raises(IndexBuilding):
        again.count_devices("eq(reported/battery,2)")
    assert again.reindex() is True
    assert again.count_devices("eq(reported/battery,2)") == {"count": 1}
    assert again.count_devices("eq(reported/battery,1)") == {"count": 0}
    assert battery.fields[0].attribute in stored(client, name, "r1")


def test_forged_cursors_and_oversized_filters_are_refused_as_bad_requests(fleet_table):
    import base64
    import json
    import zlib

    from functions.device_state import InvalidCursor, InvalidFilter

    client, name, manager = fleet_table
    for number in range(6):
        manager.create(f"c{number}", {"site": f"s{number % 2}"})
    def encoded(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    key = b"the service's key, 32 bytes or more"
    manager = DeviceStateManager(client, name, fleet_index=FLEET, cursor_key=key)
    _, cursor = manager.query_devices('eq(state/site,"s0")', limit=1)
    body, mac = cursor.split(".")
    position = json.loads(zlib.decompress(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))[1:]))
    moved = [shard if not isinstance(shard, list) else [shard[0], "s1"] for shard in position["p"]]
    forged = f"{encoded(json.dumps({**position, 'p': moved}).encode())}.{mac}"  # a position moved, the seal kept
    deep = f"{encoded(b'[' * 6000)}.{mac}"
    other_key = DeviceStateManager(client, name, fleet_index=FLEET, cursor_key=b"another key, as after a rotation, 32+")
    rotated = other_key.query_devices('eq(state/site,"s0")', limit=1)[1]  # the same position under another key
    for bad in (forged, deep, cursor[:-4], rotated, encoded(json.dumps(position).encode())):
        with pytest.raises(InvalidCursor):
            manager.query_devices('eq(state/site,"s0")', limit=1, cursor=bad)
    for other in ('eq(state/site,"s1")', 'eq(state/site, "s0")'):  # another filter, however alike
        with pytest.raises(InvalidCursor):
            manager.query_devices(other, limit=1, cursor=cursor)
    same_key = DeviceStateManager(client, name, fleet_index=FLEET, cursor_key=key)
    assert same_key.query_devices('eq(state/site,"s0")', limit=5, cursor=cursor)[0]  # another instance takes it
    with pytest.raises(InvalidFilter, match="at most 100"):
        manager.count_devices("or(" + ",".join(f"eq(reported/battery,{n})" for n in range(101)) + ")")
    # a page reads its and's cheapest child, a count every declared one: 9 x 100 in values took 21-37 s
    # to count (a deployed function is stopped at 28 s), while a page of the filter is within the bound
    values = ",".join(str(number) for number in range(100))
    nine = "and(" + ",".join("in(reported/battery," + ",".join(str(100 * child + number) for number in range(100)) + ")"
                             for child in range(9)) + ")"
    assert manager.query_devices(nine, limit=1)[0] == []
    for refused, group in ((nine, None), (f"and(in(reported/battery,{values}),exists(state/site))", None),
                           (f"in(reported/battery,{values})", "state/site")):
        with pytest.raises(InvalidFilter, match=r"counting this filter reads (900|101) ranges"):
            manager.count_devices(refused, group_by=group)
    assert manager.count_devices(f"in(reported/battery,{values})") == {"count": 0}  # 100: within the bound
    ordered = [device.state["site"] for device in manager.query_devices("exists(state/site)", sort=" state/site")[0]]
    assert ordered == sorted(ordered) and ordered[0] == "s0"  # an unencoded + arrives as a space
    first, onward = manager.query_devices("exists(state/site)", limit=2, sort="+state/site")
    rest, _ = manager.query_devices("exists(state/site)", limit=10, sort=" state/site", cursor=onward)  # one sort
    assert [d.state["site"] for d in first + rest] == ordered


def item_reads(spy, name) -> list[int]:
    """How many devices' items each BatchGetItem read (the fleet index's readiness marks are no device)."""
    return [sum(key[table.SORT_KEY]["S"] == table.STATE_SK for key in request["RequestItems"][name]["Keys"])
            for operation, request in spy.requests if operation == "batch_get_item"]


def test_a_count_reads_a_bounded_number_of_index_entries_and_items_and_is_refused_past_them(fleet_table):
    """Every index Query carries a Limit; a count that would judge more devices' items than it
    may is refused before it reads one, and one that would read more index entries than it may
    is refused once it has (never reading on); within the bounds the same counts are answered."""
    from functions.device_state import FilterTooBroad
    from functions.device_state.fleet.cursors import CursorSeal
    from functions.device_state.fleet.query import INDEX_PAGE, FleetQuery
    from tests.helpers import RecordingClient

    client, name, manager = fleet_table
    for number in range(12):
        manager.create(f"n{number:02d}", {"site": "s", **({"x": number} if number % 2 else {})})
    spy = RecordingClient(client)

    def fleet(**bounds) -> FleetQuery:
        return FleetQuery(Store(spy, name), FLEET, time.time, CursorSeal(None), **bounds)

    judged = 'and(eq(state/site,"s"),exists(state/x))'
    with pytest.raises(FilterTooBroad) as refused:
        fleet(max_count_items=11).count(judged)
    assert (refused.value.limit, refused.value.fields) == ("count-items", ["state/x"])
    assert not any(item_reads(spy, name))
    assert fleet(max_count_items=12).count(judged) == {"count": 6}
    assert [reads for reads in item_reads(spy, name) if reads] == [12]  # one BatchGetItem (of 100 at most)
    spy.requests.clear()
    with pytest.raises(FilterTooBroad) as refused:
        fleet(max_count_index_entries=11).count("exists(state/site)")
    assert refused.value.limit == "count-index-entries"
    with pytest.raises(FilterTooBroad) as narrowed:  # an and(…) reads each declared predicate's range in full
        fleet(max_count_index_entries=11).count('and(exists(state/site),eq(state/site,"t"))')
    assert narrowed.value.limit == "count-index-entries"
    assert "does not lessen" in str(narrowed.value) and "narrow the broad predicate itself" in str(narrowed.value)
    assert fleet(max_count_index_entries=12).count("exists(state/site)") == {"count": 12}
    queries = [request for operation, request in spy.requests if operation == "query"]
    assert queries and all(request["Limit"] == INDEX_PAGE for request in queries)


class _IndexReads:
    """A client that counts the index entries its queries of a global secondary index return."""

    def __init__(self, client):
        self._client, self.entries = client, 0

    def __getattr__(self, name):
        call = getattr(self._client, name)
        if name != "query":
            return call

        def counted(**request):
            answer = call(**request)
            if "IndexName" in request:
                self.entries += len(answer.get("Items", []))
            return answer
        return counted


def test_a_page_of_a_value_many_devices_share_reads_about_twice_its_size_of_the_index(fleet_table):
    """1,700 devices at one site: each of the 16 shards holds more than a page. A page of 100
    reads a share of it from each shard (twice an even share), not 100 from each (1,600), and
    the walk still finds each device once."""
    from functions.device_state.fleet.cursors import CursorSeal
    from functions.device_state.fleet.query import FleetQuery

    client, name, manager = fleet_table
    ids = [f"site-{number:04d}" for number in range(1700)]
    manager.create(ids[0], {"site": "porch"})
    clone_devices(client, name, FLEET, ids[0], ids[1:], lambda _: {"state": {"site": "porch"}})
    reads = _IndexReads(client)
    query = FleetQuery(Store(reads, name), FLEET, time.time, CursorSeal())
    found, cursor = query.page_items('eq(state/site,"porch")', 100)
    assert len(found) == 100 and reads.entries <= 250, reads.entries
    walked = [item[table.PARTITION_KEY]["S"] for item in found]
    while cursor:
        found, cursor = query.page_items('eq(state/site,"porch")', 100, cursor)
        walked += [item[table.PARTITION_KEY]["S"] for item in found]
    assert sorted(walked) == ids
    assert reads.entries <= 3 * len(ids), reads.entries  # the whole walk: about twice the index, not 16 times


def test_a_cloned_device_is_indexed_for_its_own_id_and_documents(fleet_table):
    """``bench.fleet_load``, which benches and tests load fleets with: a clone carries the index
    attributes the library's writes would give its own id and documents, none of the template's."""
    client, name, manager = fleet_table
    manager.create("t0", {"site": "porch"}, sections={"reported": {"battery": 5}})
    clone_devices(client, name, FLEET, "t0", ["t1", "t2"],
                  lambda device_id: {"state": {}, "reported": {"battery": int(device_id[1:])}})
    for device_id in ("t1", "t2"):
        assert manager.get(device_id).reported == {"battery": int(device_id[1:])}
        assert index_of(stored(client, name, device_id)) == expected_index(manager, device_id)
    assert index_of(stored(client, name, "t1")) != index_of(stored(client, name, "t2"))
