"""`make bench` → costs: what a fleet costs a month, from request units measured on DynamoDB
Local, the deployed topology read from the synthesized template, and the handlers' measured
time, beside AWS IoT Device Shadow's bill for the same fleet.

Every request the library, the change processor and the push fan-out send asks for
``ReturnConsumedCapacity=TOTAL`` (``CountingClient``): DynamoDB Local reports capacity as
DynamoDB bills it. Each operation kind runs on devices shaped like the reference fleet's
(about 600 bytes of JSON in 15 leaves), each write followed by what the stream makes of it:
the change item (``ChangeLog.record`` on the item's images before and after) and the push
fan-out to one WebSocket subscriber of the device's ``desired``.

The reference fleet (issue 29): 100,000 devices; each reports 2 changed leaves every 60 s; an
app changes one desired leaf per device per hour, which reaches the device over its WebSocket
subscription, and the device reports it applied; every device holds its connection all month.

Writes bench/out/costs.{json,md,png} (``--out``; ``make bench UPDATE_RESULTS=1``: bench/results/).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
for _name, _value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                      "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
    os.environ.setdefault(_name, _value)

from bench.contention import CountingClient  # noqa: E402
from functions.device_state import (Ack, ChangeLog, DesireOptions, DeviceStateManager, JsonPatch, MergePatch,  # noqa: E402
                                    Operation, dynamodb_client, table)
from functions.device_state.feed.items import SNAPSHOT_EVERY, change_sk  # noqa: E402
from functions.device_state.model.values import item_size  # noqa: E402
from functions.push.delivery import Delivery  # noqa: E402
from functions.push.fanout import changed_since  # noqa: E402
from functions.push.subscriptions import Subscriptions  # noqa: E402
from localdev.dynamodb_local import dynamodb_local  # noqa: E402

OUT = REPO_ROOT / "bench" / "out"
MILLION = 1_000_000
DAYS = 30
HOURS = DAYS * 24
MINUTES = HOURS * 60
SECONDS = MINUTES * 60

# us-east-1 list prices, USD, as published on each page (read 2026-11; the figures issue 29
# states). Volume tiers are left out on both sides: they lower HTTP API requests past 300 M
# a month and MQTT messages past 1 B.
PRICES = {
    "dynamodb_write": (0.625, "per million write request units (1 KB)", "aws.amazon.com/dynamodb/pricing/on-demand"),
    "dynamodb_read": (0.125, "per million read request units (4 KB strongly consistent)",
                      "aws.amazon.com/dynamodb/pricing/on-demand"),
    "dynamodb_storage": (0.25, "per GB-month", "aws.amazon.com/dynamodb/pricing/on-demand"),
    "dynamodb_pitr": (0.20, "per GB-month of table size", "aws.amazon.com/dynamodb/pricing/on-demand"),
    "dynamodb_write_capacity": (0.00065, "per provisioned write capacity unit-hour",
                                "aws.amazon.com/dynamodb/pricing/provisioned"),
    "dynamodb_read_capacity": (0.00013, "per provisioned read capacity unit-hour",
                               "aws.amazon.com/dynamodb/pricing/provisioned"),
    "http_api": (1.00, "per million HTTP API requests", "aws.amazon.com/api-gateway/pricing"),
    "websocket_message": (1.00, "per million WebSocket messages (32 KB)", "aws.amazon.com/api-gateway/pricing"),
    "websocket_minute": (0.25, "per million WebSocket connection-minutes", "aws.amazon.com/api-gateway/pricing"),
    "lambda_request": (0.20, "per million Lambda requests", "aws.amazon.com/lambda/pricing"),
    "lambda_gb_second": (0.0000133334, "per GB-second, arm64", "aws.amazon.com/lambda/pricing"),
    "eventbridge_event": (1.00, "per million custom events (64 KB)", "aws.amazon.com/eventbridge/pricing"),
    "shadow_operation": (1.25, "per million Device Shadow operations (1 KB)", "aws.amazon.com/iot-core/pricing"),
    "mqtt_message": (1.00, "per million MQTT messages (5 KB)", "aws.amazon.com/iot-core/pricing"),
    "iot_connection_minute": (0.08, "per million connection-minutes", "aws.amazon.com/iot-core/pricing"),
}

# The second deployment the bench prices: the same stack with this context (infra/stack.py).
PROVISIONED_CONTEXT = {"capacity": "provisioned"}

DEVICES = 100_000
REPORTS_PER_DEVICE = MINUTES  # one every 60 s
DESIRES_PER_DEVICE = DAYS * 24  # one an hour
REPORTS_PER_DESIRE = REPORTS_PER_DEVICE // DESIRES_PER_DEVICE


def reference_device(index: int) -> tuple[dict, dict]:
    """About 600 bytes of JSON in 15 leaves: state about 250 B in 5 leaves, desired about
    100 B in 3, reported about 250 B in 7 (``test_bench_costs_smoke`` checks the sizes)."""
    state = {"name": f"thermostat {index:06d}, north wing, second floor, conference room 3",
             "model": "TX-4000 revision C, wall mounted, battery backed",
             "firmware": "4.2.17+build.20261101.release-candidate-2",
             "site": "headquarters campus, building B", "installedAt": "2026-01-15T09:30:00Z"}
    desired = {"setpoint": Decimal("21.5"), "mode": "heat-and-cool-automatic", "fan": "auto-low-noise-night-mode"}
    reported = {"setpoint": Decimal("21.5"), "mode": "heat-and-cool-automatic", "fan": "auto-low-noise-night",
                "temperature": Decimal("20.75"), "humidity": 41, "battery": 87,
                "network": "wifi 5 GHz, access point north-2 (second floor east), channel 44, signal good"}
    return state, {"desired": desired, "reported": reported}


class Meter:
    """Request units of everything one operation causes: the request path (the library), the
    change processor (the change item) and the push fan-out, each on its own counter."""

    def __init__(self, client, table_name: str):
        self.client, self.table = client, table_name
        self.service = CountingClient(client)
        self.changes = CountingClient(client)
        self.push = CountingClient(client)
        # Operations a minute apart, as the reference fleet's writes to one device are: a
        # device's write journal keeps its newest 8 entries then (entries younger than a
        # second stay too, up to 16, on a device written faster).
        self.now = time.time()
        self.manager = DeviceStateManager(self.service, table_name, clock=lambda: self.now)
        self.log = ChangeLog(self.changes, table_name)
        subscriptions = Subscriptions(self.push, table_name)
        self.pushed: list[tuple[str, dict]] = []
        self.delivery = Delivery(subscriptions, ChangeLog(self.push, table_name),
                                 lambda connection, message: self.pushed.append((connection, message)))
        self.subscriptions = subscriptions
        self.stream_seconds = 0.0  # the change processor's and the fan-out's time, all records
        self.stream_records = 0

    def state_item(self, device_id: str) -> dict | None:
        return self.client.get_item(TableName=self.table, Key=table.state_key(device_id),
                                    ConsistentRead=True).get("Item")

    def run(self, device_ids: list[str], operation, touched=lambda device_id: [device_id]) -> dict:
        """Runs ``operation(device_id)`` once per device; the stream's work follows each write
        of the devices it ``touched`` (a version that moved). Returns units per operation."""
        counters = (self.service, self.changes, self.push)
        before = [(c.read_units, c.written_units + c.failed_write_units, c.calls) for c in counters]
        pushed_before, changes = len(self.pushed), 0
        for device_id in device_ids:
            olds = {touched_id: self.state_item(touched_id) for touched_id in touched(device_id)}
            self.now += 60
            operation(device_id)
            for touched_id, old in olds.items():
                new = self.state_item(touched_id)
                if new is None or (old is not None and old.get(table.VERSION) == new.get(table.VERSION)):
                    continue
                started = time.perf_counter()
                change = self.log.record(old, new)
                if change is not None:
                    changes += 1
                    self.delivery.fan_out(touched_id, change.version, changed_since(change))
                self.stream_seconds += time.perf_counter() - started
                self.stream_records += 1
        after = [(c.read_units, c.written_units + c.failed_write_units, c.calls) for c in counters]
        n = len(device_ids)
        per = {}
        for name, (r0, w0, c0), (r1, w1, c1) in zip(("service", "changes", "push"), before, after):
            per[f"{name}_read"] = round((r1 - r0) / n, 3)
            per[f"{name}_write"] = round((w1 - w0) / n, 3)
            per[f"{name}_calls"] = round((c1 - c0) / n, 3)
        per["changes"] = round(changes / n, 3)
        per["pushes"] = round((len(self.pushed) - pushed_before) / n, 3)
        return per


def create_reference_device(manager: DeviceStateManager, device_id: str) -> None:
    """``device_id`` ("dev-" and digits) created shaped like the reference fleet's devices."""
    state, sections = reference_device(int(device_id[4:]))
    manager.create(device_id, state, sections=sections)


def reference_hour(meter: Meter, ids: list[str], reports_per_desire: int = REPORTS_PER_DESIRE,
                   device=None, after_reports=lambda ids: None) -> dict:
    """An hour of the reference fleet on the devices ``ids`` (created): request units per
    operation kind. ``device(device_id)``: the manager acting as that device, which sends its
    reports, acks, WebSocket connect and reads of itself (by default one holding no credential).
    ``after_reports(ids)`` runs once the hour's reports are written, before its other writes."""
    device = device or (lambda device_id: meter.manager.as_device(device_id))
    kinds = {}
    for device_id in ids:  # each device follows its own desired, as the reference fleet's do
        meter.subscriptions.open(f"conn-{device_id}", f"device:{device_id}")
        version = meter.manager.get(device_id).version
        meter.subscriptions.subscribe(f"conn-{device_id}", device_id, version, ("desired",))
    step = iter(range(1, 10 ** 9))

    def report(device_id):  # with the device's own credentials: its lastSeen goes in the same request
        device(device_id).update_with_retry(device_id, MergePatch(
            {"temperature": Decimal(80 + next(step) % 7) / 4, "humidity": 40 + next(step) % 9}), section="reported")

    def read_itself(device_id):
        own = device(device_id)
        own.saw(own.get(device_id))

    # An hour of the reference fleet: its reports (the first fill the write journal to its
    # steady state; the last SNAPSHOT_EVERY measured, a whole period of change items, one of
    # them a snapshot), then the hour's desire, which the device's subscription catches up to
    # through the reports.
    measured = min(SNAPSHOT_EVERY, reports_per_desire)
    for _ in range(reports_per_desire - measured):
        meter.run(ids, report)
    kinds["report"] = meter.run(ids * measured, report)
    after_reports(ids)
    kinds["desired write"] = meter.run(ids, lambda d: meter.manager.update_with_retry(
        d, MergePatch({"setpoint": 19 + next(step) % 6}), section="desired"))
    meter.run(ids, lambda d: meter.manager.update_with_retry(d, MergePatch({"bootCount": 0})))  # not measured
    kinds["increment"] = meter.run(ids, lambda d: meter.manager.update_with_retry(
        d, JsonPatch([{"op": "increment", "path": "/bootCount", "value": 1}])))
    kinds["read-modify-write"] = meter.run(ids, lambda d: meter.manager.update_with_retry(
        d, lambda state: {**state, "room": f"room {next(step) % 40}"}))
    kinds["get"] = meter.run(ids, meter.manager.get)
    kinds["list (page of 50)"] = meter.run(ids[:1], lambda d: meter.manager.list_devices(50))
    kinds["lease (acquire + release)"] = meter.run(
        ids, lambda d: meter.manager.lease_queue().release(d, meter.manager.lease_queue().acquire(d, 30).lease_id))
    pairs = list(zip(ids[0::2], ids[1::2]))
    partner = dict(pairs)
    kinds["transaction (2 devices)"] = meter.run([a for a, _ in pairs], lambda d: meter.manager.transact([
        Operation.update(d, MergePatch({"room": "east"})), Operation.update(partner[d], MergePatch({"room": "west"}))]),
        touched=lambda d: [d, partner[d]])
    kinds["feed read (page)"] = meter.run(ids, lambda d: meter.log.read(d, 0))
    # The device loop: a desire with an expiry (read, then write at the version), the device's
    # ack of it, its WebSocket connect and disconnect, and its read of itself a minute after
    # it was last seen (which records it seen).
    kinds["desired write with expiresIn"] = meter.run(ids, lambda d: meter.manager.update_with_retry(
        d, MergePatch({"setpoint": 19 + next(step) % 6}), section="desired", desire=DesireOptions(expires_in=3600)))
    kinds["ack (device)"] = meter.run(ids, lambda d: device(d).acknowledge(d, [Ack(
        "/setpoint", meter.manager.get(d).as_dict(include_metadata=True)["metadata"]["desired"]["setpoint"]["version"],
        400, "out of range")]))
    ends = meter.now + 2 * 3600
    kinds["connect (device's WebSocket)"] = meter.run(ids, lambda d: device(d).connected(d, f"ws-{d}", ends))
    kinds["disconnect"] = meter.run(ids, lambda d: meter.manager.disconnected(d, f"ws-{d}", ends))
    kinds["read by the device (records lastSeen)"] = meter.run(ids, read_itself)
    return kinds


def measure(endpoint: str, devices: int, reports_per_desire: int = REPORTS_PER_DESIRE) -> tuple[dict, dict, dict]:
    """Request units per operation kind, and the state item's bytes at the reference rate."""
    client = dynamodb_client(endpoint)
    name = f"costs-{uuid.uuid4().hex[:8]}"
    table.create_table(client, name)
    meter = Meter(client, name)
    ids = [f"dev-{index:04d}" for index in range(devices)]
    kinds = {"create": meter.run(ids, lambda d: create_reference_device(meter.manager, d))}
    kinds.update(reference_hour(meter, ids, reports_per_desire))
    # A device written at the reference rate keeps the newest 8 journal entries; one written
    # 16 times a second keeps up to 16 (every entry younger than a second).
    sizes = {}
    for label, interval in (("reference rate (1 write / 60 s)", 60.0), ("16 writes / s", 1 / 16)):
        now = [time.time()]
        paced = DeviceStateManager(client, name, clock=lambda: now[0])
        device_id = f"paced-{uuid.uuid4().hex[:6]}"
        state, sections = reference_device(9999)
        paced.create(device_id, state, sections=sections)
        change_bytes = []  # of the last SNAPSHOT_EVERY versions' change items, one of them a snapshot
        for index in range(40):
            now[0] += interval
            old = meter.state_item(device_id)
            paced.update_with_retry(device_id, MergePatch({"temperature": Decimal(80 + index % 7) / 4}), section="reported")
            item = meter.state_item(device_id)
            meter.log.record(old, item)
            change = client.get_item(TableName=name, ConsistentRead=True, Key={
                table.PARTITION_KEY: {"S": device_id}, table.SORT_KEY: {"S": change_sk(int(item[table.VERSION]["N"]))}})
            change_bytes = (change_bytes + [item_size(change["Item"])])[-SNAPSHOT_EVERY:]
        values = {key: item[key] for key in (table.STATE, table.DESIRED, table.REPORTED) if key in item}
        sizes[label] = {"item_bytes": item_size(item), "values_bytes": item_size(values),
                        "bookkeeping_bytes": item_size(item) - item_size(values),
                        "change_item_bytes": round(statistics.mean(change_bytes))}
    timing = {"stream_ms_per_record": round(1000 * meter.stream_seconds / max(meter.stream_records, 1), 2)}
    return kinds, sizes, timing


def handler_milliseconds(endpoint: str, runs: int) -> dict:
    """The API handler's and the authorizer's warm time per request (median of ``runs``), in
    this process with the environment a deployed function has, restored afterwards."""
    saved = dict(os.environ)
    try:
        return _handler_milliseconds(endpoint, runs)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        fresh_configuration()


def fresh_configuration() -> None:
    """As a fresh Lambda would: configuration read from the environment as it is, not kept
    from before (the smoke test runs beside other tests in one process)."""
    from functions import config
    from functions.api import common
    from functions.auth import credentials as auth_credentials
    from functions.auth import device_tokens, sealing

    for cached in (config.api_config, auth_credentials.load_auth_config, common.manager,
                   device_tokens.device_token_issuer, sealing.sealer):
        cached.cache_clear()


def _handler_milliseconds(endpoint: str, runs: int) -> dict:
    from bench import credentials
    from tests.unit.test_authorizer import request_event

    name = f"timing-{uuid.uuid4().hex[:8]}"
    os.environ.update({"TABLE_NAME": name, "DYNAMODB_ENDPOINT": endpoint, "POWERTOOLS_TRACE_DISABLED": "true",
                       "POWERTOOLS_METRICS_DISABLED": "true", "POWERTOOLS_LOG_LEVEL": "ERROR",
                       **credentials.server_environment()})
    client = dynamodb_client(endpoint)
    table.create_table(client, name)
    state, sections = reference_device(1)
    DeviceStateManager(client, name).create("dev-timing", state, sections=sections)
    from functions.api import handler
    from functions.auth import authorizer
    from localdev.apigw import LambdaContext, make_event

    fresh_configuration()

    # The device's report as the HTTP API hands it over: the function verifies the token itself.
    # The authorizer runs on the device's WebSocket connects only.
    token = credentials.ISSUER.token(device="dev-timing")
    api, auth = [], []
    for index in range(runs + 1):
        body = json.dumps({"temperature": 20 + index % 7, "humidity": 40 + index % 5})
        event = make_event("PATCH", "/devices/dev-timing/reported", {
            "Content-Type": "application/merge-patch+json", "Authorization": f"Bearer {token}"}, body)
        started = time.perf_counter()
        response = handler.lambda_handler(event, LambdaContext())
        api.append((time.perf_counter() - started) * 1000)
        assert response["statusCode"] == 200, response
        connect = request_event("GET", "/ws", {"Authorization": f"Bearer {token}"})
        started = time.perf_counter()
        authorizer.lambda_handler(connect, None)
        auth.append((time.perf_counter() - started) * 1000)
    return {"api_report_ms": round(statistics.median(api[1:]), 2),
            "authorizer_ms": round(statistics.median(auth[1:]), 2)}


def topology(context: dict | None = None) -> dict:
    """What the bill depends on in the deployed stack, read from the template synthesized with
    ``context`` (as ``-c name=value`` gives it to a deploy)."""
    os.environ["PATH"] = f"{REPO_ROOT / 'node_modules' / '.bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    import aws_cdk as cdk
    from aws_cdk.assertions import Template

    from infra.stack import DeviceStateStack

    app = cdk.App(context={"aws:cdk:bundling-stacks": [], **(context or {})})
    template_resources = Template.from_stack(DeviceStateStack(app, "DeviceStateStack")).to_json()["Resources"]
    resources = template_resources.values()

    def function(handler_name: str) -> dict:
        return next(r["Properties"] for r in resources if r["Type"] == "AWS::Lambda::Function"
                    and r["Properties"].get("Handler") == handler_name)

    [http_api] = [logical for logical, r in template_resources.items() if r["Type"] == "AWS::ApiGatewayV2::Api"
                  and r["Properties"]["ProtocolType"] == "HTTP"]
    mappings = [r["Properties"] for r in resources if r["Type"] == "AWS::Lambda::EventSourceMapping"]
    table = next(r["Properties"] for r in resources if r["Type"] == "AWS::DynamoDB::Table")
    tracking = [r["Properties"]["TargetTrackingScalingPolicyConfiguration"] for r in resources
                if r["Type"] == "AWS::ApplicationAutoScaling::ScalingPolicy"]
    return {
        "api": "HTTP",
        # an authorizer in front of the HTTP routes would run on every request (devices calling
        # with certificates send no header to cache its answer by)
        "authorizer_on_requests": any(r["Type"] == "AWS::ApiGatewayV2::Route" and r["Properties"]["ApiId"] == {
            "Ref": http_api} and r["Properties"].get("AuthorizationType", "NONE") != "NONE" for r in resources),
        "api_memory_mb": function("functions.api.handler.lambda_handler")["MemorySize"],
        "authorizer_memory_mb": function("functions.auth.authorizer.lambda_handler")["MemorySize"],
        "changes_memory_mb": function("functions.changes.handler.lambda_handler")["MemorySize"],
        "fanout_memory_mb": function("functions.push.fanout.lambda_handler")["MemorySize"],
        "stream_batch_sizes": sorted(m.get("BatchSize", 100) for m in mappings),
        "eventbridge": any(r["Type"] == "AWS::Events::EventBus" for r in resources),
        "websocket": any(r["Type"] == "AWS::ApiGatewayV2::Api" for r in resources),
        "pitr": any(r["Type"] == "AWS::DynamoDB::Table" and r["Properties"].get(
            "PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled") for r in resources),
        "billing_mode": table.get("BillingMode", "PROVISIONED"),  # CloudFormation's default, which CDK omits
        # the lowest target of the table's and its indexes' policies (it provisions the most)
        "target_utilization_percent": min((policy["TargetValue"] for policy in tracking if policy[
            "PredefinedMetricSpecification"]["PredefinedMetricType"].startswith("DynamoDB")), default=None),
    }


def price(name: str, quantity: float) -> float:
    per_unit = ("dynamodb_storage", "dynamodb_pitr", "dynamodb_write_capacity", "dynamodb_read_capacity")
    return PRICES[name][0] * quantity / (1 if name in per_unit else MILLION)


def dynamodb_cost(kind: str, units: float, shape: dict) -> float:
    """A month's ``kind`` ("read" or "write") request units, on demand or on provisioned capacity."""
    if shape["billing_mode"] == "PAY_PER_REQUEST":
        return price(f"dynamodb_{kind}", units)
    # The load is steady (the reference fleet's is), so auto scaling holds the capacity at the
    # month's mean rate over the target utilization all month; a load with peaks holds more.
    capacity = units / SECONDS / (shape["target_utilization_percent"] / 100)
    return price(f"dynamodb_{kind}_capacity", capacity * HOURS)


def lambda_cost(invocations: float, milliseconds: float, memory_mb: int) -> float:
    billed = math.ceil(milliseconds)  # Lambda bills by the millisecond, rounded up
    return price("lambda_request", invocations) + PRICES["lambda_gb_second"][0] * invocations * billed / 1000 \
        * memory_mb / 1024


def bills(kinds: dict, timing: dict, shape: dict, sizes: dict) -> dict:
    """The reference fleet's month, by component, this service beside Device Shadow."""
    reports = DEVICES * REPORTS_PER_DEVICE
    desires = DEVICES * DESIRES_PER_DEVICE
    applied = desires  # the device reports each desire applied
    writes = reports + desires + applied
    requests = writes
    report, desired = kinds["report"], kinds["desired write"]
    write_units = (reports + applied) * (report["service_write"] + report["changes_write"] + report["push_write"]) \
        + desires * (desired["service_write"] + desired["changes_write"] + desired["push_write"])
    read_units = (reports + applied) * (report["service_read"] + report["changes_read"] + report["push_read"]) \
        + desires * (desired["service_read"] + desired["changes_read"] + desired["push_read"])
    reconnects = DEVICES * DAYS * 12
    connectivity_write = sum(kinds[kind]["service_write"] for kind in ("connect (device's WebSocket)", "disconnect"))
    connectivity_read = sum(kinds[kind]["service_read"] for kind in ("connect (device's WebSocket)", "disconnect"))
    records = writes + 2 * reconnects  # stream records: every write, every connect and disconnect
    batch = min(shape["stream_batch_sizes"]) if shape["stream_batch_sizes"] else 100
    # Every write's change item lives for the change retention (7 days): the table holds a
    # week of them beside the state items.
    change_bytes = sizes["reference rate (1 write / 60 s)"]["change_item_bytes"]
    stored_gb = (DEVICES * sizes["reference rate (1 write / 60 s)"]["item_bytes"]
                 + writes / DAYS * 7 * change_bytes) / 1024 ** 3
    ours = {
        "API Gateway requests": price("http_api", requests),
        "API function": lambda_cost(requests, timing["api_report_ms"], shape["api_memory_mb"]),
        # the authorizer runs on every WebSocket connect (and on every request, were it in front of them)
        "authorizer": lambda_cost(reconnects + (requests if shape["authorizer_on_requests"] else 0),
                                  timing["authorizer_ms"], shape["authorizer_memory_mb"]),
        "DynamoDB writes": dynamodb_cost("write", write_units, shape),
        "DynamoDB reads": dynamodb_cost("read", read_units, shape),
        "DynamoDB storage and backups": price("dynamodb_storage", stored_gb)
        + (price("dynamodb_pitr", stored_gb) if shape["pitr"] else 0),
        # Both stream consumers get full batches at the fleet's rate; their measured time per
        # record (change item, then fan-out) is split evenly between them.
        # a connect and a disconnect are stream records too (no change: an event of their own)
        "stream functions (changes, fan-out)": lambda_cost(records / batch, timing["stream_ms_per_record"] / 2 * batch,
                                                           shape["changes_memory_mb"])
        + lambda_cost(records / batch, timing["stream_ms_per_record"] / 2 * batch, shape["fanout_memory_mb"]),
        "EventBridge events": price("eventbridge_event", records) if shape["eventbridge"] else 0.0,
        # API Gateway closes a WebSocket connection after 2 hours: each device connects again
        # (and records its connectivity) 12 times a day
        "device connectivity (DynamoDB)": dynamodb_cost("write", reconnects * connectivity_write, shape)
        + dynamodb_cost("read", reconnects * connectivity_read, shape),
        "WebSocket messages": price("websocket_message", desires),
        "WebSocket connection-minutes": price("websocket_minute", DEVICES * MINUTES),
    }
    shadow = {
        "MQTT messages": price("mqtt_message", reports + applied + desires),  # publishes, and each delta delivered
        "shadow operations": price("shadow_operation", reports + applied + desires),
        "connection-minutes": price("iot_connection_minute", DEVICES * MINUTES),
    }
    return {"this service": {k: round(v, 2) for k, v in ours.items()},
            "Device Shadow": {k: round(v, 2) for k, v in shadow.items()},
            "fleet": {"devices": DEVICES, "reports": reports, "desires": desires, "applied reports": applied,
                      "reconnects": reconnects,
                      "write units": round(write_units), "read units": round(read_units),
                      "stored GB": round(stored_gb, 1)}}


def markdown(kinds: dict, sizes: dict, timing: dict, shape: dict, bill: dict, provisioned: dict) -> str:
    """``provisioned``: the topology and bill of the stack deployed with PROVISIONED_CONTEXT."""
    lines = ["# What a fleet costs: request units measured, the month priced", "",
             "From `bench/costs.py` (`make bench`). Request units per operation, measured on DynamoDB Local "
             "with `ReturnConsumedCapacity`, split by who sends them: the request path (service), the change "
             "processor (changes) and the push fan-out (push, one subscriber of the device's desired).", "",
             "| operation | service read | service write | changes read | changes write | push read | push write "
             "| service calls |", "|---|---|---|---|---|---|---|---|"]
    for kind, units in kinds.items():
        lines.append(f"| {kind} | {units['service_read']} | {units['service_write']} | {units['changes_read']} | "
                     f"{units['changes_write']} | {units['push_read']} | {units['push_write']} | "
                     f"{units['service_calls']} |")
    lines += ["", "| state item, written at | bytes | values | bookkeeping | its change items (mean of a snapshot period) |", "|---|---|---|---|---|"]
    lines += [f"| {label} | {s['item_bytes']} | {s['values_bytes']} | {s['bookkeeping_bytes']} | "
              f"{s['change_item_bytes']} |" for label, s in sizes.items()]
    changed = {key: value for key, value in provisioned["topology"].items() if shape.get(key) != value}
    lines += ["", f"Handlers (warm, median, on this machine against DynamoDB Local): API report "
              f"{timing['api_report_ms']} ms, authorizer {timing['authorizer_ms']} ms, change processor and fan-out "
              f"{timing['stream_ms_per_record']} ms per record. Topology from the template: "
              f"{json.dumps(shape)}; with `{context_arguments(PROVISIONED_CONTEXT)}`: "
              f"{json.dumps(changed)}.", "",
              "## The reference fleet's month (USD)", "",
              f"| this service | $ as deployed | $ with `{context_arguments(PROVISIONED_CONTEXT)}` |",
              "|---|---|---|"]
    ours, theirs = bill["this service"], bill["Device Shadow"]
    ours_provisioned = provisioned["bill"]["this service"]
    lines += [f"| {k} | {v:,.2f} | {ours_provisioned[k]:,.2f} |" for k, v in ours.items()]
    lines += [f"| **total** | **{sum(ours.values()):,.2f}** | **{sum(ours_provisioned.values()):,.2f}** |"]
    lines += ["", "| Device Shadow | $ |", "|---|---|"]
    lines += [f"| {k} | {v:,.2f} |" for k, v in theirs.items()] + [f"| **total** | **{sum(theirs.values()):,.2f}** |"]
    lines += ["", "Prices (us-east-1, read 2026-11):", ""]
    lines += [f"- {name}: ${value} {unit} ({source})" for name, (value, unit, source) in PRICES.items()]
    return "\n".join(lines) + "\n"


def context_arguments(context: dict) -> str:
    return " ".join(f"-c {name}={value}" for name, value in context.items())


def chart(bill: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5))
    colors: dict[str, tuple] = {}  # one per component, the same in every bar that has it
    for position, parts in enumerate(bill.values()):
        bottom = 0.0
        for component, dollars in parts.items():
            first = component not in colors
            colors.setdefault(component, plt.get_cmap("tab20")(len(colors) % 20))
            axis.bar(position, dollars, bottom=bottom, color=colors[component],
                     label=component if first else None)
            bottom += dollars
    axis.set_xticks(range(len(bill)), list(bill))
    axis.set_ylabel("USD per month, 100,000 devices")
    axis.legend(fontsize=6, loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=20, help="devices each operation kind runs on")
    parser.add_argument("--timing-runs", type=int, default=50)
    parser.add_argument("--reports-per-desire", type=int, default=REPORTS_PER_DESIRE,
                        help="reports before each measured desire (the reference fleet's hour)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--endpoint", help="a running DynamoDB Local (default: one started for the run)")
    args = parser.parse_args(argv)
    with dynamodb_local(args.endpoint) as dynamodb:
        kinds, sizes, timing = measure(dynamodb.endpoint, args.devices, args.reports_per_desire)
        timing.update(handler_milliseconds(dynamodb.endpoint, args.timing_runs))
    shape = topology()
    bill = bills(kinds, timing, shape, sizes)
    provisioned_shape = topology(PROVISIONED_CONTEXT)
    provisioned = {"context": PROVISIONED_CONTEXT, "topology": provisioned_shape,
                   "bill": bills(kinds, timing, provisioned_shape, sizes)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "costs.json").write_text(json.dumps({"operations": kinds, "item_sizes": sizes, "handlers": timing,
                                                "topology": shape, "bill": bill,
                                                "provisioned capacity": provisioned,
                                                "prices": {k: list(v) for k, v in PRICES.items()}}, indent=2))
    (out / "costs.md").write_text(markdown(kinds, sizes, timing, shape, bill, provisioned))
    chart({"this service": bill["this service"],
           "this service, provisioned": provisioned["bill"]["this service"],
           "Device Shadow": bill["Device Shadow"]}, out / "costs.png")
    ours, theirs = sum(bill["this service"].values()), sum(bill["Device Shadow"].values())
    ours_provisioned = sum(provisioned["bill"]["this service"].values())
    for kind, units in kinds.items():
        print(f"{kind:28s} {json.dumps(units)}")
    print(f"the reference fleet's month: this service ${ours:,.0f} ({ours / theirs:.2f}x), with "
          f"{context_arguments(PROVISIONED_CONTEXT)} ${ours_provisioned:,.0f} "
          f"({ours_provisioned / theirs:.2f}x), "
          f"Device Shadow ${theirs:,.0f}; wrote {out}/costs.json, costs.md, costs.png")
    return json.loads((out / "costs.json").read_text())


if __name__ == "__main__":
    main()
