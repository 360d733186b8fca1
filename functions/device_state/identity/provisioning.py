"""A device provisions itself by claim (an enrollment's group key, ``enrollments``): in one
transaction the device is created with the enrollment's initial documents and its first
credential, the credential's item is stored, the enrollment counts it (while it is not full,
ended or expired) and the assertion's ``jti`` is spent. The create carries a journal entry, so a
lost answer settles: one device item and one credential, however often the answer is lost and
the request sent again. Provisioning a device the same enrollment provisioned before creates
nothing: the device gets a fresh token for the credential it holds.

The credential's id is derived from the enrollment, the device's id and the time the device is
created (``provisioned_credential_id``): provisioning again reads it off the item, and a device
deleted and provisioned again holds a credential of another id, which no token minted for the
one deleted names."""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass, replace
from typing import Callable

from ..errors import AssertionReplayed, DeviceAlreadyExists, ProvisioningRefused
from ..item import schema
from ..item.credentials import (NO_EXPIRY, ProvisionedIdentity, earlier_provisioned_credential_id, provisioned_by,
                                provisioned_credential_id, registered)
from ..model.device import Device
from ..model.sections import DESIRED, REPORTED
from ..model.times import stored_time, timestamp
from ..runtime import Runtime
from ..write.expressions import Expression
from ..write.outcomes import Moved, Refusals
from ..write.pipeline import WritePipeline
from ..write.retry import RetryLoop
from .assertions import ASSERTION, jti_put, use_once
from .credentials import CREDENTIAL, CredentialRecord
from .enrollments import Enrollment, enrollment_key, provisioned_counter

COUNTED = "counted"  # the enrollment's count, a part of the transaction (``send_together``)
ATTEMPTS, BUDGET_SECONDS = 8, 5.0


@dataclass(frozen=True)
class Provisioned:
    device: Device
    credential_id: str
    created: bool  # False: the enrollment had provisioned the device before


def check_claim(enrollment: Enrollment, device_id: str, now: float) -> None:
    """``ProvisioningRefused`` unless ``enrollment`` may provision ``device_id`` now."""
    if enrollment.deleted or enrollment.expired(now):
        raise ProvisioningRefused(device_id, "enrollment-ended", f"enrollment {enrollment.enrollment_id!r} has ended")
    if not enrollment.admits(device_id):
        raise ProvisioningRefused(device_id, "id-not-allowed",
                                  f"{device_id!r} does not match the enrollment's idPattern")


class Provisioning:
    def __init__(self, pipeline: WritePipeline, runtime: Runtime):
        self._pipeline = pipeline
        self._runtime = runtime

    def provision(self, device_id: str, enrollment: Enrollment, credential: Callable[[str], CredentialRecord],
                  jti: str, jti_until: int) -> Provisioned:
        """Provisions ``device_id`` by ``enrollment`` (read already, and its claim verified) with
        the credential ``credential(credential_id)`` makes for the id the device is created with
        (a secret sealed under it), spending ``jti`` (good until ``jti_until``).
        ``ProvisioningRefused`` with its reason; ``AssertionReplayed``."""
        store, now = self._pipeline.store, self._runtime.clock()
        check_claim(enrollment, device_id, now)
        made = functools.cache(credential)  # a secret sealed once for each id the tries derive
        request = uuid.uuid4().hex  # names this provisioning's jti record across its tries

        def attempt(item, _number):
            planner = self._pipeline.planner()
            if schema.is_live_state(item, planner.now):
                again = self._again(device_id, enrollment, item)
                use_once(store, device_id, jti, jti_until)
                return again
            created_at = timestamp(planner.now)
            if item and schema.CREATED_AT in item and stored_time(item[schema.CREATED_AT]) == created_at:
                raise Moved(None)  # the deleted device was created in this millisecond: its id would be the same
            credential_id = provisioned_credential_id(enrollment.enrollment_id, device_id, created_at)
            credential_made = made(credential_id)
            initial = enrollment.initial
            sections = {section: initial[section] for section in (DESIRED, REPORTED) if section in initial}
            planned = planner.create(device_id, initial.get("state", {}), item, sections,
                                     ProvisionedIdentity(enrollment.enrollment_id, credential_id,
                                                         credential_made.expires_at or NO_EXPIRY))
            record = replace(credential_made, credential_id=credential_id, enrollment=enrollment.enrollment_id,
                             created_at=planned.device.created_at)
            others = {CREDENTIAL: [{"Put": {"TableName": store.table_name, "Item": record.item(device_id)}}],
                      COUNTED: [provisioned_counter(Expression(), enrollment.enrollment_id, store.table_name,
                                                       planner.now)],
                      ASSERTION: [{"Put": jti_put(store.table_name, device_id, jti, jti_until, request)}]}
            try:
                self._pipeline.send_together(planner, [planned], others, uuid.uuid4().hex)
            except Refusals as refused:
                if COUNTED in refused.refused:
                    raise self._ended_or_full(device_id, enrollment.enrollment_id) from None
                if ASSERTION in refused.refused:
                    raise AssertionReplayed(device_id) from None
                if isinstance(refused.refusal, DeviceAlreadyExists):
                    raise Moved(None) from None  # created meanwhile: read it and decide again
                if refused.refusal is not None:
                    raise refused.refusal from None
                raise Moved(None, "conflict") from None
            return Provisioned(planned.device, credential_id, True)

        return RetryLoop(ATTEMPTS, BUDGET_SECONDS, self._runtime).run(
            device_id, attempt, lambda: store.get_state(device_id), count_success=False)

    def _again(self, device_id: str, enrollment: Enrollment, item: dict) -> Provisioned:
        """A device that exists: this enrollment's, with its credential still registered, or refused."""
        if not provisioned_by(item, enrollment.enrollment_id):
            raise ProvisioningRefused(device_id, "device-exists",
                                      f"a device {device_id!r} exists that this enrollment did not provision")
        device, held = Device.from_item(item), registered(item)
        candidates = (provisioned_credential_id(enrollment.enrollment_id, device_id, device.created_at),
                      earlier_provisioned_credential_id(enrollment.enrollment_id, device_id))
        credential_id = next((candidate for candidate in candidates if candidate in held), None)
        if credential_id is None:
            raise ProvisioningRefused(device_id, "credential-revoked",
                                      "the credential this enrollment provisioned the device with was revoked")
        return Provisioned(device, credential_id, False)

    def _ended_or_full(self, device_id: str, enrollment_id: str) -> ProvisioningRefused:
        """Why the enrollment refused to count the device, as it is now."""
        item = self._pipeline.store.get(enrollment_key(enrollment_id))
        if item is None:
            return ProvisioningRefused(device_id, "enrollment-ended", f"enrollment {enrollment_id!r} has ended")
        current = Enrollment.from_item(item)
        if current.deleted or current.expired(self._runtime.clock()):
            return ProvisioningRefused(device_id, "enrollment-ended", f"enrollment {enrollment_id!r} has ended")
        return ProvisioningRefused(device_id, "enrollment-full",
                                   f"enrollment {enrollment_id!r} has provisioned its {current.max_devices} devices")
