"""The fault harness's own promises (``localdev/dynamodb_local.py``, ``localdev/faults.py``), on
DynamoDB Local: ``pause()`` returns only once every thread of the engine is stopped, so nothing
sent after it is served before ``resume()``; beside it, a plain SIGSTOP returns while some of the
JVM's threads still run (the kernel stops each as it is next scheduled), the window in which a
stall test once saw its write answered at once. A hook with ``when`` is taken only by a request
whose body matches, never by another writer's request that arrives first."""

from __future__ import annotations

import os
import signal
import time

import pytest
from botocore.config import Config
from botocore.exceptions import ReadTimeoutError

from functions.device_state import table
from functions.device_state.client import new_client
from localdev.faults import Forwarder

pytestmark = pytest.mark.dynamodb_local


def client_to(endpoint: str, read_timeout: float = 5.0):
    return new_client("dynamodb", endpoint_url=endpoint, region_name="us-east-1",
                      config=Config(read_timeout=read_timeout, connect_timeout=2, retries={"max_attempts": 1}))


def test_pause_returns_once_every_thread_is_stopped_and_nothing_is_served_until_resume(dynamodb_local):
    client = client_to(dynamodb_local.endpoint, read_timeout=0.5)
    client.list_tables()
    for _ in range(20):
        dynamodb_local.pause()
        try:
            assert dynamodb_local.stopped()
        finally:
            dynamodb_local.resume()
        time.sleep(0.01)
    dynamodb_local.pause()
    try:
        with pytest.raises(ReadTimeoutError):
            client.list_tables()
    finally:
        dynamodb_local.resume()
    assert "TableNames" in client.list_tables()


def test_control_a_plain_sigstop_returns_while_some_threads_of_the_engine_still_run(dynamodb_local):
    still_running = 0
    for _ in range(50):
        os.kill(dynamodb_local.pid, signal.SIGSTOP)
        try:
            still_running += not dynamodb_local.stopped()
        finally:
            os.kill(dynamodb_local.pid, signal.SIGCONT)
        time.sleep(0.01)
    assert still_running > 0  # measured: 72 of 300 on an idle machine, 260 of 300 beside three busy processes


def test_a_hook_with_when_is_taken_only_by_a_request_whose_body_matches(dynamodb_local, local_table):
    _, name = local_table
    forwarder = Forwarder(dynamodb_local.port)
    try:
        through = client_to(forwarder.endpoint)
        ran = []
        forwarder.before("PutItem", lambda: ran.append("hooked"), when=lambda body: b'"mine"' in body)

        def put(device: str) -> None:
            through.put_item(TableName=name, Item={table.PARTITION_KEY: {"S": device}, table.SORT_KEY: {"S": "x"}})
        put("another")
        assert ran == [] and len(forwarder.hooks) == 1
        put("mine")
        assert ran == ["hooked"] and forwarder.hooks == []
    finally:
        forwarder.close()
