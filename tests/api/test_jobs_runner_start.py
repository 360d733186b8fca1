"""Where a job runner is deployed (``JOB_RUNNER_FUNCTION``), ``POST /jobs`` starts its run at once
with an Event invoke of Lambda: one attempt, held to a DynamoDB send's timeouts. A Lambda endpoint
that never answers delays the answer by ``LONGEST_SEND_SECONDS`` at most, and the job is created
all the same (the schedule starts its run within a minute). The control: the same invoke on
boto3's default client (60 s to read, retried), as the route sent it before, is still waiting
then; deployed, API Gateway would have answered 503 for a job that exists."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

import boto3
import pytest

from functions.config import JOB_RUNNER_FUNCTION, api_config
from functions.device_state import LONGEST_SEND_SECONDS

pytestmark = pytest.mark.dynamodb_local


@pytest.fixture
def engine(local_table):  # DynamoDB Local only: the test waits on a silent endpoint, on either engine alike
    return local_table


@contextlib.contextmanager
def silent_endpoint():
    """An HTTP endpoint that takes each connection and never answers: (its URL, the connections)."""
    listener, connections = socket.create_server(("127.0.0.1", 0)), []

    def accept():
        while True:
            try:
                connections.append(listener.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", connections
    finally:
        listener.close()
        for connection in connections:
            connection.close()


def test_a_job_is_created_in_time_though_the_runners_lambda_never_answers(api, monkeypatch, caplog):
    with silent_endpoint() as (url, connections):
        control_done = threading.Event()

        def control():  # what _start_runner sent before: boto3's default client
            try:
                boto3.session.Session(aws_access_key_id="x", aws_secret_access_key="x").client(
                    "lambda", endpoint_url=url, region_name="us-east-1").invoke(
                    FunctionName="runner", InvocationType="Event", Payload=b"{}")
            except Exception:  # noqa: BLE001 - the listener closes under it at the end
                pass
            finally:
                control_done.set()
        threading.Thread(target=control, daemon=True).start()

        monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", url)
        monkeypatch.setenv(JOB_RUNNER_FUNCTION, "device-state-job-runner")
        api_config.cache_clear()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="device_state.api"):
            created = api("POST", "/jobs", {"deviceIds": ["lamp-1"], "desired": {"level": 1}})
        took = time.monotonic() - started
        runner_attempts = len(connections) - 1  # the control's is the other
        control_waits = not control_done.wait(max(0.0, LONGEST_SEND_SECONDS + 1 - took))
    assert created.status == 201, created.text
    assert took < LONGEST_SEND_SECONDS + 1, took
    assert runner_attempts == 1
    assert "job runner not started" in caplog.text
    assert api("GET", f"/jobs/{created.json['jobId']}").status == 200
    assert control_waits, "boto3's default client gave up as soon: the control shows nothing"
