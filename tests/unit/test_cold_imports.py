"""What a cold start imports: modules the common request never uses stay out until used."""

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import sys
import functions.api.handler
UNUSED = ("jsonpatch", "difflib", "aws_xray_sdk", "asyncio", "aws_lambda_powertools.event_handler.appsync",
          "aws_lambda_powertools.utilities.data_classes.sqs_event")
# What only a listing, a fleet query, a reindex, a lease or a job request uses.
UNTIL_USED = ("functions.device_state.fleet.query", "functions.device_state.fleet.rql",
              "functions.device_state.fleet.listing", "functions.device_state.fleet.reindex",
              "functions.device_state.leases.queue", "functions.device_state.leases.handle",
              "functions.device_state.jobs.runner", "functions.device_state.jobs.service",
              "functions.device_state.jobs.store", "functions.device_state.jobs.tracker")
print(sorted(name for name in UNUSED + UNTIL_USED if name in sys.modules))
from functions.device_state import JsonPatch
print(JsonPatch([{"op": "increment", "path": "/n", "value": 2}, {"op": "test", "path": "/n", "value": 3}])({"n": 1}))
print("jsonpatch" in sys.modules)
from aws_lambda_powertools.utilities.data_classes import SQSEvent
from aws_lambda_powertools.event_handler import AppSyncResolver
print(SQSEvent.__module__, AppSyncResolver.__module__)
from functions.device_state import Lease, LeaseGrant, leases
from functions.device_state.fleet import rql
print(Lease.__module__, LeaseGrant.__module__, leases.parse_lease_id.__module__, rql.MAX_FILTER_CHARS)
from functions.device_state.jobs import JobRunner, JobTracker
print(JobRunner.__module__, JobTracker.__module__)
"""


def test_handler_import_leaves_unused_modules_until_used():
    env = dict(os.environ, POWERTOOLS_TRACE_DISABLED="true", PYTHONPATH=str(REPO_ROOT))
    lines = subprocess.run([sys.executable, "-c", _PROBE], env=env, cwd=REPO_ROOT, check=True,
                           capture_output=True, text=True).stdout.splitlines()
    assert lines[0] == "[]"
    assert lines[1] == "{'n': Decimal('3')}"
    assert lines[2] == "True"
    assert lines[3] == ("aws_lambda_powertools.utilities.data_classes.sqs_event "
                        "aws_lambda_powertools.event_handler.appsync")
    assert lines[4] == ("functions.device_state.leases.handle functions.device_state.leases.queue "
                        "functions.device_state.leases.queue 4096")
    assert lines[5] == "functions.device_state.jobs.runner functions.device_state.jobs.tracker"


_COLLECTIONS = """
import gc
{before}
collections = []
gc.callbacks.append(lambda phase, info: phase == "stop" and collections.append(info["generation"]))
import functions.api.handler
print(len(collections), gc.isenabled(), gc.get_freeze_count() > 10000)
"""


def run_probe(code: str) -> str:
    env = dict(os.environ, POWERTOOLS_TRACE_DISABLED="true", PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_the_handler_imports_without_garbage_collections_and_freezes_what_it_imported():
    collections, enabled, frozen = run_probe(_COLLECTIONS.format(before="")).split()
    assert int(collections) <= 1  # one may run before functions.cold_start is reached (with it on: ~100)
    assert (enabled, frozen) == ("True", "True")


def test_a_process_that_had_the_collector_off_keeps_it_off():
    assert run_probe(_COLLECTIONS.format(before="gc.disable()")) == "0 False True"
