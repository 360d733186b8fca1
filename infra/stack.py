"""The device-state stack: table, API with its functions, change feed, push, monitoring."""

from __future__ import annotations

import math

from aws_cdk import Stack
from constructs import Construct

from functions.device_state import DEFAULT_RETENTION_SECONDS
from functions.device_state import DEFAULT_TOMBSTONE_SECONDS
from functions.auth.credentials import AUTH_AUDIENCE
from functions.config import MAX_RETENTION_SECONDS, MIN_RETENTION_SECONDS, tombstone_seconds
from functions.device_state import FleetIndex, FleetIndexError

from .api import DeviceApi, DeviceDomain
from .auth import CallerIdentity
from .changes import ChangeFeed
from .console import Console
from .device_tokens import DeviceTokens
from .identity import Sealing
from .monitoring import Monitoring
from .push import Push
from .jobs import JobRunner
from .reindex import Reindex
from .table import DevicesTable, ProvisionedCapacity

# Context values (cdk.json holds the defaults; `-c name=value` overrides).
CONTEXT_DEFAULTS = {
    "throwaway": False,  # true: no deletion protection, table destroyed with the stack (dev stacks)
    "throttleRateLimit": 100,
    "throttleBurstLimit": 200,
    "alarmEmail": "",
    "requireIfMatch": False,
    # Concurrent executions reserved for (and capped at) the API function. A lease request
    # may hold an execution for up to 25 s, so without a cap the stage throttle (100/s) could
    # hold ~2,500 executions and starve every other function in the account (default
    # limit 1,000). "none" leaves the function unreserved and uncapped.
    "reservedConcurrency": 100,
    # The same for the waiting function, which serves only the routes that wait (long-polls of
    # the feed and the delta, lease requests): 50 clients may wait at once, the 51st is refused,
    # and the API function's 100 stay for everything else. "none" leaves it unreserved and uncapped.
    "waitingReservedConcurrency": 50,
    "changeRetentionSeconds": DEFAULT_RETENTION_SECONDS,  # how long the change feed and history are kept
    "publishEvents": False,  # true: a DeviceStateChanged event on EventBridge per change ($1 per million)
    "tombstoneSeconds": DEFAULT_TOMBSTONE_SECONDS,  # how long a deleted device keeps its last version
    # Lambda SnapStart for both functions (published versions behind the "live" alias); false
    # runs init on every cold start instead and saves the snapshot's caching and restore charges.
    "snapStart": True,
    # A custom domain with mutual TLS for devices calling with a client certificate: its name,
    # its ACM certificate's ARN and the s3:// URI of the CA bundle client certificates chain to.
    "deviceDomainName": "",
    "certificateArn": "",
    "truststoreUri": "",
    # The Cognito domain's prefix (<prefix>.auth.<region>.amazoncognito.com); empty: the stack
    # name and the account.
    "authDomainPrefix": "",
    # Your own token issuer instead of Cognito (no user pool is made): its iss, the audience its
    # tokens name, and its JWKS file (read at synth, a path in the repository).
    "authIssuer": "",
    "authAudience": "",
    "authJwksFile": "",
    # The fleet index: the device fields that can be queried, as FLEET_INDEX declares them
    # (path:type,path:type, e.g. reported/firmware:string,reported/online:boolean); each gets its
    # own index on the table, and any field makes the reindex function. Empty: no field.
    # CloudFormation adds (or removes) one index per deploy: declare one new field at a time.
    "fleetIndex": "",
    # The table's capacity: "on-demand" (billed per request) or "provisioned" (billed per
    # capacity unit-hour, auto scaled to 70 % utilization between the bounds below, on the table
    # and each fleet index alike; cheaper for a steady load, see docs/costs.md). The bounds apply
    # only to "provisioned"; 40,000 is DynamoDB's default per-table quota.
    "capacity": "on-demand",
    "minReadCapacity": 5,
    "maxReadCapacity": 40000,
    "minWriteCapacity": 5,
    "maxWriteCapacity": 40000,
    # Device tokens (POST /devices/{id}/token): their lifetime in seconds, the stated maximum that
    # lifetime may reach (raise it explicitly for longer tokens, up to 43200), and how long after
    # its last certificate authentication a device may renew its token with a token.
    "deviceTokenSeconds": 3600,
    "deviceTokenMaxSeconds": 3600,
    "deviceTokenRenewalSeconds": 86400,
    # true: every device must register its certificates (POST /devices/{id}/credentials); a client
    # certificate of the trusted CA that its device never registered then opens nothing. false: a
    # device that never registered one is opened by any certificate of the CA naming it.
    "requireRegisteredCredentials": False,
    # The browser console (infra/console.py): its files behind CloudFront, CORS on the HTTP API for
    # its origin, and with Cognito an app client of its own. false: none of it.
    "console": True,
    # The key that seals listings' cursors: a secret generated at deploy. The next number replaces
    # it (cursors issued before are then refused, and their clients start their listings again).
    "cursorKeyGeneration": 1,
}


def context(scope: Construct, name: str):
    value = scope.node.try_get_context(name)
    return CONTEXT_DEFAULTS[name] if value is None else value


def _flag(scope: Construct, name: str) -> bool:
    """A true/false context value (``-c name=true``); anything else stops the synth, naming it:
    a ``yes`` read as false would turn a default-on flag off, or a security flag silently off."""
    value = context(scope, name)
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ValueError(f"context {name}: {value!r} is neither true nor false")


def _number(scope: Construct, name: str, kind=int, minimum: float = 1, optional: bool = False):
    """A number from context, at least ``minimum`` (``-c`` gives a string); ``optional``: ``none``
    (or empty) is None. Anything else stops the synth, naming the value (a reserved concurrency
    of 0 would throttle every request; a bare ``could not convert`` names no context)."""
    value = context(scope, name)
    if optional and str(value).lower() in ("none", ""):
        return None
    try:
        number = None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = None
    if number is not None and kind is int:
        number = int(number) if number.is_integer() else None  # 1.5 is no whole number (int() would make it 1)
    if number is None or not minimum <= number < math.inf:
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"context {name}: {value!r} is not {what} of at least {minimum:g}"
                         + (" (or none)" if optional else ""))
    return number


def _retention(value) -> int:
    """changeRetentionSeconds, within what every function takes (a function refuses any other at its
    first request): refused at the synth, not by every request of the deployed service."""
    seconds = int(value) if str(value).isdecimal() else -1
    if not MIN_RETENTION_SECONDS <= seconds <= MAX_RETENTION_SECONDS:
        raise ValueError(f"context changeRetentionSeconds: {value!r} is not {MIN_RETENTION_SECONDS} to "
                         f"{MAX_RETENTION_SECONDS} seconds")
    return seconds


def _generation(value) -> int:
    """A whole number from context (``-c`` gives a string)."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def _fleet_index(value) -> FleetIndex:
    """The context's declaration, parsed as the functions parse FLEET_INDEX: synthesis stops
    on one they would refuse."""
    try:
        return FleetIndex.parse(str(value or ""))
    except FleetIndexError as error:
        raise ValueError(f"context fleetIndex: {error}") from None


def _capacity(scope: Construct) -> ProvisionedCapacity | None:
    """None on demand; with capacity=provisioned, the auto scaling bounds."""
    mode = context(scope, "capacity")
    if mode not in ("on-demand", "provisioned"):
        raise ValueError(f"context capacity: {mode!r} is neither on-demand nor provisioned")
    if mode == "on-demand":
        return None
    units = {}
    for name in ("minReadCapacity", "maxReadCapacity", "minWriteCapacity", "maxWriteCapacity"):
        value = context(scope, name)
        if isinstance(value, bool) or not str(value).isdigit() or int(value) < 1:
            raise ValueError(f"context {name}: {value!r} is not a whole number of capacity units "
                             "of at least 1")
        units[name] = int(value)
    for low, high in (("minReadCapacity", "maxReadCapacity"), ("minWriteCapacity", "maxWriteCapacity")):
        if units[high] < units[low]:
            raise ValueError(f"context {high} ({units[high]}) is below {low} ({units[low]})")
    return ProvisionedCapacity(min_read=units["minReadCapacity"], max_read=units["maxReadCapacity"],
                               min_write=units["minWriteCapacity"], max_write=units["maxWriteCapacity"])


class DeviceStateStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, **kwargs):
        super().__init__(scope, construct_id, **kwargs)
        fleet_index = _fleet_index(context(self, "fleetIndex"))
        self.devices = DevicesTable(self, "Devices", throwaway=_flag(self, "throwaway"),
                                    fleet_index=fleet_index, capacity=_capacity(self))
        self.identity = CallerIdentity(
            self, "Callers", throwaway=_flag(self, "throwaway"),
            domain_prefix=context(self, "authDomainPrefix"), issuer=context(self, "authIssuer"),
            audience=context(self, "authAudience"), jwks_file=context(self, "authJwksFile"))
        self.device_tokens = DeviceTokens(
            self, "DeviceTokens", throwaway=_flag(self, "throwaway"),
            lifetime_seconds=_number(self, "deviceTokenSeconds"),
            max_seconds=_number(self, "deviceTokenMaxSeconds"),
            renewal_seconds=_number(self, "deviceTokenRenewalSeconds"))
        # Devices' secrets and enrollments' group keys, sealed by the API function alone.
        self.sealing = Sealing(self, "Sealing", throwaway=_flag(self, "throwaway"))
        self.console = Console(self, "Console", user_pool=self.identity.user_pool, domain=self.identity.domain,
                               oauth_scopes=self.identity.oauth_scopes) if _flag(self, "console") else None
        # Every function that authenticates callers trusts both issuers; only the API function signs.
        auth_environment = {**self.identity.environment, **self.device_tokens.verification_environment}
        if self.console is not None and self.console.client is not None:  # the console's users' tokens name its client
            audiences = f"{auth_environment[AUTH_AUDIENCE]},{self.console.client.user_pool_client_id}"
            auth_environment[AUTH_AUDIENCE] = audiences
        require_registered = _flag(self, "requireRegisteredCredentials")
        retention = _retention(context(self, "changeRetentionSeconds"))
        tombstone = tombstone_seconds(context(self, "tombstoneSeconds"), retention, "context tombstoneSeconds")
        domain_name = context(self, "deviceDomainName")
        self.api = DeviceApi(
            self, "DeviceApi",
            table=self.devices.table,
            throttle_rate=_number(self, "throttleRateLimit", float, minimum=0.001),
            throttle_burst=_number(self, "throttleBurstLimit"),
            require_if_match=_flag(self, "requireIfMatch"),
            reserved_concurrency=_number(self, "reservedConcurrency", optional=True),
            waiting_reserved_concurrency=_number(self, "waitingReservedConcurrency", optional=True),
            change_retention_seconds=retention,
            tombstone_seconds=tombstone,
            snap_start=_flag(self, "snapStart"),
            auth_environment=auth_environment,
            token_environment={**self.device_tokens.signing_environment, **self.sealing.environment},
            require_registered_credentials=require_registered,
            device_domain=DeviceDomain(domain_name, context(self, "certificateArn"),
                                       context(self, "truststoreUri")) if domain_name else None,
            fleet_index=fleet_index,
            cursor_key_generation=_generation(context(self, "cursorKeyGeneration")),
        )
        self.device_tokens.grant_sign(self.api.function)
        self.sealing.grant_seal(self.api.function)
        self.changes = ChangeFeed(self, "ChangeFeed", table=self.devices.table, code=self.api.code,
                                  layer=self.api.layer,
                                  retention_seconds=retention,
                                  snap_start=_flag(self, "snapStart"),
                                  publish_events=_flag(self, "publishEvents"))
        self.push = Push(self, "Push", table=self.devices.table, code=self.api.code, layer=self.api.layer,
                         authorizer=self.api.authorizer_handler, auth_environment=auth_environment,
                         retention_seconds=retention,
                         throttle_rate=_number(self, "throttleRateLimit", float, minimum=0.001),
                         throttle_burst=_number(self, "throttleBurstLimit"),
                         snap_start=_flag(self, "snapStart"), fleet_index=fleet_index,
                         require_registered_credentials=require_registered)
        if self.console is not None:
            self.console.publish(http_api=self.api.api, api_url=self.api.stage.url, websocket_url=self.push.stage.url,
                                 fleet_index=fleet_index)
        # The fleet index's backfill, for fields declared on a table that already holds devices.
        self.reindex = Reindex(
            self, "Reindex", table=self.devices.table, code=self.api.code, layer=self.api.layer,
            fleet_index=fleet_index, retention_seconds=retention,
        ) if fleet_index else None
        # Jobs: the runner, started by the API function and woken by its schedule (infra/jobs.py).
        self.jobs = JobRunner(self, "Jobs", table=self.devices.table, code=self.api.code, layer=self.api.layer,
                              fleet_index=fleet_index, cursor_key=self.api.cursor_key,
                              retention_seconds=retention)
        self.jobs.let_start(self.api.function, self.api.waiting_function)
        self.monitoring = Monitoring(
            self, "Monitoring", table=self.devices.table, function=self.api.function, api=self.api.api,
            alarm_email=context(self, "alarmEmail") or None, change_feed=self.changes,
            authorizer=self.api.authorizer_function, waiting_function=self.api.waiting_function,
            push=self.push, reindex=self.reindex.function if self.reindex else None, jobs=self.jobs.function)
