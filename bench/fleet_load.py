"""Many devices at once, for benches and tests that need a fleet rather than its writes: one
device the library created is read back and cloned with BatchWriteItem, 25 to a request. Each
clone has its own key, the documents it is given in place of the template's, and the fleet
index attributes of its own id and documents; everything else (version, metadata, journal) is
the template's. Loading is not a write under test: a clone makes no change item of its own."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from functions.device_state import FleetIndex, table
from functions.device_state.item.schema import SECTIONS
from functions.device_state.model.values import from_attribute, to_attribute

BATCH = 25  # BatchWriteItem's most


def clone_devices(client, table_name: str, fleet_index: FleetIndex, template_id: str, ids: Sequence[str],
                  documents_of: Callable[[str], dict], workers: int = 4) -> None:
    """Writes a clone of ``template_id``'s state item for each of ``ids``, with the documents
    (by section: ``state``, ``desired``, ``reported``) ``documents_of(device_id)`` gives; the
    index attributes follow from them as the library's writes set them."""
    template = client.get_item(TableName=table_name, Key=table.state_key(template_id), ConsistentRead=True)["Item"]
    kept = {section: from_attribute(template[section]) for section in SECTIONS if section in template}

    def clone(device_id: str) -> dict:
        documents = documents_of(device_id)
        item = copy.deepcopy(template)
        item.update(table.state_key(device_id))
        item.update({section: to_attribute(document) for section, document in documents.items()})
        indexed, removed = fleet_index.attributes(device_id, {**kept, **documents}, SECTIONS)
        for attribute in removed:
            item.pop(attribute, None)
        item.update(indexed)
        return item

    def write(chunk: Sequence[str]) -> None:
        pending = [{"PutRequest": {"Item": clone(device_id)}} for device_id in chunk]
        while pending:
            answer = client.batch_write_item(RequestItems={table_name: pending})
            pending = answer.get("UnprocessedItems", {}).get(table_name, [])

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(write, [ids[start:start + BATCH] for start in range(0, len(ids), BATCH)]))
