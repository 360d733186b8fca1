"""``make reindex``: backfill the fleet index of the fields ``FLEET_INDEX`` declares on a
local table that already holds devices, showing progress; resumable (run it again after
an interruption and it goes on). ``make serve`` runs the same step at start.

It works on ``DYNAMODB_ENDPOINT`` when set (a running ``make serve``'s DynamoDB Local,
whose endpoint ``make serve`` prints), else on the table kept on disk in
``DYNAMODB_DATA_DIR`` (DynamoDB Local started on it for the run)."""

from __future__ import annotations

import os
import sys


def prepare(client, table_name: str, fleet_index, out=sys.stdout, stream: bool = True) -> None:
    """The table with an index per declared field, every field's index filled (a new table's
    stream as ``create_table``'s)."""
    from functions.device_state import DeviceStateManager
    from functions.device_state.table import ensure_table

    ensure_table(client, table_name, fleet_index, stream)
    if not fleet_index:
        return
    manager = DeviceStateManager(client, table_name, fleet_index=fleet_index)

    def report(progress: dict) -> None:
        state = "done" if progress["done"] else "going on"
        print(f"reindex: {progress['scanned']} devices scanned, {state}", file=out, flush=True)

    manager.reindex(report=report)
    print(f"fleet index ready: {fleet_index.declaration}", file=out, flush=True)


def main() -> int:
    import boto3

    from functions.config import ConfigError, fleet_index

    for name, value in (("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_ACCESS_KEY_ID", "local"),
                        ("AWS_SECRET_ACCESS_KEY", "local")):
        os.environ.setdefault(name, value)  # DynamoDB Local takes any
    try:
        declared = fleet_index()
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    if not declared:
        print("FLEET_INDEX declares no field, e.g. FLEET_INDEX=reported/firmware:string", file=sys.stderr)
        return 2
    endpoint, data_dir, local = os.environ.get("DYNAMODB_ENDPOINT"), os.environ.get("DYNAMODB_DATA_DIR"), None
    if not endpoint:
        if not data_dir:
            print("give DYNAMODB_ENDPOINT (a running make serve's, which it prints) or DYNAMODB_DATA_DIR",
                  file=sys.stderr)
            return 2
        from localdev.dynamodb_local import DynamoDBLocal

        local = DynamoDBLocal(data_dir=data_dir).start()
        endpoint = local.endpoint
    try:
        client = boto3.session.Session().client("dynamodb", endpoint_url=endpoint)
        prepare(client, os.environ.get("TABLE_NAME", "devices"), declared)
    finally:
        if local:
            local.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
