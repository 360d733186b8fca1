"""What both push functions (the WebSocket routes and the fan-out) work with: the
subscriptions and the delivery over them, made once per process."""

from __future__ import annotations

import functools

from functions.config import fleet_index, push_config
from functions.device_state import ChangeLog, DeviceStateManager, dynamodb_client

from . import connections
from .delivery import Delivery
from .subscriptions import Subscriptions


@functools.lru_cache(maxsize=1)
def services() -> tuple[Subscriptions, Delivery]:
    config = push_config()
    client = dynamodb_client(config.dynamodb_endpoint)
    subscriptions = Subscriptions(client, config.table_name)
    log = ChangeLog(client, config.table_name, retention_seconds=config.change_retention_seconds)
    return subscriptions, Delivery(subscriptions, log, connections.post)


@functools.lru_cache(maxsize=1)
def devices() -> DeviceStateManager:
    """What records the connectivity of devices that connect with their own credentials."""
    config = push_config()
    return DeviceStateManager(dynamodb_client(config.dynamodb_endpoint), config.table_name,
                              fleet_index=fleet_index())
