"""POST /transactions: the body's operations parsed into library Operations, run as one
all-or-nothing transaction."""

from __future__ import annotations

from .resolver import Router

from functions.device_state import (DEVICE_SECTIONS, SECTIONS, STATE, InvalidDeviceId, InvalidPatch,
                                    InvalidValue, JsonPatch, MergePatch, Operation, transactions as tx,
                                    validate_device_id)
from functions.device_state import MAX_OPERATIONS

from functions.auth import rights

from . import access
from . import request_parsing as parse
from .common import IDEMPOTENT_REPLAYED, budget, idempotency_key, json_response, manager, route
from .problems import BadRequest

ACTIONS = ("mergePatch", "jsonPatch", "put", "delete", "check")

router = Router()


def _operation(index: int, entry) -> Operation:
    """One entry of ``operations`` as a library Operation."""
    where = f"operations[{index}]"
    if not isinstance(entry, dict):
        raise BadRequest(f"{where} must be an object")
    actions = [action for action in ACTIONS if action in entry]
    if len(actions) != 1:
        raise BadRequest(f"{where} needs exactly one of {', '.join(ACTIONS)}")
    action = actions[0]
    optional = ("ifMatch", "ifNoneMatch", "leaseToken") if action == "put" else ("ifMatch", "leaseToken")
    if action in ("mergePatch", "jsonPatch"):
        optional += ("section",)
    parse.json_object(entry, where, ("deviceId", action), optional)
    try:
        device_id = parse.not_reserved(validate_device_id(entry["deviceId"]))
    except InvalidDeviceId as error:
        raise BadRequest(f"{where}: {error}") from None
    expected, must_exist = None, False
    if "ifMatch" in entry:
        tags = parse.parse_entity_tags(entry["ifMatch"], f"{where}.ifMatch")
        if tags.any:
            must_exist = True
        elif len(tags.strong) == 1 and not tags.weak:
            expected = next(iter(tags.strong))
        else:
            raise BadRequest(f'{where}.ifMatch takes one strong entity tag such as "\\"3\\"", or *')
    value = entry[action]
    section = entry.get("section", STATE)
    if section not in SECTIONS:
        raise BadRequest(f"{where}.section must be one of {', '.join(SECTIONS)}")
    try:
        if action == "mergePatch":
            return Operation.update(device_id, MergePatch(value), expected, section=section)
        if action == "jsonPatch":
            return Operation.update(device_id, JsonPatch(value), expected, section=section)
    except InvalidPatch as error:
        raise BadRequest(f"{where}: {error}") from None
    except InvalidValue as invalid:  # keeps its limit; the detail says which operation
        invalid.args = (f"{where}: {invalid}",)
        raise
    if action == "put":
        put = parse.json_object(value, f"{where}.put", ("state",), DEVICE_SECTIONS)
        state = put["state"]
        sections = {name: parse.document(put[name], f"{where}.put.{name}") for name in DEVICE_SECTIONS if name in put}
        if "ifNoneMatch" in entry:
            if entry["ifNoneMatch"] != "*" or "ifMatch" in entry:
                raise BadRequest(f'{where}.ifNoneMatch takes only "*" (create only), without ifMatch')
            return Operation.create(device_id, state, sections)
        if expected is not None or must_exist:
            return Operation.replace(device_id, state, expected, sections)
        return Operation.put(device_id, state, sections)
    if value is not True:
        raise BadRequest(f"{where}.{action} must be true")
    if action == "delete":
        return Operation.delete(device_id, expected)
    return Operation.check(device_id, expected)


def _needed(operation: Operation) -> list[tuple[str, str]]:
    """Every (action, resource) an operation needs, as the same write on its own route would."""
    sections = {operation.section} if operation.action == tx.UPDATE else set(operation.sections or ())
    return rights.needed_for_write(operation.action, operation.device_id, sections)


@route(router, "/transactions", "POST", query=(parse.INCLUDE,), headers=(parse.IDEMPOTENCY_KEY,),
       body=True)
def run_transaction():
    event = router.current_event
    body = parse.json_object(parse.json_body(event), "the body", ("operations",))
    entries = body["operations"]
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_OPERATIONS:
        raise BadRequest(f"operations must be an array of 1 to {MAX_OPERATIONS} operations")
    operations = [_operation(index, entry) for index, entry in enumerate(entries)]
    principal = access.principal_of(event)
    for index, operation in enumerate(operations):  # every one, before anything is read or written
        rights.authorize_all(principal, _needed(operation), index=index)
    tokens = {operation.device_id: parse.lease_token(entry["leaseToken"], f"operations[{index}].leaseToken")
              for index, (operation, entry) in enumerate(zip(operations, entries)) if "leaseToken" in entry}
    key = idempotency_key(event, scope="transaction")
    devices = manager().fenced(tokens).transact(operations, idempotency=key, budget_seconds=budget(router.lambda_context))
    metadata = parse.include_metadata(event)
    result = {"devices": [None if operation.action == "delete" else device.as_dict(metadata)
                          for operation, device in zip(operations, devices)]}
    headers = {IDEMPOTENT_REPLAYED: "true"} if devices and devices[0].replayed else None
    return json_response(result, headers=headers)
