"""`make bench`: contention on one hot device, measured side by side in one run on
DynamoDB Local, plus the cold start of the Lambda handler.

Strategies: naive (read, unconditional put: the control), seed (the textbook loop: read,
conditional write, re-read on conflict, fixed retries, no backoff), library
(DeviceStateManager.update_with_retry as shipped, the writers sharing one manager), apart
(the same with a manager per writer, as writers in separate processes or Lambdas have) and
api (HTTP PATCHes through the local server); when asked, racing (apart with no contention
marks, so no newcomer holds back: the control of ``contention``) and tuned (apart with
another backoff). Contending read-modify-writes race under the version check with jittered
backoff, newcomers holding back on a device that a long race marked. Workloads: increment (+1 per update) and rmw (bump a
counter and append the writer's id to a bounded history: a result that depends on the
state read).

Every request the library sends asks for ``ReturnConsumedCapacity=TOTAL`` (``CountingClient``)
and the units DynamoDB reports are summed. A failed conditional write is billed too, but
DynamoDB Local's ConditionalCheckFailedException (and TransactionCanceledException) carries
no ConsumedCapacity, so the bench charges it as DynamoDB bills it: the existing item's size
in 1 KB write units, at least one (the item comes back with ALL_OLD; a write that did not
ask for it is charged the size last seen of that key).

Writes bench/out/latest.{json,md,png} (untracked; `make bench UPDATE_RESULTS=1` writes the
committed reference results in bench/results/ instead) and prints the headline ratios last. Figures
are compared within one run only (ratios), never against fixed numbers of seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
for _name, _value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                      "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
    os.environ.setdefault(_name, _value)

from botocore.exceptions import ClientError  # noqa: E402

from functions.device_state import (Backoff, DeviceStateManager, JsonPatch, RetriesExhausted,  # noqa: E402
                                    UpdateObserver)
from functions.device_state import table  # noqa: E402
from functions.device_state.item import contention  # noqa: E402
from functions.device_state.client import dynamodb_client  # noqa: E402
from functions.device_state.model.values import from_attribute, item_size, to_attribute  # noqa: E402
from bench import outcomes  # noqa: E402
from localdev.dynamodb_local import dynamodb_local, free_port  # noqa: E402
from bench import credentials  # noqa: E402

OUT = REPO_ROOT / "bench" / "out"  # untracked; --out bench/results updates the reference results
HISTORY = 10
SEED_RETRIES = 10
# "racing" (apart with no contention marks: nothing orders the racers) and "tuned" only when asked
STRATEGIES = ("naive", "seed", "library", "apart", "api", "racing", "tuned")
DEFAULT_STRATEGIES = ("naive", "seed", "library", "apart", "api")
WORKLOADS = ("increment", "rmw")


# The data-plane operations that take ReturnConsumedCapacity, and which of them read.
READS = frozenset({"get_item", "query", "scan", "batch_get_item", "transact_get_items"})
WRITES = frozenset({"put_item", "update_item", "delete_item", "batch_write_item", "transact_write_items"})


def write_units(item: dict | None) -> int:
    """Write units of a write DynamoDB refused on its condition: the existing item's size in
    1 KB units, at least one."""
    return max(1, math.ceil(item_size(item) / 1024)) if item else 1


class CountingClient:
    """Counts DynamoDB calls, failed conditional writes, and request units: every data
    request asks for ReturnConsumedCapacity=TOTAL; failed conditional writes, whose error
    DynamoDB Local sends without ConsumedCapacity, are charged by ``write_units``."""

    def __init__(self, client):
        self._client = client
        self.calls = 0
        self.failed_conditions = 0
        self.read_units = 0.0
        self.written_units = 0.0  # what DynamoDB reported for the writes that applied
        self.failed_write_units = 0.0  # charged by the bench for writes refused on their condition
        self._sizes: dict[str, dict] = {}  # the item last read of each key, for a refusal without ALL_OLD
        self._lock = threading.Lock()

    @property
    def request_units(self) -> float:
        return self.read_units + self.written_units + self.failed_write_units

    def __getattr__(self, name):
        attribute = getattr(self._client, name)
        if not callable(attribute) or name.startswith("_") or name in ("exceptions", "meta", "get_waiter"):
            return attribute

        def call(**kwargs):
            if name in READS or name in WRITES:
                kwargs = {**kwargs, "ReturnConsumedCapacity": "TOTAL"}
            with self._lock:
                self.calls += 1
            try:
                response = attribute(**kwargs)
            except ClientError as error:
                code = error.response["Error"]["Code"]
                if code in ("ConditionalCheckFailedException", "TransactionCanceledException"):
                    with self._lock:
                        self.failed_conditions += 1
                        self.failed_write_units += self._refused_units(name, kwargs, error.response)
                raise
            units = response.get("ConsumedCapacity")
            units = sum(entry.get("CapacityUnits", 0)
                        for entry in (units if isinstance(units, list) else [units]) if entry)
            with self._lock:
                if name in READS:
                    self.read_units += units
                    if "Item" in response:
                        self._sizes[json.dumps(kwargs.get("Key"), sort_keys=True)] = response["Item"]
                else:
                    self.written_units += units
            return response

        return call

    def _refused_units(self, name: str, request: dict, response: dict) -> int:
        if name == "transact_write_items":  # each action at its item's units, twice (transactional)
            actions = request.get("TransactItems", [])
            reasons = response.get("CancellationReasons") or [{}] * len(actions)
            return sum(2 * write_units(reason.get("Item")
                                       or self._seen(next(iter(action.values())).get("Key")))
                       for action, reason in zip(actions, reasons))
        return write_units(response.get("Item") or self._seen(request.get("Key")))

    def _seen(self, key: dict | None) -> dict | None:
        return self._sizes.get(json.dumps(key, sort_keys=True))


class EqualJitter(Backoff):
    """A candidate backoff: attempt n sleeps U(d/2, d), d = min(cap, base * 2^(n-1))."""

    def delay(self, attempt, rng):
        ceiling = min(self.cap_seconds, self.base_seconds * 2 ** (attempt - 1))
        return rng.uniform(ceiling / 2, ceiling)


class Attempts(UpdateObserver):
    def __init__(self):
        self.per_update: list[int] = []
        self._lock = threading.Lock()

    def succeeded(self, device_id, attempts, elapsed):
        with self._lock:
            self.per_update.append(attempts)


@contextlib.contextmanager
def marks_off():
    """No write marks a device as contended while inside (this process's writers only), so
    none holds back: the racers of the "racing" strategy."""
    mark_after = contention.MARK_AFTER_SECONDS
    contention.MARK_AFTER_SECONDS = math.inf
    try:
        yield
    finally:
        contention.MARK_AFTER_SECONDS = mark_after


def rmw_state(state: dict, writer: str) -> dict:
    state["n"] += 1
    state["history"] = (state["history"] + [writer])[-HISTORY:]
    return state


@dataclass
class Cell:
    workload: str
    strategy: str
    writers: int
    updates: int
    succeeded: int
    lost_updates: int
    seconds: float
    goodput: float
    success_rate: float
    calls_per_update: float | None
    failed_conditions_per_update: float | None
    request_units_per_update: float | None  # read + write units, failed conditional writes included
    read_units_per_update: float | None
    write_units_per_update: float | None  # writes that applied, as DynamoDB reported them
    failed_write_units_per_update: float | None  # writes refused on their condition, charged by the bench
    attempts_mean: float | None
    attempts_p95: float | None
    attempts_max: int | None
    latency_ms_p50: float
    latency_ms_p95: float
    latency_ms_p99: float


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))] if ordered else 0.0


class Bench:
    def __init__(self, endpoint: str, server_port: int | None, backoff: Backoff = Backoff()):
        self.endpoint = endpoint
        self.backoff = backoff  # the "tuned" strategy's retry backoff (the others keep the library's)
        self.server_port = server_port
        self.client = dynamodb_client(endpoint, "us-east-1")
        self.table = f"bench-{uuid.uuid4().hex[:8]}"
        table.create_table(self.client, self.table)

    # one update per strategy ------------------------------------------------

    def naive(self, client, device_id, workload, writer):
        key = table.state_key(device_id)
        item = client.get_item(TableName=self.table, Key=key, ConsistentRead=True)["Item"]
        state = from_attribute(item[table.STATE])
        state = rmw_state(state, writer) if workload == "rmw" else {**state, "n": state["n"] + 1}
        item[table.STATE] = to_attribute(state)
        item[table.VERSION] = {"N": str(int(item[table.VERSION]["N"]) + 1)}
        client.put_item(TableName=self.table, Item=item)
        return 1

    def seed(self, client, device_id, workload, writer):
        key = table.state_key(device_id)
        for attempt in range(1, SEED_RETRIES + 1):
            item = client.get_item(TableName=self.table, Key=key, ConsistentRead=True)["Item"]
            version = int(item[table.VERSION]["N"])
            state = from_attribute(item[table.STATE])
            state = rmw_state(state, writer) if workload == "rmw" else {**state, "n": state["n"] + 1}
            try:
                client.update_item(
                    TableName=self.table, Key=key,
                    UpdateExpression="SET #s = :s, #v = :next",
                    ConditionExpression="#v = :expected",
                    ExpressionAttributeNames={"#s": table.STATE, "#v": table.VERSION},
                    ExpressionAttributeValues={":s": to_attribute(state), ":next": {"N": str(version + 1)},
                                               ":expected": {"N": str(version)}})
                return attempt
            except ClientError as error:
                if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    raise
        raise RetriesExhausted(device_id, SEED_RETRIES, 0.0, "seed retries")

    def library_update(self, manager, device_id, workload, writer):
        if workload == "rmw":
            manager.update_with_retry(device_id, lambda state: rmw_state(state, writer))
        else:
            manager.update_with_retry(device_id, JsonPatch([{"op": "increment", "path": "/n", "value": 1}]))

    def api_update(self, device_id, workload, writer):
        import http.client

        patch = [{"op": "increment", "path": "/n", "value": 1}]
        if workload == "rmw":  # the history holds HISTORY entries from the start: drop the oldest, add one
            patch += [{"op": "remove", "path": "/history/0"}, {"op": "add", "path": "/history/-", "value": writer}]
        connection = http.client.HTTPConnection("127.0.0.1", self.server_port, timeout=60)
        try:
            connection.request("PATCH", f"/devices/{device_id}", body=json.dumps(patch),
                               headers={"Content-Type": "application/json-patch+json", **credentials.HEADERS})
            response = connection.getresponse()
            response.read()
        finally:
            connection.close()
        if response.status == 503:
            raise RetriesExhausted(device_id, 0, 0.0, "api 503")
        if response.status != 200:
            raise RuntimeError(f"PATCH answered {response.status}")

    # one cell --------------------------------------------------------------

    def run_cell(self, workload: str, strategy: str, writers: int, updates: int) -> Cell:
        device_id = f"{workload}-{strategy}-{writers}-{uuid.uuid4().hex[:6]}"
        DeviceStateManager(self.client, self.table).create(device_id, {"n": 0, "history": [""] * HISTORY})
        counting = CountingClient(self.client)
        attempts = Attempts()
        shared = DeviceStateManager(counting, self.table, observer=attempts)
        backoff = self.backoff if strategy == "tuned" else Backoff()
        managers = [DeviceStateManager(counting, self.table, observer=attempts, backoff=backoff)
                    if strategy in ("apart", "racing", "tuned") else shared
                    for _ in range(writers)]
        per_writer = [updates // writers + (1 if index < updates % writers else 0) for index in range(writers)]
        latencies, seed_attempts, succeeded = [], [], [0]
        lock = threading.Lock()
        barrier = threading.Barrier(writers + 1)

        def writer_loop(index: int):
            name = f"w{index}"
            barrier.wait()
            for _ in range(per_writer[index]):
                started = time.perf_counter()
                try:
                    if strategy == "naive":
                        self.naive(counting, device_id, workload, name)
                    elif strategy == "seed":
                        used = self.seed(counting, device_id, workload, name)
                        with lock:
                            seed_attempts.append(used)
                    elif strategy in ("library", "apart", "racing", "tuned"):
                        self.library_update(managers[index], device_id, workload, name)
                    else:
                        self.api_update(device_id, workload, name)
                except RetriesExhausted:
                    continue
                elapsed = time.perf_counter() - started
                with lock:
                    latencies.append(elapsed * 1000)
                    succeeded[0] += 1

        threads = [threading.Thread(target=writer_loop, args=(index,)) for index in range(writers)]
        for thread in threads:
            thread.start()
        with marks_off() if strategy == "racing" else contextlib.nullcontext():
            barrier.wait()
            started = time.perf_counter()
            for thread in threads:
                thread.join()
            seconds = time.perf_counter() - started
        final = DeviceStateManager(self.client, self.table).get(device_id).state["n"]
        ok = succeeded[0]
        attempt_list = {"library": attempts.per_update, "apart": attempts.per_update,
                        "racing": attempts.per_update, "tuned": attempts.per_update,
                        "seed": seed_attempts, "naive": [1] * ok}.get(strategy)
        counted = strategy != "api"  # the API's calls happen inside the server's processes

        def per_update(total):
            return round(total / ok, 3) if counted and ok else None
        return Cell(
            workload=workload, strategy=strategy, writers=writers, updates=updates, succeeded=ok,
            lost_updates=int(ok - final), seconds=round(seconds, 4), goodput=round(ok / seconds, 1),
            success_rate=round(ok / updates, 4),
            calls_per_update=round(counting.calls / ok, 3) if counted and ok else None,
            failed_conditions_per_update=round(counting.failed_conditions / ok, 3) if counted and ok else None,
            request_units_per_update=per_update(counting.request_units),
            read_units_per_update=per_update(counting.read_units),
            write_units_per_update=per_update(counting.written_units),
            failed_write_units_per_update=per_update(counting.failed_write_units),
            attempts_mean=round(statistics.mean(attempt_list), 3) if attempt_list else None,
            attempts_p95=percentile(attempt_list, 0.95) if attempt_list else None,
            attempts_max=max(attempt_list) if attempt_list else None,
            latency_ms_p50=round(percentile(latencies, 0.50), 2),
            latency_ms_p95=round(percentile(latencies, 0.95), 2),
            latency_ms_p99=round(percentile(latencies, 0.99), 2),
        )


# ------------------------------------------------------------- cold start

_BASELINE = """
import boto3
client = boto3.client("dynamodb", endpoint_url={endpoint!r})
client.update_item(TableName={table!r}, Key={{"deviceId": {{"S": "cold"}}, "sk": {{"S": "state"}}}},
                   UpdateExpression="SET #n = :n", ExpressionAttributeNames={{"#n": "n"}},
                   ExpressionAttributeValues={{":n": {{"N": "1"}}}})
"""
_HANDLER = """
import json
from functions.api.handler import lambda_handler
from localdev.apigw import LambdaContext, make_event
event = make_event("PATCH", "/devices/cold", {{"Content-Type": "application/merge-patch+json"}}, '{{"n": 2}}')
# As deployed: the authorizer has run, and its principal is in the request context.
event["requestContext"]["authorizer"] = {{"principalId": "client:bench", "principalKind": "client",
                                          "subject": "client:bench", "scopes": "devices.write"}}
assert lambda_handler(event, LambdaContext())["statusCode"] == 200
"""


_ANSWERED = "\nimport sys\nsys.stdout.write('answered\\n')\nsys.stdout.flush()\n"


def cold_start(endpoint: str, table_name: str, runs: int, bytecode: bool = True) -> dict:
    """Whole-process times, baseline and handler alternating so that the machine's drift
    (other load, CPU frequency) falls on both alike; the ratio is the median of the pairs'.
    The clock stops when the process has its answer (what a caller waits for), not when it
    has exited: Lambda never waits for a process to exit, and exiting (a last garbage
    collection, module teardown) took 100 ms or more of a bare boto3 process here. The
    ratio to the exit is reported beside it, as this bench measured it before."""
    DeviceStateManager(dynamodb_client(endpoint, "us-east-1"), table_name).put("cold", {"n": 0})
    # The handler runs from a copy of our packages without the tree's __pycache__ (which test
    # runs write), and writes no bytecode (/var/task is read-only). As the bundled asset ships
    # it (infra/bundling.py compiles it, unchecked, with a Python of the function's version),
    # the copy is compiled, unchecked, by this Python; with bytecode=False it is not, as an
    # asset bundled where no such Python is, whose cold starts compile every module.
    asset = Path(tempfile.mkdtemp(prefix="cold-asset-"))
    for package in ("functions", "localdev"):
        shutil.copytree(REPO_ROOT / package, asset / package, ignore=shutil.ignore_patterns("__pycache__"))
    if bytecode:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "--invalidation-mode", "unchecked-hash",
                        str(asset)], check=True)
    env = dict(os.environ, TABLE_NAME=table_name, DYNAMODB_ENDPOINT=endpoint, CURSOR_KEY=credentials.CURSOR_KEY,
               POWERTOOLS_TRACE_DISABLED="true",
               POWERTOOLS_METRICS_DISABLED="true", POWERTOOLS_LOG_LEVEL="WARNING", PYTHONPATH=str(asset),
               PYTHONDONTWRITEBYTECODE="1")
    # boto3 and Powertools come precompiled in both places (make setup installs without compiling):
    # one run of each from the tree, bytecode written, compiles what they import.
    compiling = {key: value for key, value in env.items() if key not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    for code in (_BASELINE, _HANDLER):
        subprocess.run([sys.executable, "-c", code.format(endpoint=endpoint, table=table_name)], env=compiling,
                       cwd=REPO_ROOT, check=True, stdout=subprocess.DEVNULL)
    answered = {"baseline": [], "handler": []}
    exited = {"baseline": [], "handler": []}
    for _ in range(runs):
        for name, code in (("baseline", _BASELINE), ("handler", _HANDLER)):
            started = time.perf_counter()
            process = subprocess.Popen([sys.executable, "-c", code.format(endpoint=endpoint, table=table_name) + _ANSWERED],
                                       env=env, cwd=asset, stdout=subprocess.PIPE, text=True)
            line = process.stdout.readline()
            answered[name].append(time.perf_counter() - started)
            if process.wait() != 0 or line != "answered\n":
                raise RuntimeError(f"the {name} process failed (exit {process.returncode})")
            exited[name].append(time.perf_counter() - started)
    shutil.rmtree(asset)
    timings = {name: round(statistics.median(times) * 1000, 1) for name, times in answered.items()}
    timings["ratio"] = round(statistics.median(h / b for b, h in zip(answered["baseline"], answered["handler"])), 3)
    timings["ratio_to_exit"] = round(statistics.median(h / b for b, h in zip(exited["baseline"], exited["handler"])), 3)
    return timings


# ---------------------------------------------------------------- output


def headline(cells: list[Cell], cold: dict | None) -> list[str]:
    def cell(workload, strategy, writers):
        return next((c for c in cells if (c.workload, c.strategy, c.writers) == (workload, strategy, writers)), None)

    lines = []
    most = max(c.writers for c in cells)
    hot = 16 if any(c.writers == 16 for c in cells) else most
    for workload in WORKLOADS:
        library_hot, seed_hot = cell(workload, "library", hot), cell(workload, "seed", hot)
        library_one, seed_one = cell(workload, "library", 1), cell(workload, "seed", 1)
        if library_hot and seed_hot and seed_one and library_one:
            lines.append(
                f"{workload} @ {hot} writers: library {library_hot.goodput}/s = "
                f"{library_hot.goodput / seed_hot.goodput:.2f}x seed @ {hot}, "
                f"{library_hot.goodput / seed_one.goodput:.2f}x seed @ 1, "
                f"{library_hot.goodput / library_one.goodput:.2f}x library @ 1; "
                f"failed conditional writes/update {library_hot.failed_conditions_per_update}, "
                f"calls/update {library_hot.calls_per_update}, attempts p95 {library_hot.attempts_p95}, "
                f"success {library_hot.success_rate:.0%}")
        for count in sorted({c.writers for c in cells}):
            for apart in (cell(workload, "apart", count), cell(workload, "racing", count),
                          cell(workload, "tuned", count)):
                if not apart or count == 1:
                    continue
                lines.append(f"{workload} @ {count} writers, a manager each, {apart.strategy}: "
                             f"request units/update {apart.request_units_per_update}, {apart.goodput}/s, "
                             f"p50/p95/p99 {apart.latency_ms_p50}/{apart.latency_ms_p95}/{apart.latency_ms_p99} ms, "
                             f"success {apart.success_rate:.2%}")
            api = cell(workload, "api", count)
            if api and count > 1:
                lines.append(f"{workload} @ {count} writers over HTTP: {api.goodput}/s, "
                             f"p50/p95/p99 {api.latency_ms_p50}/{api.latency_ms_p95}/{api.latency_ms_p99} ms, "
                             f"success {api.success_rate:.2%}")
    lost = {s: sum(c.lost_updates for c in cells if c.strategy == s) for s in STRATEGIES}
    lines.append("lost updates: " + ", ".join(f"{s} {n}" for s, n in lost.items() if any(
        c.strategy == s for c in cells)))
    if cold:
        lines.append(f"cold start, to the answer: handler {cold['handler']} ms vs baseline {cold['baseline']} ms "
                     f"= {cold['ratio']}x (median of pairs; to the process's exit {cold['ratio_to_exit']}x)")
    return lines


def write_outputs(cells: list[Cell], cold: dict | None, out: Path, lines: list[str], outcome: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(
        {"cells": [asdict(c) for c in cells], "cold_start": cold, "outcomes": outcome, "headline": lines},
        indent=2) + "\n")
    columns = ["workload", "strategy", "writers", "succeeded", "lost_updates", "goodput", "success_rate",
               "request_units_per_update", "calls_per_update", "failed_conditions_per_update", "attempts_mean",
               "attempts_p95",
               "attempts_max", "latency_ms_p50", "latency_ms_p95", "latency_ms_p99"]
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    rows += ["| " + " | ".join("" if getattr(c, k) is None else str(getattr(c, k)) for k in columns) + " |"
             for c in cells]
    text = "\n".join(rows) + "\n\n" + "\n".join(f"- {line}" for line in lines) + "\n"
    (out / "latest.md").write_text(text)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in WORKLOADS if any(c.workload == w for c in cells)]
    figure, axes = plt.subplots(2, len(workloads), figsize=(6 * len(workloads), 8), squeeze=False)
    for column, workload in enumerate(workloads):
        for strategy in STRATEGIES:
            series = sorted((c for c in cells if c.workload == workload and c.strategy == strategy),
                            key=lambda c: c.writers)
            if not series:
                continue
            writers = [c.writers for c in series]
            axes[0][column].plot(writers, [c.goodput for c in series], marker="o", label=strategy)
            wasted = [c.failed_conditions_per_update for c in series]
            if all(value is not None for value in wasted):
                axes[1][column].plot(writers, wasted, marker="o", label=strategy)
        axes[0][column].set_title(f"{workload}: goodput (updates/s)")
        axes[1][column].set_title(f"{workload}: failed conditional writes per update")
        for row in (0, 1):
            axes[row][column].set_xscale("log", base=2)
            axes[row][column].set_xlabel("writers")
            axes[row][column].legend()
    figure.tight_layout()
    figure.savefig(out / "latest.png", dpi=90)
    plt.close(figure)


def main(argv=None) -> None:
    logging.getLogger("device_state").setLevel(logging.ERROR)  # exhaustion is counted, not logged
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", default="1,4,16,64")
    parser.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--updates", type=int, default=320, help="updates per cell")
    parser.add_argument("--cold-runs", type=int, default=5, help="0 skips the cold-start measurement")
    parser.add_argument("--warm-updates", type=int, default=640,
                        help="updates of an untimed cell that warms DynamoDB Local first (0: none)")
    parser.add_argument("--journal-writes", type=int, default=200, help="writes per journal-size workload")
    parser.add_argument("--fault-updates", type=int, default=20, help="updates per writer in the lost-answer run")
    parser.add_argument("--backoff", default=None, metavar="BASE,CAP[,equal]",
                        help="the strategy 'tuned' (apart with another backoff, asked for by --strategies): "
                             "its base and cap in seconds, and 'equal' for equal jitter instead of full")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--endpoint", help="a running DynamoDB Local (default: one started for the run)")
    args = parser.parse_args(argv)
    writers = [int(n) for n in args.writers.split(",")]
    strategies = args.strategies.split(",")
    workloads = args.workloads.split(",")
    unknown = sorted(set(strategies) - set(STRATEGIES)) + sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown strategies or workloads: {', '.join(unknown)} (strategies: {', '.join(STRATEGIES)}; "
                     f"workloads: {', '.join(WORKLOADS)})")

    with dynamodb_local(args.endpoint) as dynamodb:
        server = None
        port = None
        backoff = Backoff()
        if args.backoff:
            base, cap, *jitter = args.backoff.split(",")
            backoff = (EqualJitter if jitter == ["equal"] else Backoff)(float(base), float(cap))
        bench = Bench(dynamodb.endpoint, None, backoff)
        if "api" in strategies:
            port = free_port()
            env = dict(os.environ, **credentials.server_environment(), DYNAMODB_ENDPOINT=dynamodb.endpoint,
                       TABLE_NAME=bench.table, PORT=str(port),
                       WORKERS=str(max(writers)), POWERTOOLS_LOG_LEVEL="ERROR",
                       STREAM_PROCESSOR="off")  # contention alone; bench/feed.py measures the feed
            server = subprocess.Popen([sys.executable, "-m", "localdev.server"], env=env, cwd=REPO_ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            bench.server_port = port
            _wait_for(port)
        try:
            # DynamoDB Local serves its first thousand requests or so slower (its JIT warming):
            # without this untimed cell, the first cell of a run measured a quarter below the
            # same cell run second, 160 updates still left a third, 640 leave a few percent.
            if args.warm_updates:
                bench.run_cell(workloads[0], "library", 4, args.warm_updates)
            cells = []
            for workload in workloads:
                for count in writers:
                    for strategy in strategies:
                        cell = bench.run_cell(workload, strategy, count, args.updates)
                        cells.append(cell)
                        print(f"{workload:9s} {strategy:8s} {count:3d} writers: {cell.goodput:8.1f}/s "
                              f"lost {cell.lost_updates:4d} success {cell.success_rate:.0%} "
                              f"failed-cond/upd {cell.failed_conditions_per_update} "
                              f"calls/upd {cell.calls_per_update} RU/upd {cell.request_units_per_update} "
                              f"p50/p95/p99 {cell.latency_ms_p50}/{cell.latency_ms_p95}/{cell.latency_ms_p99} ms",
                              flush=True)
            cold = cold_start(dynamodb.endpoint, bench.table, args.cold_runs) if args.cold_runs else None
            costs = outcomes.journal_costs(dynamodb.endpoint, bench.table, writes=args.journal_writes)
            faults = outcomes.fault_run(dynamodb.port, bench.table, updates=args.fault_updates)
        finally:
            if server:
                server.terminate()
                server.wait(timeout=30)
    lines = headline(cells, cold) + outcomes.lines(costs, faults)
    write_outputs(cells, cold, Path(args.out), lines, {"journal": costs, "lost_answers": faults})
    print(f"\nwrote {args.out}/latest.json, latest.md, latest.png")
    for line in lines:
        print(line)


def _wait_for(port: int) -> None:
    import http.client

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/openapi.json")
            if connection.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the local server did not start")


if __name__ == "__main__":
    main()
