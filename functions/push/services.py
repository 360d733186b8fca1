"""What both push functions (the WebSocket routes and the fan-out) work with: the
subscriptions and the delivery over them, made once per process, and forgetting a connection."""

from __future__ import annotations

import functools
import logging

from functions.auth.principals import device_of
from functions.config import fleet_index, push_config
from functions.device_state import ChangeLog, DeviceStateError, DeviceStateManager, StorageUnavailable, dynamodb_client

from . import connections
from .delivery import Delivery
from .subscriptions import Subscriptions

logger = logging.getLogger("device_state.push")


@functools.lru_cache(maxsize=1)
def services() -> tuple[Subscriptions, Delivery]:
    config = push_config()
    client = dynamodb_client(config.dynamodb_endpoint)
    subscriptions = Subscriptions(client, config.table_name)
    log = ChangeLog(client, config.table_name, retention_seconds=config.change_retention_seconds)
    return subscriptions, Delivery(subscriptions, log, connections.post, functools.partial(forget, subscriptions))


@functools.lru_cache(maxsize=1)
def devices() -> DeviceStateManager:
    """What records the connectivity of devices that connect with their own credentials."""
    config = push_config()
    return DeviceStateManager(dynamodb_client(config.dynamodb_endpoint), config.table_name,
                              fleet_index=fleet_index())


def forget(subscriptions: Subscriptions, connection_id: str) -> None:
    """Forgets the connection; a device's own connection also leaves its connectivity. What storage
    does not take is logged: the connection's items expire, and its member ends when it was to."""
    try:
        closed = subscriptions.close(connection_id)
    except StorageUnavailable as error:
        logger.warning("connection not forgotten", extra={"reason": str(error)})
        return
    device_id = device_of(closed[0]) if closed is not None else None
    if device_id is None:
        return
    try:
        devices().disconnected(device_id, connection_id, closed[1])
    except DeviceStateError as error:
        logger.warning("connectivity not recorded", extra={"reason": str(error)})
