import os
from pathlib import Path

import pytest

# jsii runs `node` from PATH: the repo's pinned Node 22 (node_modules/.bin/node, installed by
# make's npm step) comes first, as in the Makefile, so no end-of-life warning is printed.
_NODE_BIN = Path(__file__).resolve().parents[2] / "node_modules" / ".bin"
os.environ["PATH"] = f"{_NODE_BIN}{os.pathsep}{os.environ.get('PATH', '')}"

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
