"""What a Lambda SnapStart restore requires of the code. SnapStart starts many execution
environments from one memory image taken after init; here ``os.fork()`` after init stands
in for that (both children start from one copied memory image). What the simulation does
not copy is the kernel's entropy pool: each forked child reads fresh bytes from
``os.urandom``, as Lambda promises each restored environment does; so write ids (whose
nonce comes from ``secrets``) would differ even without the hook, and the control below
shows what does repeat without it: the in-memory retry-jitter generator."""

from __future__ import annotations

import json
import os
import sys

import pytest

from functions.device_state import DeviceStateManager, restore
from functions.device_state.client import dynamodb_client
from functions.device_state.item.journal import WriteId

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

DRAWS = 8


def draws_in_forked_copy(manager: DeviceStateManager, run_hook: bool) -> dict:
    """Fork (a copy of this initialised process), run the after-restore hook or not, and
    report the jitter and write ids the copy draws."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the copy: report and leave at once, running no pytest teardown
        try:
            os.close(read)
            if run_hook:
                restore.after_restore()
            result = {"jitter": [manager._runtime.backoff.delay(6, manager._runtime.rng) for _ in range(DRAWS)],
                      "write_ids": [WriteId.new(1_800_000_000.0).attribute for _ in range(DRAWS)]}
            os.write(write, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        payload = pipe.read()
    os.waitpid(child, 0)
    return json.loads(payload)


@pytest.fixture
def initialised_manager():
    """A manager made during init, as a SnapStart snapshot would hold it."""
    return DeviceStateManager(dynamodb_client("http://127.0.0.1:9", "us-east-1"), "devices")


def test_two_restores_of_one_snapshot_draw_different_jitter_and_write_ids(initialised_manager):
    first = draws_in_forked_copy(initialised_manager, run_hook=True)
    second = draws_in_forked_copy(initialised_manager, run_hook=True)
    assert not set(first["jitter"]) & set(second["jitter"])
    assert not set(first["write_ids"]) & set(second["write_ids"])


def test_control_without_the_hook_two_copies_draw_the_same_jitter(initialised_manager):
    first = draws_in_forked_copy(initialised_manager, run_hook=False)
    second = draws_in_forked_copy(initialised_manager, run_hook=False)
    assert first["jitter"] == second["jitter"]  # what the hook exists to prevent


def test_a_restore_creates_the_cached_clients_and_the_api_manager_afresh(monkeypatch):
    monkeypatch.setenv("TABLE_NAME", "devices")
    from functions.api import common
    from functions.config import api_config as load_config

    load_config.cache_clear()
    common.manager.cache_clear()
    try:
        before_client, before_manager = dynamodb_client(None, "us-east-1"), common.manager()
        restore.after_restore()
        assert dynamodb_client(None, "us-east-1") is not before_client
        after_manager = common.manager()
        assert after_manager is not before_manager and after_manager.client is not before_manager.client
    finally:
        load_config.cache_clear()
        common.manager.cache_clear()


def test_the_hook_is_registered_with_the_lambda_runtime_when_it_has_one(monkeypatch):
    registered = []
    fake = type(sys)("snapshot_restore_py")
    fake.register_after_restore = registered.append
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", fake)
    assert restore.register_with_lambda() and registered == [restore.after_restore]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", None)  # outside Lambda: no such module
    assert restore.register_with_lambda() is False
