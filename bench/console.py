"""`make bench` → console: the browser console on DynamoDB Local with ``--devices`` (100,000)
devices, in headless Chromium (Debian's, driven by Playwright): the fleet page's first rows
visible (the plain listing, and a filter matching 0.1 %), a device page's live update after a
write from another client, ``--samples`` (20) of each, median, p95 and spread; and what the
console's files weigh on the wire (gzip, as CloudFront compresses them), with no cache.

The server is `python -m localdev.server` (make serve's, this checkout's issuer, so the page
signs itself in). First rows are timed in the page (performance.now() from navigation start to
the first row in the table, a fresh browser context each time, so nothing is cached); a live
update from just before the write is sent to the page showing its version (Date.now() in the
page, the same clock as the bench's).

Writes bench/out/console.{json,md} (``--out``; ``make bench UPDATE_RESULTS=1``: bench/results/).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
for _name, _value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                      "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
    os.environ.setdefault(_name, _value)

import boto3  # noqa: E402
import botocore.config  # noqa: E402

from bench.fleet import FLEET, SELECTIVE, loaded, reference_documents  # noqa: E402
from functions.auth.credentials import DEVICE_TOKEN_VARIABLES  # noqa: E402
from functions.auth.credentials import VARIABLES as AUTH_VARIABLES  # noqa: E402
from functions.auth.device_tokens import ISSUING_VARIABLES  # noqa: E402
from functions.device_state import DeviceStateManager  # noqa: E402
from localdev.dynamodb_local import dynamodb_local, free_port  # noqa: E402
from localdev.issuer import DEFAULT_DIRECTORY, Issuer  # noqa: E402

OUT = REPO_ROOT / "bench" / "out"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
GOAL_SECONDS, GOAL_KB = 1.0, 300
# In the page: when the first row of the devices table appeared (ms from navigation start).
FIRST_ROWS = """
new MutationObserver((_, observer) => {
  if (document.querySelector("table.devices tbody th[scope=row]")) {
    window.__firstRows = performance.now();
    observer.disconnect();
  }
}).observe(document, {subtree: true, childList: true});
"""
# In the page: when each version was first shown (Date.now(), by version).
VERSIONS_SHOWN = """() => {
  window.__shown = {};
  const note = () => {
    const version = document.querySelector("#version")?.textContent;
    if (version && !(version in window.__shown)) window.__shown[version] = Date.now();
  };
  new MutationObserver(note).observe(document.querySelector("main"), {subtree: true, childList: true,
                                                                     characterData: true});
  note();
}"""


def percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {"samples": len(ordered), "median_s": round(statistics.median(ordered), 4), "p95_s": round(p95, 4),
            "min_s": round(ordered[0], 4), "max_s": round(ordered[-1], 4)}


class Server:
    """make serve's server on the loaded table, this checkout's issuer (the console signs in by itself).
    Its output is kept, and shown when it stops or a measure fails."""

    STARTUP_SECONDS = 300  # at most, on a busy machine; a server that exits fails at once

    def __init__(self, endpoint: str, table_name: str):
        self.port = free_port()
        drop = {"DYNAMODB_DATA_DIR", *AUTH_VARIABLES, *DEVICE_TOKEN_VARIABLES, *ISSUING_VARIABLES}
        env = {name: value for name, value in os.environ.items() if name not in drop}
        env.update(DYNAMODB_ENDPOINT=endpoint, TABLE_NAME=table_name, PORT=str(self.port), WORKERS="4",
                   FLEET_INDEX=FLEET.declaration, STREAM_NICENESS="0", POWERTOOLS_LOG_LEVEL="ERROR",
                   CHANGE_EVENTS_FILE=os.devnull)
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, "-m", "localdev.server"], env=env, cwd=REPO_ROOT,
                                        stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.token = Issuer.load_or_create(REPO_ROOT / DEFAULT_DIRECTORY).token(lifetime=12 * 3600)
        self.wait_until_ready()

    def wait_until_ready(self) -> None:
        """Until every process is started (the banner's last line), and the API answers a listing
        through its handler and DynamoDB, and the console its settings."""
        deadline = time.monotonic() + self.STARTUP_SECONDS
        while True:
            self.check_running()
            try:
                if ("For scripts and the library:" in self.output()
                        and self.request("GET", "/devices?limit=1")[0] == 200
                        and self.request("GET", "/console/config.json")[0] == 200):
                    return
            except OSError:  # not listening yet, or not answering yet
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the dev server was not ready within {self.STARTUP_SECONDS} s:\n{self.output()}")
            time.sleep(0.3)

    def check_running(self) -> None:
        if self.process.poll() is not None:
            raise SystemExit(f"the dev server exited ({self.process.returncode}):\n{self.output()}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def request(self, method: str, path: str, body=None, content_type="application/json") -> tuple[int, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {"Content-Type": content_type, "Authorization": f"Bearer {self.token}"}
            connection.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
            response = connection.getresponse()
            data = response.read()
            return response.status, json.loads(data) if data else {}
        finally:
            connection.close()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def first_rows(browser, url: str, samples: int) -> dict:
    """Seconds from navigation start to the table's first row, each in a fresh context (no cache)."""
    seconds = []
    for _ in range(samples + 1):  # the first warms the server's workers, and is not counted
        context = browser.new_context(viewport={"width": 1440, "height": 900})
        context.add_init_script(FIRST_ROWS)
        page = context.new_page()
        page.goto(url)
        page.wait_for_function("() => window.__firstRows !== undefined", timeout=60_000)
        seconds.append(page.evaluate("window.__firstRows") / 1000)
        context.close()
    return percentiles(seconds[1:])


def api_alone(server: Server, path: str, samples: int) -> dict:
    """Seconds of the API request the page makes first, sent alone (the console's share is the rest)."""
    seconds = []
    for _ in range(samples):
        started = time.perf_counter()
        status, body = server.request("GET", path)
        assert status == 200 and body["items"], body
        seconds.append(time.perf_counter() - started)
    return percentiles(seconds)


def live_device(server: Server) -> str:
    """A device of the reference shape written through the API, so its change feed is whole from its
    creation (the bulk-loaded devices' are not: their loading wrote no change items). Its creation is
    awaited in its feed: the stream processor then runs, past its start, whose DescribeTable costs
    DynamoDB Local seconds at 100,000 devices (it counts the items), which no measure may share."""
    device = f"live-{uuid.uuid4().hex[:8]}"
    documents = reference_documents(1, random.Random(1), False)
    status, body = server.request("PUT", f"/devices/{device}", documents)
    assert status == 201, body
    status, body = server.request("GET", f"/devices/{device}/changes?since=0&waitSeconds=20")
    assert status == 200 and [change["version"] for change in body["changes"]] == [1], body
    return device


def live_updates(browser, server: Server, device: str, samples: int) -> dict:
    """Seconds from just before a write is sent to the device page showing its version."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.goto(f"http://127.0.0.1:{server.port}/console/#/devices/{device}")
    page.wait_for_function("() => document.querySelector('#live')?.textContent === 'live'", timeout=60_000)
    page.evaluate(VERSIONS_SHOWN)
    seconds = []
    for n in range(samples + 1):
        time.sleep(0.5)  # one change at a time, as a person watching would see them
        sent = time.time()
        status, body = server.request("PATCH", f"/devices/{device}/reported", {"brightness": n},
                                      "application/merge-patch+json")
        assert status == 200, body
        version = body["version"]
        page.wait_for_function(f"() => window.__shown['{version}'] !== undefined", timeout=30_000)
        seconds.append(page.evaluate(f"window.__shown['{version}']") / 1000 - sent)
    context.close()
    return percentiles(seconds[1:])


def transferred(browser, url: str) -> dict:
    """The console's own files as one cold load fetches them: bytes, and gzip-compressed bytes."""
    context = browser.new_context()
    page = context.new_page()
    files = {}

    def keep(response):
        path = response.url.split("://", 1)[1].split("/", 1)[1].split("?")[0]
        if path.startswith("console/") and response.request.method == "GET" and response.ok:
            files["/" + path] = response.body()

    page.on("response", keep)
    page.goto(url)
    page.wait_for_function("() => document.querySelector('table.devices tbody th[scope=row]')", timeout=60_000)
    page.wait_for_timeout(500)
    context.close()
    return {"files": len(files), "bytes": sum(map(len, files.values())),
            "gzip_bytes": sum(len(gzip.compress(body, 6)) for body in files.values()),
            "names": sorted(files)}


def fresh_stream(client, name: str) -> None:
    """The table's stream replaced by a new, empty one (a new ARN, which the server's poller reads)."""
    from functions.device_state.table import STREAM_VIEW_TYPE

    before = client.describe_table(TableName=name)["Table"].get("LatestStreamArn")
    client.update_table(TableName=name, StreamSpecification={"StreamEnabled": False})
    client.update_table(TableName=name, StreamSpecification={"StreamEnabled": True, "StreamViewType": STREAM_VIEW_TYPE})
    assert client.describe_table(TableName=name)["Table"]["LatestStreamArn"] != before


def main(argv: list[str] | None = None) -> dict:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--endpoint", help="a running DynamoDB Local (default: one started for the run)")
    parser.add_argument("--table", help="with --endpoint: this table, loaded once and reused by later runs")
    parser.add_argument("--data-dir", help="without --endpoint: DynamoDB Local on disk here, its table "
                                           "(console-DEVICES) loaded once and reused by later runs (a tmpfs, "
                                           "e.g. /dev/shm/..., loads as fast as memory)")
    args = parser.parse_args(argv)
    with dynamodb_local(args.endpoint, args.data_dir) as dynamodb:
        # A bulk load on a busy machine: a long read timeout and retries (its puts are idempotent).
        client = boto3.session.Session().client(
            "dynamodb", endpoint_url=dynamodb.endpoint, region_name="us-east-1",
            config=botocore.config.Config(read_timeout=60, retries={"max_attempts": 10, "mode": "standard"}))
        name = args.table or (f"console-{args.devices}" if args.data_dir else f"console-{uuid.uuid4().hex[:8]}")
        loaded(DeviceStateManager(client, name, fleet_index=FLEET), client, name, args.devices, "console")
        # A stream of its own for the server, empty: no live update waits behind the records an earlier
        # run wrote on a reused table (the load itself writes with the stream off).
        fresh_stream(client, name)
        server = Server(dynamodb.endpoint, name)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                base = f"http://127.0.0.1:{server.port}/console/"
                device = live_device(server)
                results = {
                    "devices": args.devices,
                    "load_average_at_start": os.getloadavg(),
                    "fleet_first_rows": first_rows(browser, f"{base}#/", args.samples),
                    "filtered_first_rows": first_rows(browser, f"{base}#/?filter={quote(SELECTIVE)}", args.samples),
                    "live_update": live_updates(browser, server, device, args.samples),
                    "fleet_api_alone": api_alone(server, "/devices?limit=25", args.samples),
                    "filtered_api_alone": api_alone(server, f"/devices?filter={quote(SELECTIVE)}&limit=25", args.samples),
                    "transfer": transferred(browser, f"{base}#/"),
                    "load_average": os.getloadavg(),
                    "chromium": browser.version,
                }
                browser.close()
        except Exception:
            server.check_running()  # a server that stopped is the cause: its output says why
            raise
        finally:
            server.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "console.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "console.md").write_text(markdown(results))
    print(markdown(results), flush=True)
    return results


def markdown(results: dict) -> str:
    rows = [("fleet page, first rows visible (the plain listing)", "fleet_first_rows"),
            ("... its API request alone (`GET /devices?limit=25`)", "fleet_api_alone"),
            (f"fleet page, first rows visible (`{SELECTIVE}`, 0.1 %)", "filtered_first_rows"),
            ("... its API request alone (`GET /devices?filter=…&limit=25`)", "filtered_api_alone"),
            ("device page, live update after another client's write", "live_update")]
    transfer = results["transfer"]
    lines = [f"# The console at {results['devices']:,} devices (DynamoDB Local, headless Chromium "
             f"{results['chromium']})", "",
             "From `bench/console.py` (`make bench`). Seconds over the samples on this machine (the goal: "
             f"p95 at most {GOAL_SECONDS:g} s); load average (1, 5, 15 minutes) at the start "
             f"{', '.join(f'{value:.1f}' for value in results['load_average_at_start'])}, at the end "
             f"{', '.join(f'{value:.1f}' for value in results['load_average'])}. The API's requests alone, "
             "sent from the bench, show what the page adds.", "",
             "| what | median | p95 | min–max | samples |", "|---|---|---|---|---|"]
    for label, key in rows:
        figure = results[key]
        lines.append(f"| {label} | {figure['median_s']:.3f} | {figure['p95_s']:.3f} | "
                     f"{figure['min_s']:.3f}–{figure['max_s']:.3f} | {figure['samples']} |")
    lines += ["", f"The console's files on a cold load: {transfer['files']} files, {transfer['bytes'] / 1024:.1f} KB, "
              f"**{transfer['gzip_bytes'] / 1024:.1f} KB gzip-compressed** (the goal: at most {GOAL_KB} KB); no "
              "framework, no build step.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
