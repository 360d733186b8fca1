"""The identity commands (the devices.admin scope): ``credentials`` a device holds (add, list,
revoke) and the ``enrollments`` devices provision themselves by (create, list, show, delete).
A secret or group key is printed once, in the answer that made it, and never again."""

from __future__ import annotations

import shlex
import sys

import click

from . import ID, REFUSED, example, main, output_option
from .commands import read_json

CREDENTIAL_TYPES = ("publicKey", "certificate", "secret")


def _pem(value: str | None, what: str) -> str | None:
    """PEM text from a file (``@key.pem``), stdin (``-``) or the argument itself."""
    if value is None:
        return None
    if value == "-":
        return sys.stdin.read()
    if value.startswith("@"):
        try:
            with open(value[1:], encoding="ascii") as file:
                return file.read()
        except (OSError, UnicodeError) as error:
            raise click.BadParameter(f"cannot read {value[1:]}: {error}", param_hint=what) from None
    return value


def _session():
    return click.get_current_context().obj


def _initial(value: str) -> dict:
    document = read_json(value, "--initial")
    if not isinstance(document, dict):
        raise click.BadParameter("must be a JSON object: {\"state\": {...}, \"desired\": {...}}",
                                 param_hint="--initial")
    return document


def _listed(documents: list, output: str, kind: str) -> None:
    from .output import Stream

    with Stream(output, kind) as printed:
        printed.add_page(documents)


@main.group(epilog=example("device-state credentials add lamp-1 --public-key @lamp-1.pub.pem",
                           "device-state credentials add lamp-1 --secret -o json",
                           "device-state credentials list lamp-1",
                           "device-state credentials revoke lamp-1 CREDENTIAL_ID"))
def credentials():
    """Register, list and revoke what devices prove themselves with (devices.admin).

    A device holds at most 5 credentials: a key rotates by adding the new one and revoking the
    old. Revoking one shuts out every token minted from it at once."""


@credentials.command("add", epilog=example("device-state credentials add lamp-1 --public-key @lamp-1.pub.pem",
                                           "device-state credentials add lamp-1 --secret "
                                           "--expires-at 2027-01-01T00:00:00Z -o json"))
@click.argument("device_id", metavar="ID", type=ID)
@click.option("--public-key", "public_key", metavar="PEM", help="An EC P-256 or RSA (2048+) public key: "
                                                                  "@file.pem, - (stdin) or the PEM itself.")
@click.option("--certificate", metavar="PEM", help="An X.509 certificate (any issuer): @file.pem, - or the PEM.")
@click.option("--secret", is_flag=True, help="A secret the service makes: printed this once (base64).")
@click.option("--expires-at", "expires_at", metavar="RFC3339", help="When it stops working, e.g. 2027-01-01T00:00:00Z.")
@output_option
def add_credential(device_id, public_key, certificate, secret, expires_at, output):
    """Register a credential for a device: one of --public-key, --certificate, --secret."""
    given = [kind for kind, value in zip(CREDENTIAL_TYPES, (public_key, certificate, secret)) if value]
    if len(given) != 1:
        raise click.UsageError("give one of --public-key, --certificate and --secret")
    session = _session()
    from .output import show

    session.unkeyed_write(f"`device-state credentials list {shlex.quote(device_id)}` shows it if it was (a secret "
                          "it made is lost with the answer: revoke that credential and add another)")
    answer = session.client().add_credential(device_id, given[0], public_key=_pem(public_key, "--public-key"),
                                             certificate=_pem(certificate, "--certificate"), expires_at=expires_at)
    show(answer, session.output(output), "credential")


@credentials.command("list", epilog=example("device-state credentials list lamp-1"))
@click.argument("device_id", metavar="ID", type=ID)
@output_option
def list_credentials(device_id, output):
    """List a device's credentials (never a secret; a revoked one is gone)."""
    session = _session()
    _listed(session.client().list_credentials(device_id), session.output(output), "credentials")


@credentials.command("revoke", epilog=example("device-state credentials revoke lamp-1 3f6kq2n7x4mab2cd --yes"))
@click.argument("device_id", metavar="ID", type=ID)
@click.argument("credential_id", metavar="CREDENTIAL_ID", type=ID)
@click.option("--yes", "-y", is_flag=True, help="Do not ask (nothing is asked when stdin is not a terminal).")
def revoke_credential(device_id, credential_id, yes):
    """Revoke a device's credential: its tokens stop working at their next request."""
    session = _session()
    if not yes and sys.stdin.isatty() and not click.confirm(f"Revoke {credential_id} of {device_id}?", err=True):
        raise click.exceptions.Exit(REFUSED)
    session.unkeyed_write("revoking it again is safe (404 credential-not-found once it is gone)")
    session.client().revoke_credential(device_id, credential_id)
    if sys.stdout.isatty():
        click.echo(f"revoked {credential_id} of {device_id}")


@main.group(epilog=example("device-state enrollments create --id-pattern 'lamp-[0-9]{6}' --max-devices 1000 "
                           "--initial '{\"desired\": {\"power\": \"off\"}}' -o json",
                           "device-state enrollments list", "device-state enrollments show line-7",
                           "device-state enrollments delete line-7"))
def enrollments():
    """Create, read and end the group enrollments devices provision themselves by (devices.admin).

    A device of an enrollment holds base64(HMAC-SHA256(groupKey, deviceId)) from its factory
    and provisions itself with it (POST /devices/{id}/provision)."""


@enrollments.command("create", epilog=example(
    "device-state enrollments create --enrollment-id line-7 --id-pattern 'lamp-[0-9]{6}' --max-devices 1000 "
    "--initial '{\"desired\": {\"power\": \"off\"}}' -o json"))
@click.option("--id-pattern", "id_pattern", required=True, metavar="REGEX",
              help="The device ids it provisions (the whole id must match).")
@click.option("--max-devices", "max_devices", required=True, type=click.IntRange(min=1), metavar="N",
              help="At most this many devices.")
@click.option("--enrollment-id", "enrollment_id", metavar="ID", help="Its id (default: one is made).")
@click.option("--initial", metavar="JSON", help="The devices' first documents, {\"state\", \"desired\"}: JSON, "
                                                "@file.json or -.")
@click.option("--expires-at", "expires_at", metavar="RFC3339", help="When it stops provisioning.")
@output_option
def create_enrollment(id_pattern, max_devices, enrollment_id, initial, expires_at, output):
    """Create an enrollment: its groupKey is printed this once."""
    session = _session()
    from .output import show

    session.unkeyed_write("`device-state enrollments list` shows it if it was (its group key is lost with the "
                          "answer: delete it and create another)")
    answer = session.client().create_enrollment(
        id_pattern, max_devices, enrollment_id=enrollment_id,
        initial=None if initial is None else _initial(initial), expires_at=expires_at)
    show(answer, session.output(output), "enrollment")


@enrollments.command("list", epilog=example("device-state enrollments list -o table"))
@output_option
def list_enrollments(output):
    """List the enrollments with how many devices each provisioned."""
    session = _session()
    _listed(session.client().list_enrollments(), session.output(output), "enrollments")


@enrollments.command("show", epilog=example("device-state enrollments show line-7"))
@click.argument("enrollment_id", metavar="ID", type=ID)
@output_option
def show_enrollment(enrollment_id, output):
    """Show an enrollment (never its group key)."""
    session = _session()
    from .output import show

    show(session.client().get_enrollment(enrollment_id), session.output(output), "enrollment")


@enrollments.command("delete", epilog=example("device-state enrollments delete line-7 --yes"))
@click.argument("enrollment_id", metavar="ID", type=ID)
@click.option("--yes", "-y", is_flag=True, help="Do not ask (nothing is asked when stdin is not a terminal).")
def delete_enrollment(enrollment_id, yes):
    """End an enrollment: no new device provisions itself by it; those it did keep their credentials."""
    session = _session()
    if not yes and sys.stdin.isatty() and not click.confirm(f"Delete enrollment {enrollment_id}?", err=True):
        raise click.exceptions.Exit(REFUSED)
    session.unkeyed_write("deleting it again is safe (404 enrollment-not-found once it is gone)")
    session.client().delete_enrollment(enrollment_id)
    if sys.stdout.isatty():
        click.echo(f"deleted enrollment {enrollment_id}")
