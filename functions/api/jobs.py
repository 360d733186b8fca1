"""Routes of jobs (``/jobs``) and of a device's jobs: each request comes parsed and authorized by
its declaration (``routes``); these call the library's ``JobService`` and shape its answers. A
created or canceled job's runner is started at once where one is deployed (``JOB_RUNNER_FUNCTION``);
``make serve`` runs its own."""

from __future__ import annotations

import logging
from urllib.parse import quote

from .resolver import Response
from .resolver import Router

from . import request_parsing as parse
from .common import IDEMPOTENT_REPLAYED, idempotency_key, json_response, manager, own_holder, route, wait_budget
from .routes import Request
from functions.config import api_config
from functions.device_state import start_function

router = Router()
logger = logging.getLogger("device_state.api")


def _etag(head) -> str:
    return f'"{head.etag()}"'


def _job(head, status: int = 200, headers: dict | None = None) -> Response:
    return json_response(head.as_dict(), status, {"ETag": _etag(head), **(headers or {})})


def _start_runner(job_id: str) -> None:
    """Asks the deployed runner to take the job now (the schedule would within a minute)."""
    function = api_config().job_runner_function
    if not function:
        return
    try:
        start_function(function, {"jobId": job_id})
    except Exception:  # noqa: BLE001 - the schedule wakes the job anyway
        logger.warning("job runner not started; the schedule will", extra={"job_id": job_id})


def _location(event, job_id: str) -> str:
    outer = (event.get("requestContext") or {}).get("path") or ""
    prefix = outer[: -len(event.path)] if event.path and outer.endswith(event.path) else ""
    return f"{prefix}/jobs/{quote(job_id, safe='')}"


@route(router, "createJob")
def create_job(request: Request) -> Response:
    head, replayed = manager().jobs().create(request.body, idempotency_key(request, "jobs"))
    if not replayed:
        _start_runner(head.record.spec.job_id)
    headers = {"Location": _location(request.event, head.record.spec.job_id)}
    if replayed:
        headers[IDEMPOTENT_REPLAYED] = "true"
    return _job(head, 201, headers)


@route(router, "listJobs")
def list_jobs(request: Request) -> Response:
    found, cursor = manager().jobs().list(request.query.get("status"), request.query["limit"],
                                          request.query.get("cursor"))
    return json_response({"items": found, "nextCursor": cursor})


@route(router, "getJob")
def get_job(request: Request) -> Response:
    job_id = request.path["job_id"]
    named = request.headers.get(parse.IF_NONE_MATCH)
    seen = parse.tag_matcher(named) if named is not None else None
    waits = seen is not None and named.strip() != "*"  # * matches whatever the job becomes: no wait ends it
    seconds = wait_budget(request.context, request.query["waitSeconds"]) if waits else 0
    head = manager().jobs().wait(job_id, seen, seconds)
    if seen is not None and seen(head.etag()):
        return Response(status_code=304, headers={"ETag": _etag(head)})
    return _job(head)


@route(router, "listJobExecutions")
def list_executions(request: Request) -> Response:
    found, cursor = manager().jobs().executions(request.path["job_id"], request.query.get("state"),
                                                request.query["limit"], request.query.get("cursor"))
    return json_response({"items": found, "nextCursor": cursor})


@route(router, "cancelJob")
def cancel_job(request: Request) -> Response:
    force = request.query["force"]
    head, replayed = manager().jobs().cancel(request.path["job_id"], force,
                                             idempotency_key(request, "jobs", f"force={force}"))
    if replayed:
        return _job(head, headers={IDEMPOTENT_REPLAYED: "true"})
    _start_runner(head.record.spec.job_id)
    return _job(head)


@route(router, "listDeviceJobs", reads_holder=True)
def device_jobs(request: Request) -> Response:
    device_id = request.path["device_id"]
    found, cursor = manager().jobs().device_jobs(device_id, own_holder(request, device_id),
                                                 request.query["limit"], request.query.get("cursor"))
    return json_response({"items": found, "nextCursor": cursor})
