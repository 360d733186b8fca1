"""How the store's door and the write pipeline classify a failed write (no engine): a
lost answer is settled and tried again; a server error DynamoDB answered, once settled
as never applied, is answered at once (issue 27, row 5)."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from functions.device_state import table
from functions.device_state.errors import StorageUnavailable
from functions.device_state.item.fencing import Fence
from functions.device_state.runtime import NULL_OBSERVER
from functions.device_state.write.outcomes import Moved, Refusals
from functions.device_state.write.pipeline import WritePipeline
from functions.device_state.write.planner import Planner
from functions.device_state.runtime import Runtime
from functions.device_state import AnswerLost
from functions.device_state.write.store import IDEMPOTENT, FailedAnswer, Store

NOW = 1_800_000_000.0
ITEM = {**table.state_key("d"), "version": {"N": "3"}, "state": {"M": {}},
        "createdAt": {"S": "2026-01-01T00:00:00.000Z"}, "updatedAt": {"S": "2026-01-01T00:00:00.000Z"}}


class FailingClient:
    """Fails the first UpdateItem with ``failure``; answers the settle mark as landed."""

    def __init__(self, failure: Exception):
        self.failure, self.calls = failure, []

    def update_item(self, **request):
        self.calls.append(request)
        if len(self.calls) == 1:
            raise self.failure
        write, = (name for name in request["ExpressionAttributeNames"].values()
                  if name.startswith(table.JOURNAL_PREFIX))
        return {"Attributes": {**ITEM, write: {"N": "0"}}}


def internal_failure() -> ClientError:
    return ClientError({"Error": {"Code": "InternalFailure", "Message": "unknown error"},
                        "ResponseMetadata": {"HTTPStatusCode": 500}}, "UpdateItem")


def pipeline_on(client) -> WritePipeline:
    runtime = Runtime(clock=lambda: NOW, sleep=lambda _: None)
    return WritePipeline(Store(client, "devices", runtime), runtime)


def send(client) -> None:
    planner = Planner("devices", Fence(), NOW)
    planned = planner.replace_state(ITEM, lambda state: {"n": 1}, None, "updated")
    pipeline = pipeline_on(client)
    pipeline.send(planner, planned)


def test_a_server_error_settled_as_never_applied_is_storage_unavailable_at_once():
    client = FailingClient(internal_failure())
    with pytest.raises(StorageUnavailable) as failed:
        send(client)
    assert not isinstance(failed.value, Moved) and "nothing was written" in str(failed.value)
    assert len(client.calls) == 2  # the write, then the settle mark: no second attempt


def test_a_lost_answer_settled_as_never_applied_is_tried_again():
    client = FailingClient(ReadTimeoutError(endpoint_url="http://dynamodb"))
    with pytest.raises(Moved) as moved:
        send(client)
    assert moved.value.reason == "settled" and len(client.calls) == 2


@pytest.mark.parametrize("lost, outcome", [(FailedAnswer("InternalFailure"), StorageUnavailable),
                                           (AnswerLost("read timeout"), Moved)])
def test_settle_classifies_by_the_lost_answer_it_is_given_as_transactions_call_it(lost, outcome):
    client = FailingClient(AssertionError("not sent"))
    client.calls.append({})  # the write itself went elsewhere (a transaction); only the mark is sent here
    planner = Planner("devices", Fence(), NOW)
    planned = planner.replace_state(ITEM, lambda state: {"n": 1}, None, "updated")
    with pytest.raises(outcome):
        pipeline_on(client).settle(planned, lost)


class CancellingClient:
    """Cancels every TransactWriteItems with ``reasons``."""

    def __init__(self, reasons: list[dict]):
        self.reasons = reasons

    def transact_write_items(self, **request):
        raise ClientError({"Error": {"Code": "TransactionCanceledException", "Message": "cancelled"},
                           "CancellationReasons": self.reasons, "ResponseMetadata": {"HTTPStatusCode": 400}},
                          "TransactWriteItems")


@pytest.mark.parametrize("reasons", [[{"Code": "None"}, {"Code": "ThrottlingError"}], [], [{"Code": "None"}]])
def test_a_transaction_cancelled_for_throughput_or_for_no_named_reason_wrote_nothing_and_may_be_tried_later(reasons):
    planner = Planner("devices", Fence(), NOW)
    planned = planner.replace_state(ITEM, lambda state: {"n": 1}, None, "updated")
    with pytest.raises(StorageUnavailable) as unavailable:
        pipeline_on(CancellingClient(reasons)).send_together(planner, [planned], {"row": [{"Put": {}}]}, "token")
    assert "nothing was written" in str(unavailable.value)


def test_a_refused_condition_in_a_transaction_is_classified_per_item():
    planner = Planner("devices", Fence(), NOW)
    planned = planner.replace_state(ITEM, lambda state: {"n": 1}, None, "updated")
    moved = {**ITEM, "version": {"N": "4"}}
    with pytest.raises(Refusals) as refused:
        pipeline_on(CancellingClient([{"Code": "ConditionalCheckFailed", "Item": moved}, {"Code": "None"}])
                    ).send_together(planner, [planned], {"row": [{"Put": {}}]}, "token")
    assert isinstance(refused.value.refusal, Moved) and refused.value.refused == frozenset()
    assert not refused.value.conflict


def test_the_store_asks_each_billed_request_for_its_capacity_and_reports_it():
    class Answering:
        def __init__(self):
            self.requests = []

        def update_item(self, **request):
            self.requests.append(request)
            return {"ConsumedCapacity": {"TableName": "devices", "CapacityUnits": 2.0}}

        def transact_write_items(self, **request):
            self.requests.append(request)
            return {"ConsumedCapacity": [{"TableName": "devices", "CapacityUnits": 4.0}]}

        def get_item(self, **request):
            self.requests.append(request)
            return {"Item": ITEM, "ConsumedCapacity": {"TableName": "devices", "CapacityUnits": 1.0}}

    class Billing(NULL_OBSERVER.__class__):
        def __init__(self):
            self.seen = []

        def consumed(self, operation, read_units, write_units):
            self.seen.append((operation, read_units, write_units))

    client, billing = Answering(), Billing()
    store = Store(client, "devices", Runtime(observer=billing))
    store.send("update_item", Key={})
    store.send("transact_write_items", TransactItems=[])
    store.get_state("d")
    assert all(request["ReturnConsumedCapacity"] == "TOTAL" for request in client.requests)
    assert billing.seen == [("update_item", 0.0, 2.0), ("transact_write_items", 0.0, 4.0), ("get_item", 1.0, 0.0)]


class ThrottledOnce(CancellingClient):
    """Cancels the first TransactWriteItems for throughput alone, then applies it."""

    def __init__(self):
        super().__init__([{"Code": "None"}, {"Code": "ThrottlingError"}])
        self.sends = 0

    def transact_write_items(self, **request):
        self.sends += 1
        if self.sends == 1:
            super().transact_write_items(**request)
        return {}


def test_a_transaction_cancelled_for_throughput_alone_is_sent_again_as_a_throttled_request_is():
    planner = Planner("devices", Fence(), NOW)
    planned = planner.replace_state(ITEM, lambda state: {"n": 1}, None, "updated")
    client = ThrottledOnce()
    pipeline_on(client).send_together(planner, [planned], {"row": [{"Put": {}}]}, "token")
    assert client.sends == 2


def test_a_request_botocore_refuses_to_send_is_refused_not_a_lost_answer():
    """botocore checks a request's parameters before sending it: nothing can have been written, so
    it is no AnswerLost (which a caller settles or answers 504) and no second copy is sent."""
    from botocore.exceptions import ParamValidationError

    from functions.device_state import RequestRefused

    class Refusing:
        calls = 0

        def put_item(self, **request):
            Refusing.calls += 1
            raise ParamValidationError(report="Invalid type for parameter Item.owner.S")

    store = Store(Refusing(), "devices", Runtime(clock=lambda: NOW, sleep=lambda _: None))
    with pytest.raises(RequestRefused, match="not sent"):
        store.send("put_item", IDEMPOTENT, Item={})
    assert Refusing.calls == 1
