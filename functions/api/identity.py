"""Routes of devices' identity: the credentials registered per device and the enrollments devices
provision themselves by (the admin scope's), and provisioning itself (authenticated by the
device's own assertion). They parse, call ``functions.auth.identity`` and the library, and
answer; a secret or group key is shown once, in the answer that made it, and never logged."""

from __future__ import annotations

import time
from urllib.parse import quote

from .resolver import Response, Router

from functions.auth import identity
from functions.auth.assertions import encoded
from functions.auth.sealing import sealer
from functions.device_state import (CredentialRecord, Enrollment, EnrollmentNotFound, check_state, dumps,
                                    epoch_seconds, timestamp)
from functions.device_state import metrics as names

from . import access
from .common import json_response, manager, route
from .observability import record
from .problems import BadRequest
from .routes import Request
from .tokens import token_response

router = Router()
MAX_INITIAL_BYTES = 64 * 1024  # an enrollment's initial documents, as JSON
NO_STORE = {"Cache-Control": "no-store"}


def _expires_at(raw) -> int | None:
    """``expiresAt`` (RFC 3339 with its offset) as epoch seconds, in the future; an answer shows
    it in UTC, where 9999-12-31T23:59:59-14:00 is in the year 10000, so that is refused too."""
    if raw is None:
        return None
    try:
        seconds = epoch_seconds(raw)
    except ValueError as error:
        raise BadRequest(f"expiresAt must be an RFC 3339 time with its offset before 10000-01-01T00:00:00Z, "
                         f"e.g. 2027-01-01T00:00:00Z ({error})") from None
    if seconds <= time.time():
        raise BadRequest("expiresAt must be in the future")
    return seconds


def credential_json(record: CredentialRecord) -> dict:
    shown = {"credentialId": record.credential_id, "type": record.kind, "createdAt": record.created_at}
    if record.thumbprint is not None:
        shown["thumbprint"] = record.thumbprint
    if record.expires_at is not None:
        shown["expiresAt"] = timestamp(record.expires_at)
    if record.enrollment is not None:
        shown["enrollmentId"] = record.enrollment
    return shown


@route(router, "addCredential")
def add_credential(request: Request):
    device_id, body = request.path["device_id"], request.body
    record, secret = identity.credential(body["type"], device_id, sealer(), public_key=body.get("publicKey"),
                                         certificate=body.get("certificate"),
                                         expires_at=_expires_at(body.get("expiresAt")))
    added = manager().add_credential(device_id, record)
    shown = credential_json(added)
    if secret is not None:
        shown["secret"] = encoded(secret)  # shown this once
    return json_response(shown, 201, headers=NO_STORE)


@route(router, "listCredentials")
def list_credentials(request: Request):
    return json_response({"items": [credential_json(record)
                                    for record in manager().credentials(request.path["device_id"])]})


@route(router, "revokeCredential")
def revoke_credential(request: Request):
    manager().revoke_credential(request.path["device_id"], request.path["credential_id"])
    record(names.CREDENTIALS_REVOKED)
    return Response(status_code=204)


# ------------------------------------------------------------------ enrollments


def enrollment_json(enrollment: Enrollment) -> dict:
    shown = {"enrollmentId": enrollment.enrollment_id, "idPattern": enrollment.id_pattern,
             "initial": enrollment.initial, "maxDevices": enrollment.max_devices,
             "provisioned": enrollment.provisioned, "createdAt": enrollment.created_at}
    if enrollment.expires_at is not None:
        shown["expiresAt"] = timestamp(enrollment.expires_at)
    return shown


@route(router, "createEnrollment")
def create_enrollment(request: Request):
    body = request.body
    initial = body.get("initial") or {}
    for document in initial.values():
        check_state(document)
    if len(dumps(initial).encode()) > MAX_INITIAL_BYTES:
        raise BadRequest(f"initial is more than {MAX_INITIAL_BYTES} bytes of JSON")
    made, group_key = identity.enrollment(body.get("enrollmentId"), body["idPattern"], int(body["maxDevices"]),
                                          initial, _expires_at(body.get("expiresAt")), sealer())
    created = manager().create_enrollment(made)
    return json_response({**enrollment_json(created), "groupKey": encoded(group_key)}, 201,
                         headers={**NO_STORE, "Location": f"/enrollments/{quote(created.enrollment_id, safe='')}"})


@route(router, "listEnrollments")
def list_enrollments(request: Request):
    found, cursor = manager().enrollments(request.query["limit"], request.query.get("cursor"))
    return json_response({"items": [enrollment_json(each) for each in found], "nextCursor": cursor})


@route(router, "getEnrollment")
def get_enrollment(request: Request):
    found = manager().enrollment(request.path["enrollment_id"])
    if found.deleted:
        raise EnrollmentNotFound(found.enrollment_id)
    return json_response(enrollment_json(found))


@route(router, "deleteEnrollment")
def delete_enrollment(request: Request):
    manager().delete_enrollment(request.path["enrollment_id"])
    return Response(status_code=204)


# ------------------------------------------------------------------ provisioning


@route(router, "provisionDevice")
def provision_device(request: Request):
    """A device provisions itself by an enrollment (its assertion is its whole credential):
    201 the first time, 200 with a fresh token when the enrollment provisioned it before."""
    device_id = request.path["device_id"]
    provisioned, principal = identity.provision(manager(), device_id, access.assertion(request.event),
                                                (request.body or {}).get("publicKey"), sealer(), time.time())
    if provisioned.created:
        record(names.PROVISIONINGS)
    return token_response(principal, None, None, 201 if provisioned.created else 200, deviceId=device_id,
                          credentialId=provisioned.credential_id)
