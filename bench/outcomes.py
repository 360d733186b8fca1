"""What knowing every write's outcome costs, and what it does under lost answers:
- bytes the write journal adds to a device item (it decides the WCU of every write) and
  to each write request, after read-modify-write, compiled and mixed workloads;
- a fault run: writers update one device through a forwarder that lets a share of the
  writes land and loses their answers; every update must be applied exactly once, and
  the count of OutcomeUnknown answers is reported.
Run by ``make bench`` (bench/contention.py) on the same DynamoDB Local."""

from __future__ import annotations

import json
import random
import re
import threading
import time
import uuid

from functions.device_state import DeviceStateManager, JsonPatch, MergePatch, OutcomeUnknown, RetriesExhausted
from functions.device_state import table
from functions.device_state.client import dynamodb_client
from functions.device_state.item.fencing import Fence
from functions.device_state.model.values import item_size
from functions.device_state.write.planner import Planner
from localdev.faults import Forwarder

INCREMENT = JsonPatch([{"op": "increment", "path": "/n", "value": 1}])
# Before the journal, every write carried one 32-character writeId (the last writer's).
WRITE_ID_BYTES_BEFORE = len("writeId") + 32


def _journal_bytes(item: dict) -> int:
    return item_size({name: value for name, value in item.items()
                      if name.startswith(table.JOURNAL_PREFIX) or name in (
                          table.JOURNAL_TRIMMED, table.JOURNAL_TRIMMED_STAMPS)})


def journal_costs(endpoint: str, table_name: str, writes: int = 200) -> dict:
    """Journal bytes on the item (max and mean over ``writes`` writes) per workload, and the
    bytes each write request adds for its own entry (name and version) and trims."""
    client = dynamodb_client(endpoint, "us-east-1")
    manager = DeviceStateManager(client, table_name)
    workloads = {
        "rmw": lambda index: MergePatch({"m": {"i": index}}),  # nested: read-modify-write
        "compiled": lambda index: INCREMENT,
        "mixed": lambda index: INCREMENT if index % 2 else MergePatch({"m": {"i": index}}),
    }
    result = {}
    for name, patch_of in workloads.items():
        device_id = f"journal-{name}-{uuid.uuid4().hex[:6]}"
        manager.create(device_id, {"n": 0, "m": {}})
        sizes = []
        for index in range(writes):
            manager.update_with_retry(device_id, patch_of(index))
            item = client.get_item(TableName=table_name, Key=table.state_key(device_id), ConsistentRead=True)["Item"]
            sizes.append(_journal_bytes(item))
        result[name] = {"item_bytes_max": max(sizes), "item_bytes_mean": round(sum(sizes) / len(sizes), 1)}
    # A read-modify-write planned over a full journal: its own entry, one trimmed entry and the watermark.
    full = manager.live_state(f"journal-rmw-{device_id.rsplit('-', 1)[1]}") or manager.live_state(device_id)
    request = Planner(table_name, Fence(), time.time()).replace_state(full, lambda state: state, None, "updated").request["Update"]
    names = {name: value for name, value in request["ExpressionAttributeNames"].items()
             if value.startswith(table.JOURNAL_PREFIX) or value == table.JOURNAL_TRIMMED}
    trimmed = next((name for name, value in names.items() if value == table.JOURNAL_TRIMMED), None)
    set_trimmed = re.search(rf"{trimmed} = (:\w+)", request["UpdateExpression"]) if trimmed else None
    values = {name: value for name, value in request["ExpressionAttributeValues"].items()
              if set_trimmed and name == set_trimmed.group(1)}
    fragments = ["#a9 = :a9, ", " AND attribute_not_exists(#a9)", ", #a9 = :a9", " REMOVE #a9"]
    result["request_bytes_per_write"] = len(json.dumps(names)) + len(json.dumps(values)) + sum(map(len, fragments))
    result["before_item_and_request_bytes"] = WRITE_ID_BYTES_BEFORE
    return result


def fault_run(dynamodb_port: int, table_name: str, writers: int = 8, updates: int = 20,
              loss: float = 0.1, seed: int = 7) -> dict:
    """``writers`` threads each apply ``updates`` read-modify-write and ``updates`` compiled
    increments to one device through a forwarder that loses ``loss`` of the UpdateItem
    answers after they landed. Counts answers by kind and checks exactly-once. Each writer
    has its own manager, as separate Lambdas do."""
    forwarder = Forwarder(dynamodb_port)
    forwarder.random_loss = ("UpdateItem", loss, random.Random(seed))
    direct = DeviceStateManager(dynamodb_client(f"http://127.0.0.1:{dynamodb_port}", "us-east-1"), table_name)
    managers = [DeviceStateManager(dynamodb_client(forwarder.endpoint, "us-east-1"), table_name)
                for _ in range(writers)]
    device_id = f"faults-{uuid.uuid4().hex[:6]}"
    direct.create(device_id, {"n": 0, "tokens": []})
    outcomes = {"applied": [], "unknown": [], "exhausted": []}
    lock = threading.Lock()

    def writer(index: int):
        for number in range(updates):
            token = f"{index}-{number}"
            for patch, kind in ((JsonPatch([{"op": "add", "path": "/tokens/-", "value": token}]), "rmw"),
                                (INCREMENT, "inc")):
                try:
                    managers[index].update_with_retry(device_id, patch)
                    outcome = "applied"
                except OutcomeUnknown:
                    outcome = "unknown"
                except RetriesExhausted:
                    outcome = "exhausted"
                with lock:
                    outcomes[outcome].append((kind, token))

    threads = [threading.Thread(target=writer, args=(index,)) for index in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    forwarder.close()
    device = direct.get(device_id)
    tokens = device.state["tokens"]
    applied_tokens = [token for kind, token in outcomes["applied"] if kind == "rmw"]
    applied_increments = sum(1 for kind, _ in outcomes["applied"] if kind == "inc")
    unknown_increments = sum(1 for kind, _ in outcomes["unknown"] if kind == "inc")
    return {
        "updates": writers * updates * 2,
        "answers_lost": len(forwarder.lost),
        "outcome_unknown": len(outcomes["unknown"]),
        "exhausted": len(outcomes["exhausted"]),
        "duplicated_tokens": len(tokens) - len(set(tokens)),
        "acknowledged_tokens_missing": sum(1 for token in applied_tokens if token not in tokens),
        "increments_beyond_acknowledged": int(device.state["n"]) - applied_increments,
        "unknown_increments": unknown_increments,
        "version_matches_changes": device.version == 1 + len(tokens) + int(device.state["n"]),
    }


def lines(costs: dict, faults: dict) -> list[str]:
    return [
        f"outcome journal: item bytes max/mean rmw {costs['rmw']['item_bytes_max']}/{costs['rmw']['item_bytes_mean']}, "
        f"compiled {costs['compiled']['item_bytes_max']}/{costs['compiled']['item_bytes_mean']}, "
        f"mixed {costs['mixed']['item_bytes_max']}/{costs['mixed']['item_bytes_mean']} "
        f"(before: one writeId, {costs['before_item_and_request_bytes']} bytes); "
        f"about {costs['request_bytes_per_write']} request bytes per write",
        f"lost answers: {faults['answers_lost']} of {faults['updates']} updates' answers lost; "
        f"OutcomeUnknown {faults['outcome_unknown']}, exhausted {faults['exhausted']}, "
        f"duplicated {faults['duplicated_tokens']}, acknowledged-but-missing {faults['acknowledged_tokens_missing']}, "
        f"increments beyond acknowledged {faults['increments_beyond_acknowledged']} "
        f"(<= unknown increments {faults['unknown_increments']}), "
        f"version counts changes: {faults['version_matches_changes']}",
    ]
