"""A stack deployed from an earlier release updates in place: CloudFormation refuses an update
that gives a logical id another resource type ("Update of resource type is not permitted"),
so a construct whose resource changes kind gets a new id (released_template_types.json holds
the ids and types of the release before the HTTP API)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk.assertions import Template

from tests.infra.conftest import synth_stack
from tests.infra.test_auth_stack import DEVICE_DOMAIN

RELEASED = json.loads((Path(__file__).parent / "released_template_types.json").read_text())
CONTEXTS = {"default": {}, "device domain": DEVICE_DOMAIN,
            "fleet index": {"fleetIndex": "reported/firmware:string,reported/online:boolean"}}


@pytest.mark.parametrize("label", sorted(CONTEXTS))
def test_no_logical_id_of_the_released_template_changes_its_type(label):
    _, stack = synth_stack(CONTEXTS[label])
    resources = Template.from_stack(stack).to_json()["Resources"]
    released = RELEASED[label]
    changed = {logical: (was, resources[logical]["Type"]) for logical, was in released.items()
               if logical in resources and resources[logical]["Type"] != was}
    assert not changed, f"CloudFormation would refuse to update these resources' types: {changed}"
    assert set(released) & set(resources)  # the same stack: most resources keep their ids
