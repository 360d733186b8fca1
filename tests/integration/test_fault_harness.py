"""The fault harness's own promises (``localdev/dynamodb_local.py``, ``localdev/faults.py``), on
DynamoDB Local: ``pause()`` returns only once the stop has taken hold, so a request sent after it
is never served before ``resume()``. Beside it, the control: right after a plain SIGSTOP the stop
has often not taken hold (``kill`` only wakes the thread that begins it; until that thread gets a
CPU, the JVM's others go on serving), the window in which a stall test once saw its write
answered at once. A hook with ``when`` is taken only by a request whose body matches."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from botocore.config import Config
from botocore.exceptions import ReadTimeoutError

from functions.device_state import table
from functions.device_state.client import new_client
from localdev.faults import Forwarder

pytestmark = [pytest.mark.dynamodb_local,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pause() watches Linux's procfs")]


def client_to(endpoint: str, read_timeout: float = 30.0):
    return new_client("dynamodb", endpoint_url=endpoint, region_name="us-east-1",
                      config=Config(read_timeout=read_timeout, connect_timeout=2, retries={"max_attempts": 1}))


def test_pause_returns_once_the_stop_holds_and_nothing_sent_after_it_is_served_until_resume(dynamodb_local):
    impatient, patient = client_to(dynamodb_local.endpoint, read_timeout=0.3), client_to(dynamodb_local.endpoint)
    patient.list_tables()
    for _ in range(10):
        dynamodb_local.pause()
        try:
            assert dynamodb_local.stopped()
            with pytest.raises(ReadTimeoutError):
                impatient.list_tables()  # sent at once: a plain SIGSTOP's window would serve it
        finally:
            dynamodb_local.resume()
        assert "TableNames" in patient.list_tables()


def test_control_right_after_a_plain_sigstop_the_stop_has_often_not_taken_hold(dynamodb_local):
    not_yet = 0
    for _ in range(100):
        os.kill(dynamodb_local.pid, signal.SIGSTOP)
        try:
            not_yet += not dynamodb_local.stopped()
        finally:
            os.kill(dynamodb_local.pid, signal.SIGCONT)
        time.sleep(0.01)
    # A property of the scheduler the harness must not rely on (measured with every thread's
    # state: 72 of 300 on an idle machine, 260 of 300 beside three busy processes).
    assert not_yet > 0


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
