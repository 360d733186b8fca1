"""What a job is asked to do (``JobSpec``), read from its body and checked whole before
anything is stored; the states of a job and of its executions; the job's limits. All pure."""

from __future__ import annotations

import base64
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from ..errors import InvalidJob, InvalidValue
from ..model.desires import MAX_EXPIRY_SECONDS, MIN_EXPIRY_SECONDS, DesireOptions
from ..model.sections import check_pointer, leaves
from ..model.times import RFC3339_PATTERN, timestamp
from ..model.values import DEVICE_ID_PATTERN, check_state, dumps, item_size, loads, to_attribute

# A job's own status, and each execution's state (one per targeted device).
IN_PROGRESS, COMPLETED, CANCELED, ABORTED = "IN_PROGRESS", "COMPLETED", "CANCELED", "ABORTED"
JOB_STATUSES = (IN_PROGRESS, COMPLETED, CANCELED, ABORTED)
QUEUED, SUCCEEDED, FAILED, TIMED_OUT, SUPERSEDED, REMOVED = (
    "QUEUED", "SUCCEEDED", "FAILED", "TIMED_OUT", "SUPERSEDED", "REMOVED")
EXECUTION_STATES = (QUEUED, IN_PROGRESS, SUCCEEDED, FAILED, TIMED_OUT, SUPERSEDED, REMOVED, CANCELED)
FINAL_STATES = (SUCCEEDED, FAILED, TIMED_OUT, SUPERSEDED, REMOVED, CANCELED)
SNAPSHOT, CONTINUOUS = "snapshot", "continuous"
ANY = "ANY"  # an abort criterion's kind: FAILED or TIMED_OUT
ABORT_KINDS = (FAILED, TIMED_OUT, ANY)

JOB_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_DEVICE_IDS = 1000
MAX_JOB_LEAVES = 100  # leaves a job's desired patch may set
MAX_DESIRED_BYTES = 8192  # the desired patch, as stored
MAX_PER_MINUTE = 100_000
MAX_ABORT_CRITERIA = 5
MAX_MIN_EXECUTED = 1_000_000
MAX_JOB_SECONDS = 30 * 24 * 60 * 60  # endsAt: at most this far ahead (the default)
MAX_TIMEOUT_SECONDS = 30 * 24 * 60 * 60
MAX_LIMIT = 100  # jobs, or one job's executions, on a listed page
# How long after its write an execution is tracked when neither timeoutSeconds nor expiresIn
# says: unconfirmed by then, it is TIMED_OUT.
DEFAULT_WINDOW_SECONDS = 7 * 24 * 60 * 60

_MEMBERS = ("jobId", "filter", "deviceIds", "desired", "expiresIn", "clearOnConfirm", "rollout", "abort",
            "timeoutSeconds", "targets", "endsAt")
MIN_THRESHOLD_PERCENT = Decimal("0.01")


def new_job_id(now: float) -> str:
    """A job id that sorts by creation time: 48 bits of epoch milliseconds, then 40 random
    bits, in base32hex (16 characters of 0-9a-v)."""
    raw = int(now * 1000).to_bytes(6, "big") + secrets.token_bytes(4)
    return base64.b32hexencode(raw).decode().lower()  # 0-9a-v: in the order of the bytes


@dataclass(frozen=True)
class AbortCriterion:
    """Abort once at least ``min_executed`` executions are final and the share of those in a
    state of kind ``on`` (FAILED, TIMED_OUT, or ANY of the two) reaches ``threshold_percent``."""

    on: str
    threshold_percent: Decimal
    min_executed: int

    def as_dict(self) -> dict:
        return {"on": self.on, "thresholdPercent": self.threshold_percent, "minExecuted": self.min_executed}

    def met(self, counts: dict) -> bool:
        executed = sum(counts.get(state, 0) for state in FINAL_STATES)
        if executed < self.min_executed or executed == 0:
            return False
        kinds = (FAILED, TIMED_OUT) if self.on == ANY else (self.on,)
        return Decimal(sum(counts.get(state, 0) for state in kinds)) * 100 >= self.threshold_percent * executed


@dataclass(frozen=True)
class JobSpec:
    """A job: its id, its targets (``filter`` or ``device_ids``), the desired merge patch it
    writes once to each and how those leaves live on (``expires_in``, ``clear_on_confirm``),
    ``max_per_minute`` (None: no limit), the abort criteria, ``timeout_seconds``, ``targets``
    (snapshot or continuous), ``created_at`` and ``ends_at`` (epoch seconds)."""

    job_id: str
    desired: dict
    created_at: float
    ends_at: float
    filter: str | None = None
    device_ids: tuple[str, ...] = ()
    expires_in: int | None = None
    clear_on_confirm: bool = False
    max_per_minute: int | None = None
    abort: tuple[AbortCriterion, ...] = ()
    timeout_seconds: int | None = None
    targets: str = SNAPSHOT
    listed: int = 0  # how many devices ``device_ids`` named (a stored spec keeps only this)
    leaves: dict = field(default_factory=dict, compare=False)  # pointer -> value the job sets
    window: int | None = None  # as stored with the job (``window_seconds``); None: from its members

    def __post_init__(self):
        if not self.leaves:
            object.__setattr__(self, "leaves", leaves(self.desired))
        if self.device_ids and not self.listed:
            object.__setattr__(self, "listed", len(self.device_ids))

    @property
    def options(self) -> DesireOptions | None:
        options = DesireOptions(self.expires_in, self.clear_on_confirm)
        return options or None

    @property
    def window_seconds(self) -> int:
        """How long after its write an execution is tracked before it is TIMED_OUT: its
        ``timeout_seconds`` (never past the leaves' own expiry), else the leaves' ``expires_in``, else
        ``DEFAULT_WINDOW_SECONDS``. A job keeps the window it was created with (``stored``)."""
        if self.window is not None:
            return self.window
        if self.timeout_seconds is not None:
            return min(self.timeout_seconds, self.expires_in or self.timeout_seconds)
        return self.expires_in or DEFAULT_WINDOW_SECONDS

    @property
    def continuous(self) -> bool:
        return self.targets == CONTINUOUS

    def as_dict(self) -> dict:
        """The job's body as it is shown (the device ids are not: see its executions)."""
        shown = {"jobId": self.job_id, "targets": self.targets, "desired": self.desired,
                 "createdAt": timestamp(self.created_at), "endsAt": timestamp(self.ends_at)}
        if self.filter is not None:
            shown["filter"] = self.filter
        else:
            shown["deviceIdCount"] = self.listed
        if self.expires_in is not None:
            shown["expiresIn"] = self.expires_in
        if self.clear_on_confirm:
            shown["clearOnConfirm"] = True
        if self.max_per_minute is not None:
            shown["rollout"] = {"maxPerMinute": self.max_per_minute}
        if self.abort:
            shown["abort"] = [criterion.as_dict() for criterion in self.abort]
        if self.timeout_seconds is not None:
            shown["timeoutSeconds"] = self.timeout_seconds
        return shown

    # ------------------------------------------------------------- stored

    def stored(self) -> str:
        """The spec as the job's item keeps it (exact JSON; the device ids live in its pages)."""
        body = {"jobId": self.job_id, "desired": self.desired, "createdAt": round(self.created_at * 1000),
                "endsAt": round(self.ends_at * 1000), "targets": self.targets, "clearOnConfirm": self.clear_on_confirm}
        for name, value in (("filter", self.filter), ("expiresIn", self.expires_in),
                            ("maxPerMinute", self.max_per_minute), ("timeoutSeconds", self.timeout_seconds)):
            if value is not None:
                body[name] = value
        if self.abort:
            body["abort"] = [criterion.as_dict() for criterion in self.abort]
        if self.filter is None:
            body["deviceIdCount"] = self.listed
        body["windowSeconds"] = self.window_seconds
        return dumps(body)

    @classmethod
    def from_stored(cls, text: str) -> "JobSpec":
        body = loads(text)
        number = (lambda name: int(body[name]) if name in body else None)  # noqa: E731
        return cls(body["jobId"], body["desired"], int(body["createdAt"]) / 1000, int(body["endsAt"]) / 1000,
                   body.get("filter"), (), number("expiresIn"), bool(body.get("clearOnConfirm")),
                   number("maxPerMinute"),
                   tuple(AbortCriterion(entry["on"], Decimal(entry["thresholdPercent"]), int(entry["minExecuted"]))
                         for entry in body.get("abort", [])), number("timeoutSeconds"), body["targets"],
                   number("deviceIdCount") or 0,
                   # a job stored before it kept its window was tracked over at most 7 days: so it still is
                   window=number("windowSeconds") or min(seconds for seconds in (
                       number("timeoutSeconds"), number("expiresIn"), DEFAULT_WINDOW_SECONDS) if seconds is not None))


def parse(body, now: float, job_id: str | None = None) -> JobSpec:
    """The job a request's body asks for, checked whole (``InvalidJob`` naming the member);
    ``job_id``: the id to give it when the body names none (a new time-ordered id otherwise)."""
    if not isinstance(body, dict):
        raise InvalidJob("the body is a JSON object")
    unknown = sorted(set(body) - set(_MEMBERS))
    if unknown:
        raise InvalidJob(f"a job takes {', '.join(_MEMBERS)}; not {', '.join(unknown)}", unknown[0])
    chosen = body.get("jobId", job_id or new_job_id(now))
    if not isinstance(chosen, str) or not JOB_ID_PATTERN.fullmatch(chosen):
        raise InvalidJob("jobId is 1 to 64 of A-Z a-z 0-9 _ -", "jobId")
    has_filter, has_ids = "filter" in body, "deviceIds" in body
    if has_filter == has_ids:
        raise InvalidJob("a job names its targets by filter or by deviceIds, one of the two", "filter")
    text, device_ids = None, ()
    if has_filter:
        text = body["filter"]
        if not isinstance(text, str) or not text:
            raise InvalidJob("filter is RQL over declared fields, e.g. lt(reported/battery,20)", "filter")
    else:
        device_ids = _device_ids(body["deviceIds"])
    desired = _desired(body.get("desired"))
    expires_in, clear = body.get("expiresIn"), body.get("clearOnConfirm", False)
    if not isinstance(clear, bool):
        raise InvalidJob("clearOnConfirm is true or false", "clearOnConfirm")
    if expires_in is not None:
        expires_in = _whole(expires_in, "expiresIn", MIN_EXPIRY_SECONDS, MAX_EXPIRY_SECONDS)
    try:
        DesireOptions(expires_in, clear)
    except InvalidValue as error:
        raise InvalidJob(str(error), "expiresIn") from None
    targets = body.get("targets", SNAPSHOT)
    if targets not in (SNAPSHOT, CONTINUOUS):
        raise InvalidJob('targets is "snapshot" or "continuous"', "targets")
    if targets == CONTINUOUS and not has_filter:
        raise InvalidJob("a continuous job targets a filter: devices that come to match it later", "targets")
    ends_at = now + MAX_JOB_SECONDS
    if "endsAt" in body:
        ends_at = _instant(body["endsAt"], "endsAt")
        if not now < ends_at <= now + MAX_JOB_SECONDS:
            raise InvalidJob(f"endsAt is a time after now and at most {MAX_JOB_SECONDS // 86400} days ahead",
                             "endsAt")
    timeout = body.get("timeoutSeconds")
    if timeout is not None:
        timeout = _whole(timeout, "timeoutSeconds", 1, MAX_TIMEOUT_SECONDS)
    return JobSpec(chosen, desired, round(now * 1000) / 1000, ends_at, text, device_ids, expires_in, clear, _rollout(body.get("rollout")),
                   _abort(body.get("abort")), timeout, targets)


def _whole(value, member: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, Decimal)) or value != int(value) \
            or not low <= value <= high:
        raise InvalidJob(f"{member} is a whole number from {low} to {high}", member)
    return int(value)


def _device_ids(value) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_DEVICE_IDS:
        raise InvalidJob(f"deviceIds is a list of 1 to {MAX_DEVICE_IDS} device ids", "deviceIds")
    for device_id in value:
        if not isinstance(device_id, str) or not DEVICE_ID_PATTERN.fullmatch(device_id):
            raise InvalidJob("each of deviceIds is a device id (1-128 of A-Z a-z 0-9 . _ : -)", "deviceIds")
    return tuple(dict.fromkeys(value))  # each device once, in the order given


def _desired(value) -> dict:
    if not isinstance(value, dict) or not value:
        raise InvalidJob("desired is a merge patch of desired: an object setting at least one leaf", "desired")
    try:
        check_state(value)
    except InvalidValue as error:
        raise InvalidJob(f"desired: {error}", "desired") from None
    found = leaves(value)
    for pointer, leaf in found.items():
        if leaf is None:
            raise InvalidJob(f"desired sets values; {pointer} is null (a job cannot remove a desire: there is "
                             "nothing for the device to confirm)", "desired")
        if isinstance(leaf, dict):
            raise InvalidJob(f"desired sets values; {pointer} is an empty object", "desired")
        try:
            check_pointer(pointer)
        except InvalidValue as error:
            raise InvalidJob(f"desired: {error}", "desired") from None
    if len(found) > MAX_JOB_LEAVES:
        raise InvalidJob(f"desired sets at most {MAX_JOB_LEAVES} leaves; this one {len(found)}", "desired")
    if item_size({"": to_attribute(value)}) > MAX_DESIRED_BYTES:
        raise InvalidJob(f"desired is at most {MAX_DESIRED_BYTES} bytes as stored", "desired")
    return value


def _rollout(value) -> int | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"maxPerMinute"}:
        raise InvalidJob("rollout is {\"maxPerMinute\": n}", "rollout")
    return _whole(value["maxPerMinute"], "rollout.maxPerMinute", 1, MAX_PER_MINUTE)


def _abort(value) -> tuple[AbortCriterion, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_ABORT_CRITERIA:
        raise InvalidJob(f"abort is a list of 1 to {MAX_ABORT_CRITERIA} criteria", "abort")
    criteria = []
    for entry in value:
        if not isinstance(entry, dict) or set(entry) != {"on", "thresholdPercent", "minExecuted"}:
            raise InvalidJob('each abort criterion is {"on", "thresholdPercent", "minExecuted"}', "abort")
        if entry["on"] not in ABORT_KINDS:
            raise InvalidJob(f"an abort criterion's on is one of {', '.join(ABORT_KINDS)}", "abort")
        threshold = entry["thresholdPercent"]
        if isinstance(threshold, bool) or not isinstance(threshold, (int, Decimal)) \
                or not MIN_THRESHOLD_PERCENT <= threshold <= 100:
            raise InvalidJob(f"thresholdPercent is a number from {MIN_THRESHOLD_PERCENT} to 100", "abort")
        criteria.append(AbortCriterion(entry["on"], Decimal(threshold),
                                       _whole(entry["minExecuted"], "abort.minExecuted", 1, MAX_MIN_EXECUTED)))
    return tuple(criteria)


def _instant(value, member: str) -> float:
    if not isinstance(value, str) or not RFC3339_PATTERN.fullmatch(value):
        raise InvalidJob(f"{member} is an RFC 3339 time, e.g. 2030-01-01T00:00:00Z", member)
    try:
        return datetime.fromisoformat(value.upper().replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise InvalidJob(f"{member} is not a valid time", member) from None
