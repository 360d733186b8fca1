"""A device's connections as its state item records them (``model.connectivity``): opened,
closed and seen, each one request built by the planner's bookkeeping (no version) and sent
through the pipeline."""

from __future__ import annotations

import logging
from typing import Callable

from ..errors import ConditionFailed, CredentialRevoked, DeviceNotFound, TooManyConnections
from ..item import schema
from ..item.credentials import Holder
from ..model import connectivity
from ..model.device import Device
from ..model.values import validate_device_id
from .pipeline import WritePipeline
from .plan import Planned
from .planner import Planner

logger = logging.getLogger("device_state")

DISCONNECT_ATTEMPTS = 8  # reads and conditional writes while other connections of the device change


class Connections:
    def __init__(self, pipeline: WritePipeline, clock: Callable[[], float]):
        self._pipeline = pipeline
        self._clock = clock

    def connected(self, device_id: str, connection_id: str, until: float, holder: Holder | None = None,
                  closed: Callable[[list[str]], set[str]] | None = None) -> bool:
        """Records a WebSocket connection of the device's own credentials (``holder``: the
        credential it comes with, which the device must still hold), open until ``until`` at the
        latest (one write, no read); False when there is no such device. ``TooManyConnections``
        when it has ``MAX_CONNECTIONS`` open, counting after the connections whose close never
        arrived are forgotten: those past their end, else those ``closed`` (given the held
        connections' ids) says are closed; ``CredentialRevoked`` when the credential is not the
        device's."""
        validate_device_id(device_id)
        opened = connectivity.member(connection_id, until)
        try:
            before = self._send_connectivity(device_id, lambda planner: planner.connect(device_id, opened), holder)
        except TooManyConnections as full:
            ended = connectivity.ended_members(list(full.held), self._clock())
            if not ended and closed is not None:
                gone = closed(sorted({connectivity.connection_of(entry) for entry in full.held}))
                ended = [entry for entry in full.held if connectivity.connection_of(entry) in gone]
            if not ended:
                raise
            held = list(full.held)
            if set(ended) == set(held):  # every one it held ended: it was disconnected (a new since)
                self._send_connectivity(device_id, lambda planner: planner.all_disconnected(device_id, held))
            else:
                self._send_connectivity(device_id, lambda planner: planner.disconnect(device_id, ended))
            before = self._send_connectivity(device_id, lambda planner: planner.connect(device_id, opened), holder)
        if before is None:
            return False
        held_before = connectivity.members(before)  # a since goes only with the last of them
        if held_before and not connectivity.open_members(before, self._clock()):
            self._reconnected(device_id, opened, holder, held_before)
        return True

    def _reconnected(self, device_id: str, opened: str, holder: Holder | None, ended: list[str]) -> None:
        """The connect found the device connected only by connections that all ended without
        their close: it was disconnected, so it is recorded so (those members and its since go,
        the stream sees device.disconnected) and connected anew (a since of now, device.connected).
        Two writes more, only then; a connect or close of another connection in between leaves
        it as it is."""
        held = sorted({*ended, opened})
        if self._send_connectivity(device_id, lambda planner: planner.all_disconnected(device_id, held)) is not None:
            self._send_connectivity(device_id, lambda planner: planner.connect(device_id, opened), holder)

    def disconnected(self, device_id: str, connection_id: str, until: float) -> None:
        """Forgets a connection ``connected`` recorded: one read and one write, each write
        conditioned on the connections read, so that the last one open, whoever closes it
        and whenever, leaves the device disconnected and takes with it those whose close
        never came."""
        validate_device_id(device_id)
        closing = connectivity.member(connection_id, until)
        for _ in range(DISCONNECT_ATTEMPTS):
            item = self._pipeline.store.get_live_state(device_id, self._clock())
            if item is None:
                return
            held = connectivity.members(item)
            if closing not in held and schema.CONNECTED_SINCE not in item:
                return  # forgotten already (a resend, or a connect that was never recorded)
            others = [entry for entry in connectivity.open_members(item, self._clock()) if entry != closing]
            if others:
                sent = self._send_connectivity(device_id, lambda planner: planner.disconnect(device_id, [closing], held))
            else:
                sent = self._send_connectivity(device_id, lambda planner: planner.all_disconnected(device_id, held))
            if sent is not None:
                return
        logger.warning("disconnect not recorded: the connections kept changing", extra={"device_id": device_id})

    def saw(self, device: Device) -> None:
        """After the device's own read of itself (``device``, read with its connectivity):
        seen now, unless it was within ``connectivity.SEEN_EVERY_SECONDS``."""
        if device.presence is not None and connectivity.seen_recently(device.presence, self._clock()):
            return
        self._send_connectivity(device.device_id, lambda planner: planner.seen(device.device_id))

    def _send_connectivity(self, device_id: str, plan: Callable[[Planner], Planned],
                           holder: Holder | None = None) -> dict | None:
        """One connectivity change: what DynamoDB returned of the item (``{}``: nothing asked);
        None when the device is not there, or the change's condition says it is not needed (seen
        recently, a connect meanwhile).
        ``CredentialRevoked`` for a ``holder`` that no device of that id admits now: its
        credential went with the device it was registered on."""
        planner = self._pipeline.planner(seen_by=device_id, holder=holder)
        planned = plan(planner)
        try:
            applied = self._pipeline.send(planner, planned)
        except DeviceNotFound:
            if holder is not None and not holder.admits(None, self._clock()):
                raise CredentialRevoked(device_id) from None
            return None
        except ConditionFailed:  # not needed (a TooManyConnections goes to the caller)
            return None
        return applied.item or {}
