"""Powertools Logger, Tracer and Metrics for the API, and the adapter that feeds the
library's observer events into metrics named by the library's constants."""

from __future__ import annotations

import os
import warnings

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit

from functions.auth.assertions import AssertionRefused
from functions.auth.sealing import SealingFailed
from functions.device_state import (AssertionReplayed, CredentialRevoked, ProvisioningRefused, UpdateObserver, loads,
                                    metrics as names)

class _NoTracing:
    """What Powertools' Tracer does when tracing is off (pass the handler through), without
    importing the X-Ray SDK, which alone costs ~190 ms of cold start (measured with
    `python -X importtime`). Deployed functions have tracing on and use the real Tracer."""

    @staticmethod
    def capture_lambda_handler(handler):
        return handler


def _tracing_disabled() -> bool:
    return os.environ.get("POWERTOOLS_TRACE_DISABLED", "").strip().lower() in ("1", "true", "yes")


logger = Logger(service=names.SERVICE)
tracer = _NoTracing() if _tracing_disabled() else Tracer(service=names.SERVICE)
# Powertools' own variable names the namespace (the CDK stack sets it); this default
# keeps a local run from failing on an unset variable.
metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or names.NAMESPACE,
                  service=names.SERVICE)

# A GET emits no metric; that is expected, not worth a warning per request.
warnings.filterwarnings("ignore", message="No application metrics to publish")

# The library logs conflicts and exhaustion on its own stdlib logger; give it ours.
copy_config_to_registered_loggers(source_logger=logger, include={"device_state"})


class MetricsObserver(UpdateObserver):
    """One metric per library event; the metric names are the library's constants."""

    def attempt(self, device_id, attempt):
        metrics.add_metric(name=names.UPDATE_ATTEMPTS, unit=MetricUnit.Count, value=1)

    def conflict(self, device_id, expected_version, found_version):
        metrics.add_metric(name=names.VERSION_CONFLICTS, unit=MetricUnit.Count, value=1)

    def held(self, device_id, seconds):
        metrics.add_metric(name=names.CONTENTION_HOLD, unit=MetricUnit.Milliseconds, value=seconds * 1000)

    def condition_failed(self, device_id):
        metrics.add_metric(name=names.CONDITION_FAILURES, unit=MetricUnit.Count, value=1)

    def succeeded(self, device_id, attempts, elapsed):
        metrics.add_metric(name=names.UPDATES, unit=MetricUnit.Count, value=1)

    def exhausted(self, device_id, attempts, elapsed):
        metrics.add_metric(name=names.RETRIES_EXHAUSTED, unit=MetricUnit.Count, value=1)

    def transaction_committed(self, operations, attempts):
        metrics.add_metric(name=names.TRANSACTIONS, unit=MetricUnit.Count, value=1)

    def transaction_retried(self, reason):
        metrics.add_metric(name=names.TRANSACTION_RETRIES, unit=MetricUnit.Count, value=1)
        if reason == "conflict":
            metrics.add_metric(name=names.TRANSACTION_CONFLICTS, unit=MetricUnit.Count, value=1)

    def replayed(self, device_id):
        metrics.add_metric(name=names.IDEMPOTENT_REPLAYS, unit=MetricUnit.Count, value=1)

    def outcome_unknown(self, device_id):
        metrics.add_metric(name=names.OUTCOME_UNKNOWN, unit=MetricUnit.Count, value=1)

    def lease_acquired(self, device_id, waited):
        metrics.add_metric(name=names.LEASES_ACQUIRED, unit=MetricUnit.Count, value=1)
        metrics.add_metric(name=names.LEASE_WAIT, unit=MetricUnit.Milliseconds, value=waited * 1000)

    def lease_busy(self, device_id):
        metrics.add_metric(name=names.LEASE_BUSY, unit=MetricUnit.Count, value=1)

    def lease_reclaimed(self, device_id, rows):
        metrics.add_metric(name=names.LEASES_RECLAIMED, unit=MetricUnit.Count, value=rows)

    def lease_lost(self, device_id):
        metrics.add_metric(name=names.LEASE_HEARTBEATS_LOST, unit=MetricUnit.Count, value=1)

    def consumed(self, operation, read_units, write_units):
        if read_units:
            metrics.add_metric(name=names.READ_UNITS, unit=MetricUnit.Count, value=read_units)
        if write_units:
            metrics.add_metric(name=names.WRITE_UNITS, unit=MetricUnit.Count, value=write_units)


def record_patch_latency(milliseconds: float) -> None:
    metrics.add_metric(name=names.PATCH_LATENCY, unit=MetricUnit.Milliseconds, value=milliseconds)


def record_device_token() -> None:
    metrics.add_metric(name=names.DEVICE_TOKENS, unit=MetricUnit.Count, value=1)


def record_signing_failure(throttled: bool) -> None:
    metrics.add_metric(name=names.SIGNING_THROTTLED if throttled else names.SIGNING_UNAVAILABLE,
                       unit=MetricUnit.Count, value=1)


def record_refusal(error: Exception, answer=None, device_id: str | None = None) -> None:
    """The metric of a refusal of devices' identity, if ``error`` is one; an assertion refused
    also has its log line (the problem type of its ``answer``, the device, and why, which the
    answer may not say; never the assertion), the one the runbook reads to tell a fleet's rotated
    key from guessing."""
    if isinstance(error, (AssertionRefused, AssertionReplayed)):
        record(names.ASSERTIONS_REFUSED)
        logger.info("request refused", extra={"problem_type": loads(answer.body).get("type") if answer else None,
                                               "device_id": device_id,
                                               "cause": getattr(error, "cause", None) or str(error)})
    elif isinstance(error, CredentialRevoked):
        record(names.REVOKED_CREDENTIAL_REQUESTS)
    elif isinstance(error, ProvisioningRefused):
        record(names.PROVISIONINGS_REFUSED)
    elif isinstance(error, SealingFailed):
        record(names.SEALING_FAILURES)


def record(name: str) -> None:
    """One of the service's count metrics (``metrics``' names), once."""
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=1)
