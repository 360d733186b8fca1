"""The one door to DynamoDB: every request goes through ``Store.send``, which owns error
translation and the retry policy, plus the reads every part of the library shares.

Retry policy, by what a failed request may have done:
- surely nothing (throttling, a connection never made): sent again with backoff;
- maybe applied (a read timeout, a reset connection, a DynamoDB 5xx):
  - a read, or a write made idempotent by a ``ClientRequestToken``: sent again;
  - any other write: never sent again here. ``AnswerLost`` goes up to the write
    pipeline, which settles the outcome (see ``Planner.settle_mark``).
The client must not retry on its own (``client.dynamodb_client`` makes one that does
not): a blind resend of a conditional write whose first copy landed is a second write.
"""

from __future__ import annotations

from botocore.exceptions import (BotoCoreError, ClientError, ConnectTimeoutError, EndpointConnectionError,
                                 ParamValidationError)

from ..errors import (
    AnswerLost,
    ConditionNotMet,
    ItemTooLarge,
    RequestRefused,
    StorageError,
    StorageUnavailable,
)
from ..item import schema
from ..model.values import MAX_ITEM_BYTES
from ..runtime import Runtime, last_send_start

THROTTLING_CODES = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
     "TransactionInProgressException"})
# A transaction's cancellation reasons that mean DynamoDB refused it for throughput: nothing written.
THROTTLED_REASONS = frozenset({"ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded"})
SEND_ATTEMPTS = 3  # sends of one request at most, where sending again is safe
# The requests DynamoDB bills in request units: each asks for its ConsumedCapacity (free), which
# goes to the observer.
METERED = frozenset({"get_item", "query", "scan", "batch_get_item", "put_item", "update_item", "delete_item",
                     "transact_write_items"})
READS = frozenset({"get_item", "query", "scan", "batch_get_item"})

# How a request is sent: a read, a write that DynamoDB itself makes idempotent (a
# transaction with a ClientRequestToken, a put of a whole item), or a write that may
# apply at most once and is therefore never sent twice.
READ, IDEMPOTENT, ONCE = "read", "idempotent", "once"


class Cancelled(Exception):
    """A transaction was cancelled (nothing written); ``reasons`` are DynamoDB's, one per action."""

    def __init__(self, reasons: list[dict]):
        super().__init__("transaction cancelled")
        self.reasons = reasons


class FailedAnswer(AnswerLost):
    """DynamoDB answered a write with a server error (5xx): it may or may not have
    applied, but, unlike a lost answer, one that is settled as never applied is not
    sent again (the same request may meet the same failure every time)."""


class Store:
    """The table's door: ``send`` for every request, and the shared reads."""

    def __init__(self, client, table_name: str, runtime: Runtime | None = None):
        self.client = client
        self.table_name = table_name
        self.runtime = runtime or Runtime()

    def send(self, operation: str, mode: str = READ, deadline: float | None = None, **request) -> dict:
        """Send one request (``TableName`` is added), translating DynamoDB's errors."""
        if operation not in ("transact_write_items", "batch_get_item"):
            request.setdefault("TableName", self.table_name)
        if operation in METERED:
            request.setdefault("ReturnConsumedCapacity", "TOTAL")
        attempt, maybe_applied = 0, False
        while True:
            attempt += 1
            failed_answer = False
            try:
                answer = getattr(self.client, operation)(**request)
                self._meter(operation, answer)
                return answer
            except ClientError as error:
                details = error.response.get("Error", {})
                code, message = details.get("Code", ""), details.get("Message", "")
                if code == "ConditionalCheckFailedException":
                    raise ConditionNotMet(error.response.get("Item")) from None
                if code == "TransactionCanceledException":
                    reasons = error.response.get("CancellationReasons") or []
                    codes = {reason.get("Code") or "None" for reason in reasons}
                    if not codes & THROTTLED_REASONS or codes - THROTTLED_REASONS - {"None"}:
                        raise Cancelled(reasons) from None
                    code = "ThrottlingException"  # throttled and nothing else: nothing written, send again
                if code == "ValidationException" and "item size" in message.lower() and "exceed" in message:
                    raise ItemTooLarge(f"the item would exceed DynamoDB's limit of {MAX_ITEM_BYTES} bytes") from None
                status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if code in THROTTLING_CODES:
                    applied = False
                elif status >= 500:
                    applied, failed_answer = None, True
                elif code == "ValidationException":
                    raise RequestRefused(f"DynamoDB {operation} refused: {message}") from error
                else:
                    raise StorageError(f"DynamoDB {operation} refused: {code}: {message}") from error
                cause = f"{code or status}"
            except (ConnectTimeoutError, EndpointConnectionError) as error:
                applied, cause = False, type(error).__name__
            except ParamValidationError as error:  # botocore's own check of the request: nothing was sent
                raise RequestRefused(f"DynamoDB {operation} not sent: {error}") from None
            except BotoCoreError as error:
                applied, cause = None, type(error).__name__
            lost = FailedAnswer if failed_answer else AnswerLost
            what = "it answered a server error" if failed_answer else "the answer was lost"
            if applied is None and mode == ONCE:
                raise lost(f"DynamoDB {operation}: {what} ({cause})")
            maybe_applied = maybe_applied or (applied is None and mode == IDEMPOTENT)
            latest = min((moment for moment in (deadline, last_send_start()) if moment is not None), default=None)
            out_of_time = latest is not None and self.runtime.monotonic() >= latest
            if attempt >= SEND_ATTEMPTS or out_of_time:
                if maybe_applied:
                    raise lost(f"DynamoDB {operation}: {what} ({cause})")
                raise StorageUnavailable(f"DynamoDB {operation} failed {attempt} times ({cause}); nothing was written")
            self.runtime.pause(attempt)

    def _meter(self, operation: str, answer: dict) -> None:
        consumed = answer.get("ConsumedCapacity")
        units = sum(entry.get("CapacityUnits", 0) for entry in (consumed if isinstance(consumed, list) else [consumed])
                    if entry)
        if units:
            read = operation in READS
            self.runtime.observer.consumed(operation, units if read else 0.0, 0.0 if read else units)

    # ------------------------------------------------------------------ reads

    def get(self, key: dict, deadline: float | None = None) -> dict | None:
        """One item, strongly consistent, as stored (None when absent); sent again on no answer
        only until ``deadline`` (monotonic), if given."""
        return self.send("get_item", deadline=deadline, Key=key, ConsistentRead=True).get("Item")

    def get_state(self, device_id: str, deadline: float | None = None) -> dict | None:
        return self.get(schema.state_key(device_id), deadline)

    def get_live_state(self, device_id: str, now: float) -> dict | None:
        """The device's state item if it is live at ``now`` (not deleted, not expired), else None."""
        item = self.get_state(device_id)
        return item if schema.is_live_state(item, now) else None

    def batch_get(self, keys: list[dict]) -> dict[tuple[str, str], dict]:
        """Up to 100 items by key (as stored), strongly consistent, in one batch: by (partition, sort key)."""
        found: dict[tuple[str, str], dict] = {}
        pending = list(keys)
        for round_no in range(1, 11):
            response = self.send("batch_get_item", RequestItems={
                self.table_name: {"Keys": pending, "ConsistentRead": True}})
            for item in response.get("Responses", {}).get(self.table_name, []):
                found[(item[schema.PARTITION_KEY]["S"], item[schema.SORT_KEY]["S"])] = item
            pending = response.get("UnprocessedKeys", {}).get(self.table_name, {}).get("Keys", [])
            if not pending:
                return found
            self.runtime.pause(round_no)
        raise StorageUnavailable("DynamoDB left keys unprocessed after 10 batch reads")

    def batch_get_states(self, device_ids: list[str]) -> dict[str, dict]:
        """The state items (as stored) of up to 100 devices, strongly consistent, in one batch."""
        found = self.batch_get([schema.state_key(device_id) for device_id in device_ids])
        return {device_id: item for (device_id, _), item in found.items()}

    def get_state_with(self, device_id: str, key: dict) -> tuple[dict | None, dict | None]:
        """The device's state item and another item of its partition (as stored, either None),
        strongly consistent, in one batch."""
        found = self.batch_get([schema.state_key(device_id), key])
        return found.get((device_id, schema.STATE_SK)), found.get((device_id, key[schema.SORT_KEY]["S"]))

    def query_all(self, request: dict) -> list[dict]:
        """Every item of a Query, page after page."""
        request = dict(request)
        items = []
        while True:
            page = self.send("query", **request)
            items.extend(page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return items
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
