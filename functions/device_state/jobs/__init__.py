"""Jobs: one desired change to every device a filter (or a list) names, written at most once per
device, tracked per device from what the device already does, with rollout, abort and cancel.

``spec`` (what a job asks, its states and limits), ``executions`` (how an execution's state
follows from the device's item: pure), ``device_write`` (the job's write of one device, through
the one planner and pipeline), ``items`` (the job's items and their attributes), ``store`` (them
read and written), ``finals`` (final states and the job's counts, written together), ``runner``
(targets, writes, sweeps, stops)."""
