"""`make bench` → identity units: what a device's registered credential costs the device's own
requests, in request units measured on DynamoDB Local (``ReturnConsumedCapacity``), against the
same requests of a device that holds none.

Two sets of devices shaped like the reference fleet's (``bench/costs.py``) live the same hour
of it, each operation measured as ``costs.py`` measures it: the devices of one set hold no
credential (what every device paid before devices had credentials, and what a back-end's or
your own issuer's token still pays); each device of the other holds a registered secret, and
every request of its own is checked against it. Then each device calls its own routes through
the API handler (in this process, as ``make serve`` calls it) with its token: a report, a read
of itself, a page of its feed and its feed caught up, an older version, its lease status, its
jobs, a lease taken, heartbeaten and released, and a transaction. On devices created fresh: a
report; a credential registered, exchanged for a token with an assertion, and revoked (after
which the next report is refused).

Writes bench/out/identity_units.{json,md} (``--out``; ``make bench UPDATE_RESULTS=1``: bench/results/).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
for _name, _value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                      "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
    os.environ.setdefault(_name, _value)

from bench import credentials  # noqa: E402
from bench.costs import (REPORTS_PER_DESIRE, SNAPSHOT_EVERY, Meter, create_reference_device,  # noqa: E402
                         fresh_configuration, reference_hour)
from functions.auth import identity  # noqa: E402
from functions.auth.sealing import KeyFileSealer  # noqa: E402
from functions.device_state import Holder, dynamodb_client, table  # noqa: E402
from localdev.dynamodb_local import dynamodb_local  # noqa: E402

OUT = REPO_ROOT / "bench" / "out"
NONE, HELD = "no credential", "its credential checked"
ADMIN_SCOPES = ("devices.read", "devices.write", "devices.admin")
# bench/costs.py's kinds not compared here: a listing pages the table, which holds both sets; the
# feed's read is measured through the API handler below.
LEFT_OUT = ("list (page of 50)", "feed read (page)")


class Units:
    """Request units of everything a DynamoDB client sends: each request asks for its
    ``ConsumedCapacity``. ``since(mark)``: what was sent after ``mark = units.mark()``."""

    def __init__(self, client):
        self.read = self.write = 0.0
        self.calls = self.refused = 0
        client.meta.events.register("provide-client-params.dynamodb.*", self._ask)
        client.meta.events.register("after-call.dynamodb.*", self._count)

    @staticmethod
    def _ask(params, model, **_):
        if "ReturnConsumedCapacity" in model.input_shape.members:
            params["ReturnConsumedCapacity"] = "TOTAL"

    def _count(self, parsed, model, **_):
        self.calls += 1
        if parsed.get("Error", {}).get("Code") in ("ConditionalCheckFailedException", "TransactionCanceledException"):
            self.refused += 1  # DynamoDB bills a refused write; DynamoDB Local does not say for how much
        consumed = parsed.get("ConsumedCapacity")
        units = sum(entry.get("CapacityUnits", 0) for entry in (consumed if isinstance(consumed, list) else [consumed])
                    if entry)
        if model.name in ("GetItem", "Query", "Scan", "BatchGetItem", "TransactGetItems"):
            self.read += units
        else:
            self.write += units

    def mark(self) -> tuple:
        return self.read, self.write, self.calls, self.refused

    def since(self, mark: tuple) -> dict:
        read, write, calls, refused = mark
        return {"read": self.read - read, "write": self.write - write, "calls": self.calls - calls,
                "refused": self.refused - refused}


class Api:
    """The API handler in this process, with the environment a deployed function has (restored
    by ``close``), the benchmarks' issuer trusted and device tokens signed as make serve signs them."""

    def __init__(self, endpoint: str, table_name: str):
        self._saved = dict(os.environ)
        self.folder = folder = Path(tempfile.mkdtemp(prefix="identity-units-"))  # removed by close
        sealing_key = folder / "sealing-key"
        sealing_key.write_bytes(os.urandom(32))
        os.environ.update({"TABLE_NAME": table_name, "DYNAMODB_ENDPOINT": endpoint,
                           "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_METRICS_DISABLED": "true",
                           "POWERTOOLS_LOG_LEVEL": "ERROR", "SEALING_KEY_FILE": str(sealing_key),
                           **credentials.server_environment(),
                           **credentials.ISSUER.device_token_environment(
                               credentials.ISSUER.save_key(folder / "device-token-key.pem"))})
        fresh_configuration()
        from functions.api import handler
        from localdev.apigw import LambdaContext, make_event

        self._handler, self._context, self._event = handler, LambdaContext, make_event
        self.units = Units(dynamodb_client(endpoint))
        self.admin = {"Authorization": f"Bearer {credentials.ISSUER.token(ADMIN_SCOPES)}"}

    def close(self) -> None:
        os.environ.clear()
        os.environ.update(self._saved)
        fresh_configuration()
        shutil.rmtree(self.folder, ignore_errors=True)

    def call(self, method: str, target: str, headers: dict, body=None, expect: int = 200) -> tuple[dict, dict]:
        """(the answer's JSON body or {}, the request units the call cost)."""
        headers = dict(headers)
        if body is not None:
            headers.setdefault("Content-Type", "application/json")
            body = json.dumps(body)
        mark = self.units.mark()
        response = self._handler.lambda_handler(self._event(method, target, headers, body), self._context())
        units = self.units.since(mark)
        assert response["statusCode"] == expect, (method, target, response)
        return (json.loads(response["body"]) if response.get("body") else {}), units


def secret_assertion(device_id: str, credential_id: str, secret: bytes) -> str:
    """An HS256 assertion as a device signs one with its secret (docs/api/identity.md)."""
    import jwt

    now = int(time.time())
    return jwt.encode({"sub": device_id, "aud": "device-state", "iat": now, "exp": now + 300,
                       "jti": uuid.uuid4().hex}, secret, algorithm="HS256", headers={"kid": credential_id})


def averaged(samples: list[dict]) -> dict:
    return {key: round(sum(sample[key] for sample in samples) / len(samples), 3) for key in samples[0]}


def billed_bytes(client, scratch: str, item: dict) -> int:
    """The item's size as DynamoDB bills its writes: the longest padding it takes under the same
    write units, put alone into ``scratch`` (a put replacing an item is billed the larger of the two)."""
    def units(pad: int) -> float:
        client.delete_item(TableName=scratch, Key={key: item[key] for key in (table.PARTITION_KEY, table.SORT_KEY)})
        padded = {**item, "~": {"S": "x" * pad}} if pad >= 0 else item
        return client.put_item(TableName=scratch, Item=padded, ReturnConsumedCapacity="TOTAL")[
            "ConsumedCapacity"]["CapacityUnits"]

    kilobytes = units(-1)
    low, high = -1, 1024
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if units(middle) == kilobytes else (low, middle - 1)
    return int(kilobytes * 1024 - len("~") - max(low, 0))


def measure(endpoint: str, devices: int, reports_per_desire: int = REPORTS_PER_DESIRE) -> dict:
    client = dynamodb_client(endpoint)
    name, scratch = f"identity-{uuid.uuid4().hex[:8]}", f"sizes-{uuid.uuid4().hex[:8]}"
    table.create_table(client, name)
    table.create_table(client, scratch)
    meter = Meter(client, name)
    arms = {NONE: [f"dev-{index:04d}" for index in range(devices)],
            HELD: [f"dev-{1000 + index:04d}" for index in range(devices)]}
    # The hour runs on the meter's clock, a minute an operation, so that it ends before now:
    # the API handler's requests come after it, on the real clock.
    meter.now = time.time() - 60 * (2 * devices * (reports_per_desire + 30)) - 600
    api = Api(endpoint, name)
    try:
        sealer = KeyFileSealer.from_file(os.environ["SEALING_KEY_FILE"])
        secrets, holders = {}, {}

        def register(device_id):  # as POST .../credentials registers a secret
            record, secret = identity.credential("secret", device_id, sealer)
            meter.manager.add_credential(device_id, record)
            secrets[device_id], holders[device_id] = (record.credential_id, secret), Holder(record.credential_id)

        meter.run(arms[NONE] + arms[HELD], lambda device_id: create_reference_device(meter.manager, device_id))
        meter.run(arms[HELD], register)
        as_reported = {}

        def sizes_as_reported(arm):
            return lambda ids: as_reported.update({arm: sorted({
                billed_bytes(client, scratch, meter.state_item(device_id)) for device_id in ids})})

        hour = {NONE: reference_hour(meter, arms[NONE], reports_per_desire, after_reports=sizes_as_reported(NONE)),
                HELD: reference_hour(meter, arms[HELD], reports_per_desire,
                                     lambda device_id: meter.manager.as_device(device_id, holders[device_id]),
                                     sizes_as_reported(HELD))}
        assert meter.now < time.time(), "the hour ran past now: the handler's requests would come before it"
        after_hour = {arm: {device_id: billed_bytes(client, scratch, meter.state_item(device_id))
                            for device_id in ids} for arm, ids in arms.items()}
        routes = {arm: _routes(api, meter, arm, ids, secrets) for arm, ids in arms.items()}
        fresh = _fresh(api, meter, devices)
        added = _identity_bytes(api, meter, client, scratch)
    finally:
        api.close()
    kinds = {}
    for kind in hour[NONE]:
        if kind not in LEFT_OUT:
            kinds[f"{kind} (library, in the hour)"] = {arm: _library_units(hour[arm][kind]) for arm in arms}
    for kind in routes[NONE]:
        kinds[kind] = {arm: routes[arm][kind] for arm in arms}
    kinds.update(fresh)
    return {"operations": kinds,
            "state item bytes as the hour's reports wrote it": as_reported,
            "state item bytes after the hour": {arm: sorted(set(sizes.values())) for arm, sizes in after_hour.items()},
            "bytes of the identity attributes": added,
            "devices": devices, "reports per desire": reports_per_desire}


def _library_units(units: dict) -> dict:
    return {"read": units["service_read"], "write": units["service_write"], "calls": units["service_calls"]}


def _routes(api: Api, meter: Meter, arm: str, ids: list[str], secrets: dict) -> dict:
    """Each device's own routes after its hour, through the handler with its token."""
    samples: dict[str, list] = {}

    def sample(kind, units):
        samples.setdefault(kind, []).append(units)

    for device_id in ids:
        path = f"/devices/{device_id}"
        if arm == HELD:
            credential_id, secret = secrets[device_id]
            token, units = api.call("POST", f"{path}/token", {
                "Authorization": f"Bearer {secret_assertion(device_id, credential_id, secret)}"})
            sample("token: an assertion exchanged (POST .../token)", units)
        else:
            token, units = api.call("POST", f"{path}/token", {
                "Authorization": f"Bearer {credentials.ISSUER.token(device=device_id)}"})
            sample("token: an assertion exchanged (POST .../token)", None)
        headers = {"Authorization": f"Bearer {token['token']}"}
        old = meter.state_item(device_id)
        _, units = api.call("PATCH", f"{path}/reported", {**headers, "Content-Type": "application/merge-patch+json"},
                            {"temperature": 20.5, "humidity": 44})
        meter.log.record(old, meter.state_item(device_id))  # its change item, as the stream writes it
        sample("report after the hour (PATCH .../reported)", units)
        sample("the device reads itself (GET /devices/{id})", api.call("GET", path, headers)[1])
        version = int(meter.state_item(device_id)[table.VERSION]["N"])
        sample(f"feed page of {SNAPSHOT_EVERY} changes (GET .../changes)",
               api.call("GET", f"{path}/changes?since={version - SNAPSHOT_EVERY}", headers)[1])
        sample(f"feed pages of 1 to {SNAPSHOT_EVERY} changes, mean (GET .../changes)", averaged(
            [api.call("GET", f"{path}/changes?since={version - size}", headers)[1]
             for size in range(1, SNAPSHOT_EVERY + 1)]))
        sample("feed caught up (GET .../changes, none newer)",
               api.call("GET", f"{path}/changes?since={version}", headers)[1])
        sample("an older version (GET .../versions/{v-1})", api.call("GET", f"{path}/versions/{version - 1}",
                                                                      headers)[1])
        sample("lease status (GET .../leases)", api.call("GET", f"{path}/leases", headers)[1])
        sample("its jobs (GET .../jobs)", api.call("GET", f"{path}/jobs", headers)[1])
        grant, taken = api.call("POST", f"{path}/leases", headers, {"ttlSeconds": 30}, expect=201)
        sample("a lease heartbeat (PUT .../leases/{id})",
               api.call("PUT", f"{path}/leases/{grant['leaseId']}", headers, {"ttlSeconds": 30})[1])
        released = api.call("DELETE", f"{path}/leases/{grant['leaseId']}", headers, expect=204)[1]
        sample("a lease taken and released (POST, DELETE .../leases)",
               {key: taken[key] + released[key] for key in taken})
        sample("a transaction of its own (POST /transactions)", api.call("POST", "/transactions", headers, {
            "operations": [{"deviceId": device_id, "section": "reported", "mergePatch": {"humidity": 45}}]})[1])
    return {kind: (averaged(units) if all(units) else None) for kind, units in samples.items()}


def _fresh(api: Api, meter: Meter, devices: int) -> dict:
    """On devices created now: a report, and a credential registered, exchanged and revoked."""
    meter.now = time.time()
    arms = {NONE: [f"dev-{2000 + index:04d}" for index in range(devices)],
            HELD: [f"dev-{3000 + index:04d}" for index in range(devices)]}
    samples: dict[str, dict[str, list]] = {}

    def sample(kind, arm, units):
        samples.setdefault(kind, {}).setdefault(arm, []).append(units)

    for arm, ids in arms.items():
        for device_id in ids:
            path = f"/devices/{device_id}"
            create_reference_device(meter.manager, device_id)
            if arm == HELD:
                added, units = api.call("POST", f"{path}/credentials", api.admin, {"type": "secret"}, expect=201)
                sample("register a credential (admin, POST .../credentials)", arm, units)
                assertion = secret_assertion(device_id, added["credentialId"], base64.b64decode(added["secret"]))
                token = api.call("POST", f"{path}/token", {"Authorization": f"Bearer {assertion}"})[0]["token"]
            else:
                token = credentials.ISSUER.token(device=device_id)
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json"}
            report = {"temperature": 20.5, "humidity": 44}
            sample("report on a fresh reference device (PATCH .../reported)", arm,
                   api.call("PATCH", f"{path}/reported", headers, report)[1])
            if arm == HELD:
                units = api.call("DELETE", f"{path}/credentials/{added['credentialId']}", api.admin, expect=204)[1]
                sample("revoke a credential (admin, DELETE .../credentials/{id})", arm, units)
                api.call("PATCH", f"{path}/reported", headers, report, expect=401)  # at once
    return {kind: {arm: averaged(by_arm[arm]) if arm in by_arm else None for arm in (NONE, HELD)}
            for kind, by_arm in samples.items()}


def _identity_bytes(api: Api, meter: Meter, client, scratch: str) -> dict:
    """What the identity attributes take on the state item of a device that holds a secret, a
    certificate (each registered over the API), or that an enrollment provisioned (its id
    generated): bytes as DynamoDB bills a write, the item's with them less the item's without."""
    import hashlib
    import hmac

    from localdev.tls import LocalCA

    ids = {path: f"dev-{4000 + index:04d}" for index, path in enumerate(("secret", "certificate", "provisioned"))}
    for path in ("secret", "certificate"):
        create_reference_device(meter.manager, ids[path])
    api.call("POST", f"/devices/{ids['secret']}/credentials", api.admin, {"type": "secret"}, expect=201)
    certificate, _ = LocalCA.load_or_create(api.folder / "ca").device_certificate(ids["certificate"])
    api.call("POST", f"/devices/{ids['certificate']}/credentials", api.admin,
             {"type": "certificate", "certificate": certificate.read_text()}, expect=201)
    made, _ = api.call("POST", "/enrollments", api.admin, {"idPattern": "dev-[0-9]{4}", "maxDevices": 1},
                       expect=201)
    device_key = hmac.new(base64.b64decode(made["groupKey"]), ids["provisioned"].encode(), hashlib.sha256).digest()
    api.call("POST", f"/devices/{ids['provisioned']}/provision", {
        "Authorization": f"Bearer {secret_assertion(ids['provisioned'], made['enrollmentId'], device_key)}"},
        expect=201)
    added = {}
    for path, device_id in ids.items():
        item = meter.state_item(device_id)
        without = {name: value for name, value in item.items() if name not in table.IDENTITY_ATTRIBUTES}
        added[path] = billed_bytes(client, scratch, item) - billed_bytes(client, scratch, without)
    return added


def markdown(result: dict) -> str:
    lines = ["# What a device's credential costs its requests", "",
             "From `bench/identity_units.py` (`make bench`): request units per operation on DynamoDB Local "
             f"(`ReturnConsumedCapacity`), {result['devices']} devices a column, each request of a device's own "
             "with no credential and with its registered credential checked. Read / write units / requests.", "",
             f"| operation | {NONE} | {HELD} |", "|---|---|---|"]
    for kind, arms in result["operations"].items():
        cells = [("—" if units is None else f"{units['read']:g} / {units['write']:g} / {units['calls']:g}"
                  + (f" ({units['refused']:g} refused)" if units.get("refused") else "")) for units in arms.values()]
        lines.append(f"| {kind} | {' | '.join(cells)} |")
    for when in ("as the hour's reports wrote it", "after the hour"):
        sizes = result[f"state item bytes {when}"]
        lines += ["", f"The state item {when}, as DynamoDB bills its writes: "
                  + "; ".join(f"{arm}: {', '.join(map(str, values))} bytes" for arm, values in sizes.items()) + "."]
    added = result["bytes of the identity attributes"]
    lines += ["", "What the identity attributes take on the state item (bytes, as billed), of a device holding: "
              + ", ".join(f"{path} {size}" for path, size in added.items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4, help="devices in each set")
    parser.add_argument("--reports-per-desire", type=int, default=REPORTS_PER_DESIRE,
                        help="reports before each measured desire (the reference fleet's hour)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--endpoint", help="a running DynamoDB Local (default: one started for the run)")
    args = parser.parse_args(argv)
    with dynamodb_local(args.endpoint) as dynamodb:
        result = measure(dynamodb.endpoint, args.devices, args.reports_per_desire)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "identity_units.json").write_text(json.dumps(result, indent=2))
    text = markdown(result)
    (out / "identity_units.md").write_text(text)
    print(text, end="")
    print(f"wrote {out}/identity_units.json, identity_units.md")
    return result


if __name__ == "__main__":
    main()
