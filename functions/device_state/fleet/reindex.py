"""Whether each declared field's index is ready, and the resumable job that makes it so.

A field declared when the table holds no device is ready at once. Declared on a table
that holds devices, its index attributes exist only on devices written since: the job
(``make reindex``; deployed, the stack's reindex function) scans the table and sets them
on every other device, through the one pipeline (``Planner.reindex``, at the device's
version, so a write landing meanwhile wins), saving its position after every page so that
it resumes where it stopped. Until it finishes, queries on those fields answer
``IndexBuilding`` with its progress.

The bookkeeping lives in a partition no device can take (device ids hold no ``~``): one
item per ready field (``sk`` = its index attribute) and one for the job.
"""

from __future__ import annotations

import logging
import time

from ..errors import ConditionFailed, DeviceNotFound
from ..item import schema
from ..model.times import timestamp
from ..write.expressions import Expression, live
from ..write.outcomes import Moved
from .index import FleetIndex

STATUS_PARTITION = "~fleet-index"
JOB_SK = "job"
PAGE_SIZE = 100

logger = logging.getLogger(__name__)
# The reindex job's item (its progress, beside the state items it backfills).
_DECLARATION, _SCANNED, _UPDATED_AT = "declaration", "scanned", "updatedAt"


def _key(sort_key: str) -> dict:
    return {schema.PARTITION_KEY: {"S": STATUS_PARTITION}, schema.SORT_KEY: {"S": sort_key}}


def building(store, fleet_index: FleetIndex) -> list:
    """The declared fields whose index is not yet ready."""
    if not fleet_index:
        return []
    answer = store.send("batch_get_item", RequestItems={store.table_name: {
        "Keys": [_key(field.attribute) for field in fleet_index.fields], "ConsistentRead": True}})
    ready = {item[schema.SORT_KEY]["S"] for item in answer.get("Responses", {}).get(store.table_name, [])}
    return [field for field in fleet_index.fields if field.attribute not in ready]


def progress(store) -> dict:
    """How far the job got: devices scanned, the table's approximate item count, when it
    last moved (``state`` ``not-started`` before its first page)."""
    item = store.get(_key(JOB_SK))
    if item is None:
        return {"state": "not-started", "scanned": 0}
    return {"state": "building", "scanned": int(item[_SCANNED]["N"]), "updatedAt": item[_UPDATED_AT]["S"],
            "declaration": item[_DECLARATION]["S"]}


def forget_undeclared(store, fleet_index: FleetIndex) -> list[str]:
    """Drop the ready marks of fields no longer declared, so that one declared again is
    backfilled again (its index attributes went stale while nothing kept them); the index
    attributes of those dropped."""
    expr = Expression()
    marks = store.query_all({"KeyConditionExpression": f"{expr.name(schema.PARTITION_KEY)} = "
                                                       f"{expr.value({'S': STATUS_PARTITION})}",
                             "ConsistentRead": True, **expr.attributes()})
    declared = {field.attribute for field in fleet_index.fields} | {JOB_SK}
    forgotten = [mark[schema.SORT_KEY]["S"] for mark in marks if mark[schema.SORT_KEY]["S"] not in declared]
    for attribute in forgotten:
        store.send("delete_item", Key=_key(attribute))
    return forgotten


def _job(store) -> dict | None:
    return store.get(_key(JOB_SK))


def mark_ready(store, fields) -> None:
    for field in fields:
        store.send("put_item", Item={**_key(field.attribute), "readyAt": {"S": timestamp(time.time())}})


def has_devices(store) -> bool:
    """True when the table holds any device's state item (one Scan call per 1 MB read)."""
    expr = Expression()
    request = {"FilterExpression": f"{expr.name(schema.SORT_KEY)} = {expr.value({'S': schema.STATE_SK})}",
               "ProjectionExpression": expr.name(schema.PARTITION_KEY), **expr.attributes()}
    while True:
        page = store.send("scan", **request)
        if page.get("Items"):
            return True
        if not page.get("LastEvaluatedKey"):
            return False
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def reindex(pipeline, fleet_index: FleetIndex, *, budget_seconds: float | None = None,
            report=lambda progress: None) -> bool:
    """Backfill every field not yet ready; True when all are ready, False when the budget
    ran out first (call again: it resumes). ``report`` hears the progress after each page."""
    store = pipeline.store
    forgotten = forget_undeclared(store, fleet_index)
    fields = building(store, fleet_index)
    if not fields and not forgotten and not _job(store):
        return True
    if not has_devices(store):
        mark_ready(store, fields)
        return True
    deadline = None if budget_seconds is None else time.monotonic() + budget_seconds
    job = _job(store)
    declaration = fleet_index.declaration
    same_job = job is not None and job[_DECLARATION]["S"] == declaration
    start = _decoded(job["cursor"]["S"]) if same_job and "cursor" in job else None
    scanned = int(job[_SCANNED]["N"]) if same_job else 0
    while True:
        expr = Expression()
        request = {"Limit": PAGE_SIZE, "ConsistentRead": True, **({"ExclusiveStartKey": start} if start else {}),
                   "FilterExpression": f"{expr.name(schema.SORT_KEY)} = {expr.value({'S': schema.STATE_SK})} "
                                       f"AND {live(expr, int(time.time()))}", **expr.attributes()}
        page = store.send("scan", **request)
        for item in page.get("Items", []):
            _reindex_device(pipeline, item)
        scanned += len(page.get("Items", []))
        start = page.get("LastEvaluatedKey")
        _save(store, declaration, scanned, start)
        report({"scanned": scanned, "done": start is None})
        if start is None:
            mark_ready(store, fields)
            store.send("delete_item", Key=_key(JOB_SK))
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False


def _reindex_device(pipeline, item: dict) -> None:
    """Plan and send the device's index attributes, again from the newer item while other
    writes move it; a device deleted meanwhile needs none."""
    for _ in range(100):
        planner = pipeline.planner()
        if not schema.is_live_state(item, planner.now):
            return
        planned = planner.reindex(item)
        if planned is None:
            return
        try:
            pipeline.send(planner, planned)
            return
        except Moved as moved:
            item = moved.item
        except DeviceNotFound:
            return
        except ConditionFailed as refused:  # no room on the item for the index attributes
            logger.warning("reindex left %s unindexed: its item has no room for the index attributes",
                           refused.device_id)
            return
    logger.warning("reindex gave up on %s: it kept moving", schema.StateItem.of(item).device_id)


def _save(store, declaration: str, scanned: int, start: dict | None) -> None:
    job = {**_key(JOB_SK), _DECLARATION: {"S": declaration}, _SCANNED: {"N": str(scanned)},
           _UPDATED_AT: {"S": timestamp(time.time())}}
    if start is not None:
        job["cursor"] = {"S": _encoded(start)}
    store.send("put_item", Item=job)


def _encoded(key: dict) -> str:
    return f"{key[schema.PARTITION_KEY]['S']}\n{key[schema.SORT_KEY]['S']}"


def _decoded(text: str) -> dict:
    device_id, sort_key = text.split("\n", 1)
    return {schema.PARTITION_KEY: {"S": device_id}, schema.SORT_KEY: {"S": sort_key}}
