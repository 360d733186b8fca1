"""`make invoke EVENT=events/x.json`: replay one API Gateway event through the real
``lambda_handler`` against an in-process moto table seeded with one device, and print
the response. (moto is fine for one event at a time; it is never used concurrently.)"""

from __future__ import annotations

import json
import os
import secrets
import sys

SEED_DEVICE = ("lamp-1", {"power": "on", "brightness": 50})


def invoke(event: dict) -> dict:
    for name, value in {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
                        "TABLE_NAME": "devices", "POWERTOOLS_TRACE_DISABLED": "true",
                        "POWERTOOLS_METRICS_DISABLED": "true",
                        "CURSOR_KEY": secrets.token_hex(32)}.items():  # one event: any key will do
        os.environ.setdefault(name, value)
    os.environ.pop("DYNAMODB_ENDPOINT", None)
    from moto import mock_aws

    with mock_aws():
        from functions.api import handler
        from functions.device_state import DeviceStateManager, dynamodb_client
        from functions.device_state.table import create_table
        from localdev.apigw import LambdaContext

        client = dynamodb_client()
        create_table(client, os.environ["TABLE_NAME"])
        DeviceStateManager(client, os.environ["TABLE_NAME"]).create(*SEED_DEVICE)
        return handler.lambda_handler(event, LambdaContext())


def main(argv=None) -> None:
    argv = argv if argv is not None else sys.argv[1:]
    if len(argv) != 1:
        sys.exit("usage: python -m localdev.invoke events/<name>.json")
    with open(argv[0]) as file:
        event = json.load(file)
    response = invoke(event)
    body = response.get("body")
    try:
        response["body"] = json.loads(body) if body else body
    except ValueError:
        pass
    print(json.dumps(response, indent=2))


if __name__ == "__main__":
    main()
