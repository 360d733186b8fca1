"""A job's desired write to one device (jobs/device_write.py) lands at most once, whatever is
lost or sent again, on DynamoDB Local behind the fault forwarder: its answer lost (alone and with
another writer between), a second copy from another runner, a device another writer moves
meanwhile. The device's job marker makes a repeat a refusal that names the version written; a
naive writer (a plain UpdateItem that botocore sends again) writes twice in the same harness."""

from __future__ import annotations

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import EndpointConnectionError

from functions.device_state import DeviceStateManager, MergePatch, table
from functions.device_state.client import dynamodb_client
from functions.device_state.item import job_marks
from functions.device_state.jobs.device_write import JobWrites
from functions.device_state.jobs.spec import FAILED, REMOVED, parse
from functions.device_state.runtime import Runtime
from functions.device_state.write.pipeline import WritePipeline
from functions.device_state.write.store import Store
from localdev.faults import Forwarder

pytestmark = pytest.mark.dynamodb_local

BETWEEN = pytest.mark.parametrize("between", [False, True], ids=["alone", "another-writer-between"])


class Rig:
    def __init__(self, dynamodb_local, client, name):
        self.forwarder = Forwarder(dynamodb_local.port)
        self.client, self.name = client, name
        runtime = Runtime()
        self.pipeline = WritePipeline(Store(dynamodb_client(self.forwarder.endpoint, "us-east-1"), name, runtime),
                                      runtime, settle_seconds=2)
        self.other = DeviceStateManager(client, name)  # straight to DynamoDB

    def writes(self, **body) -> JobWrites:
        body = {"jobId": "j1", "deviceIds": ["d"], "desired": {"mode": "eco"}, **body}
        return JobWrites(self.pipeline, parse(body, self.pipeline.runtime.clock()))

    def item(self, device_id="d"):
        return self.client.get_item(TableName=self.name, Key=table.state_key(device_id), ConsistentRead=True)["Item"]

    def other_desires(self, device_id="d"):
        return lambda: self.other.update_with_retry(device_id, MergePatch({"other": 1}), section="desired")


@pytest.fixture
def rig(dynamodb_local, local_table):
    rig = Rig(dynamodb_local, *local_table)
    yield rig
    rig.forwarder.close()


@BETWEEN
@pytest.mark.parametrize("options", [{}, {"expiresIn": 600}], ids=["read-free", "read-modify-write"])
def test_a_job_write_whose_answer_is_lost_lands_once_and_a_second_copy_names_its_version(rig, between, options):
    rig.other.create("d", {"n": 0})
    rig.forwarder.lose("UpdateItem", then=rig.other_desires() if between else None)
    writes = rig.writes(**options)
    outcome = writes.write("d")
    assert rig.forwarder.lost == ["UpdateItem"] and outcome.version == 2 and outcome.final is None
    assert job_marks.mark_of(rig.item(), "j1")[0] == 2
    again = rig.writes(**options).write("d")  # another runner, or this one restarted
    assert again.version == 2
    device = rig.other.get("d")
    assert device.version == 2 + between and device.desired == ({"mode": "eco", "other": 1} if between
                                                               else {"mode": "eco"})


def test_a_second_copy_does_not_undo_a_later_writer_of_the_jobs_leaf(rig):
    rig.other.create("d", {"n": 0})
    assert rig.writes().write("d").version == 2
    rig.other.update_with_retry("d", MergePatch({"mode": "manual"}), section="desired")
    assert rig.writes().write("d").version == 2
    assert rig.other.get("d").desired == {"mode": "manual"} and rig.other.get("d").version == 3


def test_a_device_without_the_map_is_written_by_read_modify_write_and_then_read_free(rig):
    rig.other.create("d", {"n": 0})
    rig.client.update_item(TableName=rig.name, Key=table.state_key("d"), UpdateExpression="REMOVE #j",
                           ExpressionAttributeNames={"#j": table.JOB_MARKS})  # as a device written before jobs
    assert rig.writes().write("d").version == 2
    assert rig.writes(jobId="j2").write("d").version == 3
    assert set(job_marks.marks(rig.item())) == {"j1", "j2"}


def test_a_missing_device_is_removed_and_a_device_in_too_many_jobs_fails(rig):
    assert rig.writes().write("nobody").final.state == REMOVED
    rig.other.create("d", {"n": 0})
    for number in range(job_marks.MAX_JOB_MARKS):
        assert rig.writes(jobId=f"j{number}").write("d").version == number + 2
    refused = rig.writes(jobId="one-more").write("d")
    assert refused.final.state == FAILED and refused.final.code == 409 and "too-many-jobs" in refused.final.reason


def test_control_a_naive_desired_write_that_botocore_sends_again_lands_twice(rig):
    rig.other.create("d", {"n": 0})
    naive = boto3.session.Session().client("dynamodb", endpoint_url=rig.forwarder.endpoint, region_name="us-east-1",
                                           config=Config(retries={"mode": "standard", "max_attempts": 3},
                                                         read_timeout=3))
    rig.forwarder.lose("UpdateItem", then=lambda: rig.other.update_with_retry(
        "d", MergePatch({"mode": "manual"}), section="desired"))
    naive.update_item(TableName=rig.name, Key=table.state_key("d"),
                      UpdateExpression="SET #d.#m = :v, #version = #version + :one",
                      ExpressionAttributeNames={"#d": table.DESIRED, "#m": "mode", "#version": table.VERSION},
                      ExpressionAttributeValues={":v": {"S": "eco"}, ":one": {"N": "1"}})
    device = rig.other.get("d")
    assert device.version == 4 and device.desired["mode"] == "eco"  # twice, and the later writer undone


class ReadsFailAfterAWrite:
    """A client whose reads find storage gone once a transaction went through: between a job
    write that applied and the read of the head its answer shows."""

    def __init__(self, client):
        self._client, self.wrote = client, False

    def __getattr__(self, name):
        attribute = getattr(self._client, name)
        if name == "transact_write_items":
            def write(**request):
                answer = attribute(**request)
                self.wrote = True
                return answer
            return write
        if name in ("query", "get_item"):
            def read(**request):
                if self.wrote:
                    raise EndpointConnectionError(endpoint_url="http://storage.invalid")
                return attribute(**request)
            return read
        return attribute


def test_a_job_create_and_cancel_whose_head_cannot_be_read_after_they_applied_answer_applied(local_table):
    """Both applied, so neither may answer that storage was unavailable (a 503 says nothing was
    written): each answers the head as it wrote it."""
    client, name = local_table
    DeviceStateManager(client, name).create("lamp", {})
    failing = ReadsFailAfterAWrite(client)
    jobs, fresh = DeviceStateManager(failing, name).jobs(), DeviceStateManager(client, name).jobs()
    head, replayed = jobs.create({"jobId": "j1", "deviceIds": ["lamp"], "desired": {"mode": "eco"}})
    assert (head.record.spec.job_id, head.record.status, replayed) == ("j1", "IN_PROGRESS", False)
    assert head == fresh.head("j1")  # no runner here: the head as written is the head as read
    failing.wrote = False
    head, replayed = jobs.cancel("j1", force=True)
    assert (head.record.status, head.run.stop, head.run.force, replayed) == ("CANCELED", "cancel", True, False)
    assert head == fresh.head("j1")
