#!/usr/bin/env python3
"""CDK app: the device-state stack. Environment-agnostic unless CDK_DEFAULT_ACCOUNT and
CDK_DEFAULT_REGION are set (as `cdk deploy` does with credentials)."""

import os

import aws_cdk as cdk

from infra.nag import acknowledge_reviewed_findings, add_checks
from infra.stack import DeviceStateStack

app = cdk.App()
account, region = os.environ.get("CDK_DEFAULT_ACCOUNT"), os.environ.get("CDK_DEFAULT_REGION")
stack = DeviceStateStack(
    app, "DeviceStateStack",
    env=cdk.Environment(account=account, region=region) if account and region else None,
)
add_checks(app)
acknowledge_reviewed_findings(stack)
app.synth()
