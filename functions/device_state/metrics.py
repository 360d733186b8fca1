"""Metric names: the one place they are spelled. The API layer emits them (EMF through
Powertools) and the CDK alarms and dashboard import them from here."""

NAMESPACE = "DeviceState"  # POWERTOOLS_METRICS_NAMESPACE in the deployed function
SERVICE = "device-state"
# Powertools adds this dimension to every metric; CloudWatch alarms must name it too.
DIMENSIONS = {"service": SERVICE}

# Optimistic-locking writes (update / update_with_retry), counted per call or attempt.
UPDATES = "Updates"  # writes that succeeded
UPDATE_ATTEMPTS = "UpdateAttempts"  # conditional writes tried, successful or not
VERSION_CONFLICTS = "VersionConflicts"  # attempts that met a newer version
RETRIES_EXHAUSTED = "RetriesExhausted"  # calls that gave up (the client got a 503)
CONDITION_FAILURES = "ConditionFailures"  # extra conditions that did not hold
PATCH_LATENCY = "PatchLatency"  # milliseconds a PATCH spent in the library
CONTENTION_HOLD = "ContentionHold"  # milliseconds a read-modify-write held back for writers racing longer
IDEMPOTENT_REPLAYS = "IdempotentReplays"  # keyed writes answered from their record
TRANSACTIONS = "Transactions"  # multi-device transactions written
TRANSACTION_RETRIES = "TransactionRetries"  # transaction attempts cancelled and tried again
TRANSACTION_CONFLICTS = "TransactionConflicts"  # of those, cancelled by DynamoDB's TransactionConflict
OUTCOME_UNKNOWN = "OutcomeUnknown"  # writes whose answer was lost and could not be settled (504)
LEASES_ACQUIRED = "LeasesAcquired"
LEASE_WAIT = "LeaseWait"  # milliseconds an acquired lease waited in the queue
LEASE_BUSY = "LeaseBusy"  # lease requests refused: not acquired within their wait
LEASES_RECLAIMED = "LeasesReclaimed"  # expired queue rows (crashed holders or waiters) deleted
LEASE_HEARTBEATS_LOST = "LeaseHeartbeatsLost"  # heartbeats refused: a holder lost its lease

# Device tokens (POST /devices/{id}/token): issued, and refused because signing was
# throttled (429: KMS's request quota) or unavailable (503).
DEVICE_TOKENS = "DeviceTokens"
SIGNING_THROTTLED = "SigningThrottled"
SIGNING_UNAVAILABLE = "SigningUnavailable"

# Device identity (functions/api/identity.py, tokens.py): assertions refused (401: a bad, expired,
# replayed or unknown credential's assertion, at the token and provisioning routes), devices
# provisioned by an enrollment and provisionings refused (403/409: an enrollment ended or full, an
# id its pattern does not allow, a device that exists), requests refused because the credential
# they came with was revoked (401 credential-revoked), and secrets the sealing key could not open
# or seal (429/503: KMS throttled or failing); credentials revoked (DELETE .../credentials/{id}).
ASSERTIONS_REFUSED = "AssertionsRefused"
PROVISIONINGS = "Provisionings"
PROVISIONINGS_REFUSED = "ProvisioningsRefused"
REVOKED_CREDENTIAL_REQUESTS = "RevokedCredentialRequests"
CREDENTIALS_REVOKED = "CredentialsRevoked"
SEALING_FAILURES = "SealingFailures"

# WebSocket connects (functions/push) refused because the device holds its most connections
# (connectivity.MAX_CONNECTIONS) already: answered 429.
CONNECTIONS_REFUSED = "ConnectionsRefused"
# Connections a connect at the cap forgot: their close never reached the device (a $disconnect API
# Gateway did not deliver, or one storage half took). Only those a device's cap met are seen; two
# connects at the cap at once may both count one.
CONNECTIONS_FORGOTTEN = "ConnectionsForgotten"

# The stream processor (functions/changes): change items written, and how long after the
# write (the stream record's creation) each was written.
CHANGES_RECORDED = "ChangesRecorded"
CHANGE_LAG = "ChangeLag"  # milliseconds
# Versions the processor marked lost: their change failed every try, or DynamoDB refuses it for good.
CHANGES_LOST = "ChangesLost"

# Jobs: executions made final by the stream processor or the runner; runner steps that failed
# (an error the step could not place); executions in progress past their deadline plus the sweep's
# grace, which only a runner that stopped sweeping leaves (the job runner's own alarm).
JOB_EXECUTIONS_FINAL = "JobExecutionsFinal"
JOB_ERRORS = "JobErrors"
JOB_STUCK_EXECUTIONS = "JobStuckExecutions"

# What the API function's DynamoDB requests are billed, in request units (ConsumedCapacity).
READ_UNITS = "ReadUnits"
WRITE_UNITS = "WriteUnits"

COUNT_METRICS = (UPDATES, UPDATE_ATTEMPTS, VERSION_CONFLICTS, RETRIES_EXHAUSTED, CONDITION_FAILURES,
                 IDEMPOTENT_REPLAYS, OUTCOME_UNKNOWN, TRANSACTIONS, TRANSACTION_RETRIES, TRANSACTION_CONFLICTS,
                 LEASES_ACQUIRED, LEASE_BUSY, LEASES_RECLAIMED, LEASE_HEARTBEATS_LOST, CHANGES_RECORDED, CHANGES_LOST,
                 DEVICE_TOKENS, SIGNING_THROTTLED, SIGNING_UNAVAILABLE, CONNECTIONS_REFUSED, CONNECTIONS_FORGOTTEN,
                 ASSERTIONS_REFUSED,
                 PROVISIONINGS, PROVISIONINGS_REFUSED, REVOKED_CREDENTIAL_REQUESTS, SEALING_FAILURES,
                 CREDENTIALS_REVOKED, JOB_EXECUTIONS_FINAL, JOB_ERRORS, JOB_STUCK_EXECUTIONS)
LATENCY_METRICS = (PATCH_LATENCY, CONTENTION_HOLD, LEASE_WAIT, CHANGE_LAG)
CAPACITY_METRICS = (READ_UNITS, WRITE_UNITS)
ALL_METRICS = COUNT_METRICS + LATENCY_METRICS + CAPACITY_METRICS
