"""The OpenAPI document drives schemathesis against the real dev server: every request it
generates from the document is answered without a 5xx, with a documented status and
content type. (Its strategies are used through plain hypothesis: its pytest plugin does
not run under the pinned pytest 9.)"""

from __future__ import annotations

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import checks

from functions.api.openapi import OPENAPI
from functions.device_state.model.values import dumps
from tests.api.test_http import server  # noqa: F401  (the real server, module scoped)
from tests.auth import bearer

pytestmark = pytest.mark.dynamodb_local


def history_is_off(response) -> bool:
    """The documented 503 of an older version that the history has not recorded: this server
    runs no stream processor (test_http's ``server``), so its history never records one. A HEAD
    has no body to say so: its path and Retry-After tell."""
    if response.status_code != 503:
        return False
    if response.request.method == "HEAD":
        return "/versions/" in response.request.url and "retry-after" in {name.lower() for name in response.headers}
    return "not-yet-recorded" in response.text

_SCHEMA = schemathesis.openapi.from_dict(json.loads(dumps(OPENAPI)))
_OPERATIONS = [result.ok() for result in _SCHEMA.get_all_operations()]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(_OPERATIONS).flatmap(lambda operation: operation.as_strategy()))
def test_requests_generated_from_the_document(server, case):  # noqa: F811
    response = case.call(base_url=f"http://127.0.0.1:{server.port}", timeout=30, headers=bearer())
    if history_is_off(response):
        return
    case.validate_response(response, checks=[checks.not_a_server_error, checks.status_code_conformance,
                                             checks.content_type_conformance])
