import os

import pytest

# The machines run Node 20, which jsii calls end-of-life on every start; it still works.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402

from infra.nag import acknowledge_reviewed_findings, add_checks  # noqa: E402
from infra.stack import DeviceStateStack  # noqa: E402

# Asset bundling (pip) is exercised by the CLI synth test; property tests skip it.
NO_BUNDLING = {"aws:cdk:bundling-stacks": []}


def synth_stack(context: dict | None = None, nag: bool = False):
    app = cdk.App(context={**NO_BUNDLING, **(context or {})})
    stack = DeviceStateStack(app, "DeviceStateStack")
    if nag:
        add_checks(app)
        acknowledge_reviewed_findings(stack)
    return app, stack


@pytest.fixture(scope="session")
def template() -> Template:
    _, stack = synth_stack()
    return Template.from_stack(stack)
