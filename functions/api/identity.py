"""Routes of devices' identity: the credentials registered per device and the enrollments devices
provision themselves by (the admin scope's), and provisioning itself (authenticated by the
device's own assertion). They parse, call ``functions.auth.identity`` and the library, and
answer; a secret or group key is shown once, in the answer that made it, and never logged."""

from __future__ import annotations

import datetime
import time
from decimal import Decimal
from urllib.parse import quote

from .resolver import Response, Router

from functions.auth import identity
from functions.auth.assertions import MAX_PEM_CHARS, encoded
from functions.auth.sealing import sealer
from functions.device_state import (CREDENTIAL_ID_PATTERN, CREDENTIAL_KINDS, DESIRED, ENROLLMENT_ID_PATTERN,
                                    MAX_ENROLLMENT_DEVICES, STATE, CredentialNotFound, CredentialRecord,
                                    Enrollment, EnrollmentNotFound, check_state, dumps, timestamp)
from functions.device_state import metrics as names

from . import access
from . import request_parsing as parse
from .common import json_response, manager, route
from .observability import record
from .problems import BadRequest
from .tokens import token_response

router = Router()
MAX_INITIAL_BYTES = 64 * 1024  # an enrollment's initial documents, as JSON
NO_STORE = {"Cache-Control": "no-store"}


def _expires_at(raw) -> int | None:
    """``expiresAt`` (RFC 3339 with a time zone) as epoch seconds, in the future."""
    if raw is None:
        return None
    try:
        moment = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00")) if isinstance(raw, str) else None
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise BadRequest("expiresAt must be an RFC 3339 time with its offset, e.g. 2027-01-01T00:00:00Z")
    seconds = int(moment.timestamp())
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


@route(router, "/devices/<device_id>/credentials", "POST", body=True)
def add_credential(device_id: str):
    device_id = parse.device_id(device_id)
    body = parse.json_object(parse.json_body(router.current_event), "the body", ("type",),
                             ("publicKey", "certificate", "expiresAt"))
    kind = body["type"]
    if kind not in CREDENTIAL_KINDS:
        raise BadRequest(f"type must be one of {', '.join(CREDENTIAL_KINDS)}")
    material = {"publicKey": "publicKey", "certificate": "certificate"}.get(kind)
    given = [name for name in ("publicKey", "certificate") if name in body]
    if given != ([material] if material else []):
        raise BadRequest(f"a {kind} credential takes " + (f"{material} (PEM)" if material else "no key: the service "
                                                          "makes the secret"))
    if material and (not isinstance(body[material], str) or len(body[material]) > MAX_PEM_CHARS):
        raise BadRequest(f"{material} must be PEM text of at most {MAX_PEM_CHARS} characters")
    record, secret = identity.credential(kind, device_id, sealer(), public_key=body.get("publicKey"),
                                         certificate=body.get("certificate"), expires_at=_expires_at(body.get("expiresAt")))
    added = manager().add_credential(device_id, record)
    shown = credential_json(added)
    if secret is not None:
        shown["secret"] = encoded(secret)  # shown this once
    return json_response(shown, 201, headers=NO_STORE)


@route(router, "/devices/<device_id>/credentials", "GET", "HEAD")
def list_credentials(device_id: str):
    device_id = parse.device_id(device_id)
    return json_response({"items": [credential_json(record) for record in manager().credentials(device_id)]})


@route(router, "/devices/<device_id>/credentials/<credential_id>", "DELETE")
def revoke_credential(device_id: str, credential_id: str):
    device_id = parse.device_id(device_id)
    if not CREDENTIAL_ID_PATTERN.fullmatch(credential_id):
        raise CredentialNotFound(device_id, credential_id[:32])
    manager().revoke_credential(device_id, credential_id)
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


def _initial(raw) -> dict:
    initial = parse.json_object({} if raw is None else raw, "initial", (), (STATE, DESIRED))
    for section, document in initial.items():
        check_state(parse.document(document, f"initial.{section}"))
    if len(dumps(initial).encode()) > MAX_INITIAL_BYTES:
        raise BadRequest(f"initial is more than {MAX_INITIAL_BYTES} bytes of JSON")
    return initial


def _max_devices(raw) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, Decimal)) or raw != int(raw) \
            or not 1 <= int(raw) <= MAX_ENROLLMENT_DEVICES:
        raise BadRequest(f"maxDevices must be a whole number from 1 to {MAX_ENROLLMENT_DEVICES}")
    return int(raw)


@route(router, "/enrollments", "POST", body=True)
def create_enrollment():
    body = parse.json_object(parse.json_body(router.current_event), "the body", ("idPattern", "maxDevices"),
                             ("enrollmentId", "initial", "expiresAt"))
    enrollment_id = body.get("enrollmentId")
    if enrollment_id is not None and (not isinstance(enrollment_id, str)
                                      or not ENROLLMENT_ID_PATTERN.fullmatch(enrollment_id)):
        raise BadRequest("enrollmentId must be 1 to 64 letters, digits, '.', '_' or '-'")
    if not isinstance(body["idPattern"], str):
        raise BadRequest("idPattern must be a regular expression (a string)")
    made, group_key = identity.enrollment(enrollment_id, body["idPattern"], _max_devices(body["maxDevices"]),
                                          _initial(body.get("initial")), _expires_at(body.get("expiresAt")), sealer())
    created = manager().create_enrollment(made)
    return json_response({**enrollment_json(created), "groupKey": encoded(group_key)}, 201,
                         headers={**NO_STORE, "Location": f"/enrollments/{quote(created.enrollment_id, safe='')}"})


@route(router, "/enrollments", "GET", "HEAD")
def list_enrollments():
    return json_response({"items": [enrollment_json(found) for found in manager().enrollments()]})


def _enrollment_id(raw: str) -> str:
    if not ENROLLMENT_ID_PATTERN.fullmatch(raw):
        raise EnrollmentNotFound(raw[:64])
    return raw


@route(router, "/enrollments/<enrollment_id>", "GET", "HEAD")
def get_enrollment(enrollment_id: str):
    found = manager().enrollment(_enrollment_id(enrollment_id))
    if found.deleted:
        raise EnrollmentNotFound(found.enrollment_id)
    return json_response(enrollment_json(found))


@route(router, "/enrollments/<enrollment_id>", "DELETE")
def delete_enrollment(enrollment_id: str):
    manager().delete_enrollment(_enrollment_id(enrollment_id))
    return Response(status_code=204)


# ------------------------------------------------------------------ provisioning


@route(router, "/devices/<device_id>/provision", "POST", body=True)
def provision_device(device_id: str):
    """A device provisions itself by an enrollment (its assertion is its whole credential):
    201 the first time, 200 with a fresh token when the enrollment provisioned it before."""
    event = router.current_event
    device_id = parse.not_reserved(parse.device_id(device_id))
    body = {}
    if event.get("body") not in (None, ""):
        body = parse.json_object(parse.json_body(event), "the body", (), ("publicKey",))
    public_key = body.get("publicKey")
    if public_key is not None and (not isinstance(public_key, str)
                                   or len(public_key) > MAX_PEM_CHARS):
        raise BadRequest(f"publicKey must be PEM text of at most {MAX_PEM_CHARS} characters")
    provisioned, principal = identity.provision(manager(), device_id, access.assertion(event), public_key, sealer(),
                                                time.time())
    if provisioned.created:
        record(names.PROVISIONINGS)
    return token_response(principal, None, 201 if provisioned.created else 200, deviceId=device_id,
                          credentialId=provisioned.credential_id)

