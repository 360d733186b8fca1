"""No test reuses a connection to DynamoDB Local that an earlier test left idle in the shared
client's pool (conftest's ``no_connection_left_idle``): DynamoDB Local closes a connection idle
for 30 s, and a request sent on one at that instant loses its answer. The two tests run in this
order in one worker (``--dist loadfile``): the first leaves connections in the pool, the second
sees its first request open a new one."""
from __future__ import annotations

import gc
import os
import threading

import pytest

pytestmark = pytest.mark.dynamodb_local

ESTABLISHED = "01"  # the state column of /proc/net/tcp


def connections_to(port: int) -> set[str]:
    """This process's established TCP connections to ``port`` on 127.0.0.1, by socket inode."""
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since listed
            continue
        if target.startswith("socket:["):
            sockets.add(target[len("socket:["):-1])
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return {row[9] for row in rows
            if int(row[2].split(":")[1], 16) == port and row[3] == ESTABLISHED and row[9] in sockets}


def test_a_test_leaves_its_connections_in_the_pool(dynamodb_local, local_table):
    client, _ = local_table
    threads = [threading.Thread(target=client.list_tables) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert connections_to(dynamodb_local.port)


def test_the_next_test_opens_a_new_one(dynamodb_local, local_table):
    client, _ = local_table
    gc.disable()  # a client an earlier test dropped keeps its socket until collected: keep the inodes apart
    try:
        before = connections_to(dynamodb_local.port)
        client.list_tables()
        assert connections_to(dynamodb_local.port) - before, "the request reused a connection left idle"
    finally:
        gc.enable()
