"""`make bench` → identity: devices proving themselves, through the real dev server on DynamoDB Local.

- Assertion → token: ``--exchanges`` sequential ``POST /devices/{id}/token``, each with a new
  assertion (HS256 with a registered secret; ES256 with a registered EC P-256 key), signed by the
  device client (clients/python) before the clock starts: p50 and p95 of the round trip (the
  credential and the device read together, the secret opened, the signature checked, the ``jti``
  spent, a device token signed).
- Provisioning: ``--devices`` devices provisioning themselves by one enrollment
  (``POST /devices/{id}/provision`` with the key derived for each) from ``--provisioners``
  concurrent callers (a list: one enrollment and one run per entry): provisions per second and
  p50/p95 per provisioning. A caller asks again after a 503 or 429, as a device does; every device
  is created once and counted once (the enrollment's ``provisioned`` equals its devices).

Writes bench/out/identity.{json,md} (``--out``; ``make bench UPDATE_RESULTS=1``: bench/results/).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(1, str(REPO_ROOT / "clients" / "python"))  # the device client signs the assertions
for _name, _value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                      "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
    os.environ.setdefault(_name, _value)

from bench import credentials  # noqa: E402
from bench.feed import percentile, wait_for  # noqa: E402
from device_state_client import derive_device_key, sign_assertion  # noqa: E402
from localdev.dynamodb_local import dynamodb_local, free_port  # noqa: E402

OUT = REPO_ROOT / "bench" / "out"
BACK_END = {"Authorization": "Bearer " + credentials.ISSUER.token(
    ("devices.read", "devices.write", "devices.admin"), lifetime=12 * 3600)}
WORKERS = 4
TRIES = 8  # a provisioning asked again after 503/429 at most this often


def request(port: int, method: str, path: str, body=None, headers=None) -> tuple[int, dict, float]:
    """(status, answer, milliseconds from sending to the whole answer read)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = None if body is None else json.dumps(body).encode()
        started = time.perf_counter()
        connection.request(method, path, body=data,
                           headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        payload = response.read()
        elapsed = (time.perf_counter() - started) * 1000
        return response.status, (json.loads(payload) if payload else {}), elapsed
    finally:
        connection.close()


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def exchanges(port: int, count: int, warm: int) -> dict:
    """p50/p95 of assertion → token for a secret (HS256) and an EC key (ES256)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    figures = {}
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    for kind, body, signer in (
            ("HS256 secret", {"type": "secret"}, lambda device, added: {"secret": added["secret"]}),
            ("ES256 key", {"type": "publicKey", "publicKey": public}, lambda device, added: {"private_key": key})):
        device = f"exchange-{uuid.uuid4().hex[:8]}"
        assert request(port, "POST", "/devices", {"deviceId": device, "state": {}}, BACK_END)[0] == 201
        status, added, _ = request(port, "POST", f"/devices/{device}/credentials", body, BACK_END)
        assert status == 201, added
        signing = signer(device, added)
        timings = []
        for number in range(warm + count):
            assertion = sign_assertion(device, added["credentialId"], **signing)
            status, answer, elapsed = request(port, "POST", f"/devices/{device}/token", headers=bearer(assertion))
            assert status == 200, answer
            if number >= warm:
                timings.append(elapsed)
        token = answer["token"]
        assert request(port, "GET", f"/devices/{device}", headers=bearer(token))[0] == 200  # a working token
        figures[kind] = {"exchanges": count, "p50_ms": percentile(timings, 0.5),
                         "p95_ms": percentile(timings, 0.95), "max_ms": round(max(timings), 1)}
    return figures


def provisioning(port: int, devices: int, provisioners: int) -> dict:
    """``devices`` devices provisioned by one enrollment from ``provisioners`` concurrent callers."""
    status, enrollment, _ = request(port, "POST", "/enrollments", {
        "idPattern": "plug-[0-9a-f]{8}-[0-9]+", "maxDevices": devices,
        "initial": {"state": {"line": "bench"}, "desired": {"power": "on"}}}, BACK_END)
    assert status == 201, enrollment
    line = uuid.uuid4().hex[:8]
    ids = [f"plug-{line}-{number}" for number in range(devices)]
    keys = {device: derive_device_key(enrollment["groupKey"], device) for device in ids}

    def provision(device):
        tries, spent = 0, 0.0
        while True:
            tries += 1
            assertion = sign_assertion(device, enrollment["enrollmentId"], secret=keys[device])
            status, answer, elapsed = request(port, "POST", f"/devices/{device}/provision",
                                              headers=bearer(assertion))
            spent += elapsed
            if status not in (429, 503) or tries == TRIES:
                return status, answer.get("credentialId"), spent, tries
            time.sleep(min(1.0, 0.05 * 2 ** tries))

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=provisioners) as pool:
        answers = list(pool.map(provision, ids))
    seconds = time.perf_counter() - started
    status, counted, _ = request(port, "GET", f"/enrollments/{enrollment['enrollmentId']}", headers=BACK_END)
    assert status == 200, counted
    timings = [spent for _, _, spent, _ in answers]
    return {"provisioners": provisioners, "devices": devices, "seconds": round(seconds, 2),
            "per_second": round(devices / seconds, 1), "p50_ms": percentile(timings, 0.5),
            "p95_ms": percentile(timings, 0.95), "statuses": dict(Counter(str(status) for status, *_ in answers)),
            "asked_again": sum(tries - 1 for *_, tries in answers), "provisioned": counted["provisioned"],
            "credentials": len({credential for _, credential, _, _ in answers if credential})}


def markdown(result: dict) -> str:
    lines = [f"# Devices' identity through the dev server on DynamoDB Local ({result['workers']} workers)", "",
             "| what | p50 | p95 | rate |", "|---|---|---|---|"]
    for kind, figures in result["assertion_to_token"].items():
        lines.append(f"| assertion → token, {kind} ({figures['exchanges']} in turn) | {figures['p50_ms']} ms | "
                     f"{figures['p95_ms']} ms | |")
    for run in result["provisioning"]:
        lines.append(f"| provisioning, {run['provisioners']} at once ({run['devices']} devices) | "
                     f"{run['p50_ms']} ms | {run['p95_ms']} ms | {run['per_second']} a second |")
    lines += ["", "Every device provisioned once: " + "; ".join(
        f"{run['provisioners']} at once: answers {run['statuses']}, asked again {run['asked_again']}, "
        f"enrollment's count {run['provisioned']} of {run['devices']}, {run['credentials']} credentials"
        for run in result["provisioning"]) + ".", ""]
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchanges", type=int, default=300, help="assertions exchanged for tokens, per kind")
    parser.add_argument("--devices", type=int, default=300, help="devices provisioned in each run")
    parser.add_argument("--provisioners", default="1,8", help="concurrent provisioning callers, one run each")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--endpoint", help="a running DynamoDB Local (default: one started for the run)")
    args = parser.parse_args(argv)
    with dynamodb_local(args.endpoint) as dynamodb:
        port = free_port()
        env = dict(os.environ, **credentials.server_environment(), DYNAMODB_ENDPOINT=dynamodb.endpoint,
                   TABLE_NAME=f"identity-{uuid.uuid4().hex[:8]}", PORT=str(port), WORKERS=str(WORKERS),
                   STREAM_PROCESSOR="off", POWERTOOLS_LOG_LEVEL="ERROR")
        server = subprocess.Popen([sys.executable, "-m", "localdev.server"], env=env, cwd=REPO_ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(port)
            result = {"workers": WORKERS,
                      "assertion_to_token": exchanges(port, args.exchanges, warm=4 * WORKERS),
                      "provisioning": [provisioning(port, args.devices, int(provisioners))
                                       for provisioners in args.provisioners.split(",")]}
        finally:
            server.terminate()
            server.wait(timeout=30)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "identity.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "identity.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
