"""Jobs: one desired change to every device a filter (or a list) names, written at most once per
device, tracked per device from what the device already does, with rollout, abort and cancel.

``spec`` (what a job asks, its states and limits), ``executions`` (how an execution's state
follows from the device's item: pure), ``device_write`` (the job's write of one device, through
the one planner and pipeline), ``items`` (the job's items and their attributes), ``store`` (them
read and written), ``finals`` (final states and the job's counts, written together), ``runner``
(targets, writes, sweeps, stops). The limits load with the package (the API's route declarations
read them at import); the rest when a name of theirs is first used, so a request that is not about
jobs never loads the runner, the store or the tracker."""

import importlib

from .spec import (ABORT_KINDS, EXECUTION_STATES, FINAL_STATES, JOB_ID_PATTERN, JOB_STATUSES, MAX_ABORT_CRITERIA,
                   MAX_DESIRED_BYTES, MAX_DEVICE_IDS, MAX_JOB_LEAVES, MAX_JOB_SECONDS, MAX_LIMIT, MAX_MIN_EXECUTED,
                   MAX_PER_MINUTE, MAX_TIMEOUT_SECONDS, MIN_THRESHOLD_PERCENT, RFC3339_PATTERN)

_LOADED_ON_USE = {"BUSY": "runner", "DONE": "runner", "HELD": "runner", "IDLE": "runner", "JobRunner": "runner",
                  "Progress": "runner", "JobService": "service", "JobTracker": "tracker"}


def __getattr__(name: str):
    if name not in _LOADED_ON_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LOADED_ON_USE[name]}", __name__), name)


__all__ = ["BUSY", "DONE", "HELD", "IDLE", "JobRunner", "Progress", "MAX_LIMIT", "JobService", "ABORT_KINDS",
           "EXECUTION_STATES", "FINAL_STATES", "JOB_ID_PATTERN", "JOB_STATUSES", "MAX_ABORT_CRITERIA",
           "MAX_DESIRED_BYTES", "MAX_DEVICE_IDS", "MAX_JOB_LEAVES", "MAX_JOB_SECONDS", "MAX_MIN_EXECUTED",
           "MAX_PER_MINUTE", "MAX_TIMEOUT_SECONDS", "MIN_THRESHOLD_PERCENT", "RFC3339_PATTERN", "JobTracker"]
