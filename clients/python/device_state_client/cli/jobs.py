"""``device-state jobs``: create a job (one desired change to many devices), list and show jobs
and their executions, follow a job's progress, cancel it (docs/api/jobs.md)."""

from __future__ import annotations

import click

from . import ID, example, main, output_option
from .commands import read_json

JOB_STATUSES = ("IN_PROGRESS", "COMPLETED", "CANCELED", "ABORTED")
EXECUTION_STATES = ("QUEUED", "IN_PROGRESS", "SUCCEEDED", "FAILED", "TIMED_OUT", "SUPERSEDED", "REMOVED", "CANCELED")
ABORT_KINDS = ("FAILED", "TIMED_OUT", "ANY")


def _session():
    return click.get_current_context().obj


@main.group(epilog=example(
    "device-state jobs create --filter 'eq(state/site,\"porch\")' --desired '{\"mode\": \"eco\"}'",
    "device-state jobs show porch-eco --watch"))
def jobs():
    """Change many devices at once, each once, and follow how each took it.

    A job writes one desired merge patch to every device a fleet query matches (or a list
    names), at most once per device, and tracks each device's execution from what it
    reports (docs/api/jobs.md)."""


def _device_ids(value: str) -> list:
    """Ids separated by commas, or a JSON array from the argument, @file or - (stdin)."""
    if value == "-" or value.startswith(("@", "[")):
        ids = read_json(value, "--device-ids")
        if not isinstance(ids, list) or not all(isinstance(one, str) for one in ids):
            raise click.BadParameter("must be a JSON array of device ids", param_hint="--device-ids")
        return ids
    return [one.strip() for one in value.split(",") if one.strip()]


def _abort(values: tuple) -> list | None:
    """Each --abort as ON:PERCENT:MIN (FAILED:10:50) or the API's JSON (an object, or an array of them)."""
    criteria = []
    for value in values:
        if value == "-" or value.startswith(("@", "{", "[")):
            document = read_json(value, "--abort")
            criteria += document if isinstance(document, list) else [document]
            continue
        parts = value.split(":")
        if len(parts) != 3 or parts[0] not in ABORT_KINDS:
            raise click.BadParameter(f"{value!r} is not ON:PERCENT:MIN with ON one of {', '.join(ABORT_KINDS)} "
                                     "(or the API's JSON)", param_hint="--abort")
        from decimal import Decimal, InvalidOperation

        try:
            percent, minimum = Decimal(parts[1]), int(parts[2])
        except (InvalidOperation, ValueError):
            percent = None
        if percent is None or not percent.is_finite():
            raise click.BadParameter(f"{value!r}: PERCENT is a number and MIN a whole number",
                                     param_hint="--abort")
        criteria.append({"on": parts[0], "thresholdPercent": percent, "minExecuted": minimum})
    return criteria or None


@jobs.command("create", epilog=example(
    "device-state jobs create --filter 'eq(state/site,\"porch\")' --desired '{\"mode\": \"eco\"}' --job-id porch-eco",
    "device-state jobs create --device-ids lamp-1,lamp-2 --desired @firmware.json --max-per-minute 60 "
    "--abort FAILED:10:20 --timeout 3600"))
@click.option("--filter", "filter_", metavar="RQL",
              help="The devices this fleet query matches (declared fields: docs/api/fleet-query.md).")
@click.option("--device-ids", "device_ids", metavar="IDS",
              help="Instead of --filter: these devices, comma-separated, or a JSON array (@file, - for stdin).")
@click.option("--desired", required=True, metavar="JSON",
              help="The merge patch of desired each device gets (values set, no null).")
@click.option("--job-id", "job_id", metavar="ID", help="The job's id (default: a new one that sorts by time).")
@click.option("--expires-in", "expires_in", type=click.IntRange(1, 2_592_000), metavar="SECONDS",
              help="The leaves it sets leave the delta after this long unless reported by then.")
@click.option("--clear-on-confirm", "clear_on_confirm", is_flag=True,
              help="The leaves it sets leave desired once the device reports them equal.")
@click.option("--max-per-minute", "max_per_minute", type=click.IntRange(1, 100_000), metavar="N",
              help="Rollout: at most N writes a minute, spread evenly.")
@click.option("--abort", multiple=True, metavar="ON:PERCENT:MIN",
              help="Abort once at least MIN executions are final and PERCENT of them are ON (FAILED, TIMED_OUT "
                   "or ANY of both); repeatable, or the API's JSON.")
@click.option("--timeout", "timeout_seconds", type=click.IntRange(1, 2_592_000), metavar="SECONDS",
              help="An execution unconfirmed this long after its write is TIMED_OUT (default: --expires-in, "
                   "else 7 days).")
@click.option("--continuous", is_flag=True,
              help="With --filter: also devices that come to match later, each once, until canceled or --ends-at.")
@click.option("--ends-at", "ends_at", metavar="TIME",
              help="RFC 3339, at most 30 days ahead (the default): no device is written after it.")
@click.option("--idempotency-key", "idempotency_key", metavar="KEY",
              help="The write's Idempotency-Key (default: a new one). The same command with the same key creates "
                   "at most one job and answers it.")
@output_option
def create_job(filter_, device_ids, desired, job_id, expires_in, clear_on_confirm, max_per_minute, abort,
               timeout_seconds, continuous, ends_at, idempotency_key, output):
    """Create a job: one desired change to many devices.

    Those a fleet query matches, or those --device-ids names. It answers at once and writes
    each device once meanwhile (device-state jobs show ID --watch follows it). JSON arguments
    may be @file to read a file or - to read stdin."""
    session = _session()
    from .output import show

    if (filter_ is None) == (device_ids is None):
        raise click.UsageError("give one of --filter and --device-ids")
    patch = read_json(desired, "--desired")
    if not isinstance(patch, dict):
        raise click.BadParameter("must be a JSON object (a merge patch of desired)", param_hint="--desired")
    answer = session.client().create_job(
        patch, filter=filter_, device_ids=None if device_ids is None else _device_ids(device_ids), job_id=job_id,
        expires_in=expires_in, clear_on_confirm=clear_on_confirm, max_per_minute=max_per_minute,
        abort=_abort(abort), timeout_seconds=timeout_seconds, continuous=continuous, ends_at=ends_at,
        idempotency_key=session.write_key(idempotency_key))
    show(answer, session.output(output), "job")


@jobs.command("list", epilog=example("device-state jobs list --status IN_PROGRESS", "device-state jobs list -o json"))
@click.option("--status", type=click.Choice(JOB_STATUSES), help="Only the jobs of this status.")
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="At most this many jobs.")
@click.option("--page-size", "page_size", type=click.IntRange(1, 100), default=100, show_default=True, metavar="N",
              help="Jobs per request.")
@output_option
def list_jobs(status, limit, page_size, output):
    """List jobs, newest first."""
    session = _session()
    from .output import Stream

    client = session.client()
    with Stream(session.output(output), "jobs") as stream:
        _stream(stream, client.job_pages(status, min(page_size, limit or page_size)), limit)


@jobs.command("executions", epilog=example("device-state jobs executions porch-eco --state FAILED"))
@click.argument("job_id", metavar="ID", type=ID)
@click.option("--state", type=click.Choice(EXECUTION_STATES), help="Only the executions in this state.")
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="At most this many executions.")
@click.option("--page-size", "page_size", type=click.IntRange(1, 100), default=100, show_default=True, metavar="N",
              help="Executions per request.")
@output_option
def executions(job_id, state, limit, page_size, output):
    """List a job's executions, one per device.

    In the order the devices were targeted, each in one state: QUEUED, IN_PROGRESS, then
    SUCCEEDED, FAILED (with the device's code and reason), TIMED_OUT, SUPERSEDED, REMOVED or
    CANCELED."""
    session = _session()
    from .output import Stream

    client = session.client()
    with Stream(session.output(output), "executions") as stream:
        _stream(stream, client.execution_pages(job_id, state, min(page_size, limit or page_size)), limit)


def _stream(stream, pages, limit: int | None) -> None:
    """Prints the pages' items as they are read, at most ``limit``, reading no page past it."""
    for page in pages:
        items = page["items"] if limit is None else page["items"][: limit - stream.count]
        stream.add_page(items)
        if limit is not None and stream.count >= limit:
            return


@jobs.command("show", epilog=example("device-state jobs show porch-eco", "device-state jobs show porch-eco --watch",
                                     "device-state jobs show porch-eco --watch -o json | jq -c .counts"))
@click.argument("job_id", metavar="ID", type=ID)
@click.option("--watch", is_flag=True,
              help="Follow the job until every execution is final and no device is left to find: on a terminal "
                   "a live progress bar with the count of each execution state; piped, one JSON document each "
                   "time the job changes.")
@output_option
def show_job(job_id, watch, output):
    """Show a job and its count of executions in each state.

    With --watch, then again at each change of its status, a count or its total, by long-polls
    that read nothing while the job stays as it is."""
    session = _session()
    from .output import job_progress, show

    client, output = session.client(), session.output(output)
    if not watch:
        show(client.job(job_id), output, "job")
        return
    with job_progress(output) as shown:
        for job in client.follow_job(job_id):
            shown(job)


@jobs.command("cancel", epilog=example("device-state jobs cancel porch-eco",
                                       "device-state jobs cancel porch-eco --force"))
@click.argument("job_id", metavar="ID", type=ID)
@click.option("--force", is_flag=True,
              help="Also take the job's leaves back from the devices still in progress where the job still owns "
                   "them (those executions become CANCELED); also on a job canceled already, until it completed.")
@click.option("--idempotency-key", "idempotency_key", metavar="KEY",
              help="The cancel's Idempotency-Key (default: a new one). The same command with the same key answers "
                   "the job its first run canceled, rather than 409 job-ended.")
@output_option
def cancel_job(job_id, force, idempotency_key, output):
    """Cancel a job: what is still queued is never written.

    Its queued executions are CANCELED; executions in progress stay tracked (with --force, they are undone). A job that ended
    cannot be canceled (409 job-ended)."""
    session = _session()
    from .output import show

    show(session.client().cancel_job(job_id, force=force, idempotency_key=session.write_key(idempotency_key)),
         session.output(output), "job")
