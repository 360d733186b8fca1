"""The `device-state` command (clients/python's cli extra), every command run as a subprocess as
a person or a script runs it, against the real dev server on DynamoDB Local: each once applied
(exit 0, its output) and once refused (its exit status and the problem it prints on stderr).
Exit statuses: 0 applied, 1 refused by the service, 2 usage, 3 outcome unknown or unavailable."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid

import pytest
import yaml

from functions.auth.principals import READ_SCOPE, WRITE_SCOPE
from tests.api.test_http import launch
from tests.auth import token
from tests.make_serve import REPO_ROOT

pytestmark = pytest.mark.dynamodb_local
APPLIED, REFUSED, USAGE, UNKNOWN = 0, 1, 2, 3
COMMAND = [sys.executable, "-m", "device_state_client.cli"]


@pytest.fixture(scope="module")
def server(dynamodb_local):
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"cli-{uuid.uuid4().hex[:8]}",
                                WORKERS="6", FLEET_INDEX="reported/firmware:string,state/site:string")
    yield candidate
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture
def cli(server, tmp_path):
    """``cli(*arguments, input=None, **environment)``: the command's CompletedProcess, run with
    the service's endpoint and a token with every scope in its environment (as a shell that
    exported DEVICE_STATE_ENDPOINT and DEVICE_STATE_TOKEN), piped (stdin and stdout no terminal).
    ``cli.start(*arguments)``: the same, running (a Popen)."""
    def environment(**settings) -> dict:
        settings = {"DEVICE_STATE_ENDPOINT": f"http://127.0.0.1:{server.port}", "DEVICE_STATE_TOKEN": token(),
                    "DEVICE_STATE_CONFIG": str(tmp_path / "config"), **settings}
        env = {key: value for key, value in os.environ.items() if not key.startswith("DEVICE_STATE_")}
        env.update({key: value for key, value in settings.items() if value is not None})
        env["PYTHONPATH"] = str(REPO_ROOT / "clients" / "python")
        return env

    def run(*arguments, input=None, **settings):
        return subprocess.run([*COMMAND, *arguments], input=input, capture_output=True, text=True,
                              env=environment(**settings), cwd=tmp_path, timeout=120,
                              stdin=None if input is not None else subprocess.DEVNULL)

    def start(*arguments, **settings):
        return subprocess.Popen([*COMMAND, *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=environment(**settings), cwd=tmp_path, stdin=subprocess.DEVNULL)

    run.start = start
    return run


def _new(cli, body: str = '{"state": {"site": "berlin-1"}, "reported": {"firmware": "1.0"}}') -> str:
    device = f"cli-{uuid.uuid4().hex[:8]}"
    created = cli("create", device, body)
    assert created.returncode == APPLIED, created.stderr
    return device


def _refused(result, status: int, slug: str, exit_status: int = REFUSED) -> None:
    assert result.returncode == exit_status, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.startswith(f"error: {status} {slug}: "), result.stderr
    assert result.stdout == ""


def test_create_prints_the_device_and_a_second_create_is_refused_409(cli):
    device = f"cli-{uuid.uuid4().hex[:8]}"
    created = cli("create", device, '{"state": {"level": 0.10000000000000000000000000000000000001}, '
                                    '"desired": {"power": "on"}}')
    assert created.returncode == APPLIED, created.stderr
    assert '"level": 0.10000000000000000000000000000000000001' in created.stdout  # every digit, both ways
    answer = json.loads(created.stdout)
    assert (answer["version"], answer["delta"]) == (1, {"power": "on"})
    _refused(cli("create", device), 409, "device-exists")
    assert "currentVersion: 1" in cli("create", device).stderr


def test_json_comes_from_the_argument_a_file_or_stdin_and_bad_json_is_a_usage_error(cli, tmp_path):
    (tmp_path / "lamp.json").write_text('{"state": {"from": "file"}}')
    from_file, from_stdin = f"cli-{uuid.uuid4().hex[:8]}", f"cli-{uuid.uuid4().hex[:8]}"
    assert json.loads(cli("create", from_file, "@lamp.json").stdout)["state"] == {"from": "file"}
    assert json.loads(cli("create", from_stdin, "-", input='{"state": {"from": "stdin"}}').stdout)["state"] == {
        "from": "stdin"}
    bad = cli("create", f"cli-{uuid.uuid4().hex[:8]}", '{"state": ')
    assert bad.returncode == USAGE and "is not JSON" in bad.stderr
    assert cli("create", "x", "@missing.json").returncode == USAGE


def test_get_shows_a_device_and_a_missing_one_is_404(cli):
    device = _new(cli)
    shown = cli("get", device, "--include", "metadata")
    assert shown.returncode == APPLIED and json.loads(shown.stdout)["metadata"]["reported"]["firmware"]["version"] == 1
    _refused(cli("get", f"{device}-none"), 404, "device-not-found")
    assert cli("get", device, "--include", "bogus").returncode == USAGE


def test_the_output_is_json_piped_and_a_table_or_yaml_when_asked(cli):
    device = _new(cli)
    table = cli("get", device, "-o", "table")
    assert table.returncode == APPLIED and table.stdout.split()[:2] == ["FIELD", "VALUE"]
    assert f"deviceId   {device}" in table.stdout
    document = yaml.safe_load(cli("get", device, "-o", "yaml").stdout)
    assert document["deviceId"] == device and document["reported"] == {"firmware": "1.0"}
    assert yaml.safe_load(cli("list", "--filter", f'eq(state/site,"{device}")', "-o", "yaml").stdout) == []


def test_put_replaces_at_a_version_and_a_stale_if_match_is_412(cli):
    device = _new(cli)
    replaced = cli("put", device, '{"state": {"site": "paris-2"}}', "--if-match", "1")
    assert replaced.returncode == APPLIED and json.loads(replaced.stdout)["state"] == {"site": "paris-2"}
    _refused(cli("put", device, '{"state": {}}', "--if-match", "1"), 412, "precondition-failed")
    _refused(cli("put", device, '{"state": {}}', "--create-only"), 412, "precondition-failed")
    assert cli("put", device, '{"state": {}}', "--if-match", "0").returncode == USAGE


def test_patch_by_merge_or_json_patch_and_a_stale_if_match_is_412(cli):
    device = _new(cli, '{"state": {"brightness": 50}}')
    merged = cli("patch", device, "--merge", '{"power": "on"}', "--if-match", "1")
    assert merged.returncode == APPLIED and json.loads(merged.stdout)["state"] == {"brightness": 50, "power": "on"}
    incremented = cli("patch", device, "--json-patch", '[{"op": "increment", "path": "/brightness", "value": 10}]')
    assert json.loads(incremented.stdout)["state"]["brightness"] == 60
    refused = cli("patch", device, "--merge", '{"brightness": 25}', "--if-match", "1")
    _refused(refused, 412, "version-conflict")
    assert "currentVersion: 3" in refused.stderr
    _refused(cli("patch", device, "--json-patch", '[{"op": "test", "path": "/power", "value": "off"}]'), 409,
             "patch-test-failed")
    assert cli("patch", device).returncode == USAGE  # neither --merge nor --json-patch
    assert cli("patch", device, "--json-patch", '{"power": "on"}').returncode == USAGE


def test_desire_with_its_options_report_and_delta_and_their_refusals(cli):
    device = _new(cli, '{"state": {}, "reported": {"power": "off"}}')
    desired = cli("desire", device, '{"power": "on", "brightness": 80}', "--expires-in", "3600", "--clear-on-confirm")
    assert desired.returncode == APPLIED and json.loads(desired.stdout)["delta"] == {"power": "on", "brightness": 80}
    metadata = json.loads(cli("get", device, "--include", "metadata").stdout)["metadata"]["desired"]["power"]
    assert metadata["clearOnConfirm"] is True and "expiresAt" in metadata
    delta = cli("delta", device)
    assert delta.returncode == APPLIED and json.loads(delta.stdout) == {
        "deviceId": device, "version": 2, "delta": {"power": "on", "brightness": 80}}
    reported = cli("report", device, '{"power": "on", "brightness": 80}')
    assert reported.returncode == APPLIED
    assert (json.loads(reported.stdout)["delta"], json.loads(reported.stdout)["desired"]) == ({}, {})  # cleared
    _refused(cli("desire", f"{device}-none", '{"power": "on"}'), 404, "device-not-found")
    _refused(cli("report", device, '{"power": "off"}', DEVICE_STATE_TOKEN=token((READ_SCOPE, WRITE_SCOPE))), 403,
             "forbidden")
    _refused(cli("delta", device, "--since", "99"), 400, "invalid-since")
    assert cli("desire", device, '{"power": "on"}', "--expires-in", "0").returncode == USAGE
    assert cli("desire", device, '"on"').returncode == USAGE


def test_list_pipes_one_json_array_and_a_bad_filter_is_400(cli):
    site = f"site-{uuid.uuid4().hex[:6]}"
    devices = sorted(_new(cli, json.dumps({"state": {"site": site}})) for _ in range(3))
    listed = cli("list", "--filter", f'eq(state/site,"{site}")', "--page-size", "2")
    assert listed.returncode == APPLIED
    assert sorted(device["deviceId"] for device in json.loads(listed.stdout)) == devices
    assert len(json.loads(cli("list", "--filter", f'eq(state/site,"{site}")', "--limit", "2").stdout)) == 2
    everything = json.loads(cli("list").stdout)
    assert set(devices) <= {device["deviceId"] for device in everything}
    assert "\x1b" not in listed.stdout + listed.stderr  # no colour, no progress: nothing of a terminal in a pipe
    _refused(cli("list", "--filter", "eq(state/site,"), 400, "invalid-filter")
    assert "position: 14" in cli("list", "--filter", "eq(state/site,").stderr


def test_count_groups_and_an_undeclared_field_is_400(cli):
    site = f"site-{uuid.uuid4().hex[:6]}"
    for firmware in ("1.0", "1.0", "2.0"):
        _new(cli, json.dumps({"state": {"site": site}, "reported": {"firmware": firmware}}))
    counted = cli("count", "--filter", f'eq(state/site,"{site}")', "--group-by", "reported/firmware")
    assert counted.returncode == APPLIED
    assert json.loads(counted.stdout) == {"count": 3, "groups": [{"value": "1.0", "count": 2},
                                                                  {"value": "2.0", "count": 1}]}
    _refused(cli("count", "--filter", "exists(delta)"), 400, "unindexed-filter")
    assert cli("count").returncode == USAGE  # a count needs a filter


def _until_recorded(cli, device: str, version: int) -> list:
    deadline = time.monotonic() + 30
    while True:
        changes = json.loads(cli("changes", device).stdout)
        if changes and changes[-1]["version"] >= version:
            return changes
        assert time.monotonic() < deadline, changes
        time.sleep(0.3)


def test_changes_history_and_their_refusals(cli):
    device = _new(cli)
    cli("patch", device, "--merge", '{"n": 1}')
    changes = _until_recorded(cli, device, 2)
    assert [(change["version"], change["kind"]) for change in changes] == [(1, "created"), (2, "updated")]
    assert [change["version"] for change in json.loads(cli("changes", device, "--since", "1").stdout)] == [2]
    followed = cli("changes", device, "--follow", "--count", "2")  # one JSON document a line
    assert followed.returncode == APPLIED
    assert [json.loads(line)["version"] for line in followed.stdout.splitlines()] == [1, 2]
    at_one = cli("history", device, "1")
    assert at_one.returncode == APPLIED and json.loads(at_one.stdout)["state"] == {"site": "berlin-1"}
    _refused(cli("changes", device, "--since", "9"), 400, "invalid-since")
    _refused(cli("history", device, "9"), 404, "version-not-found")


def test_watch_prints_each_version_pushed_and_a_device_it_may_not_follow_ends_it(cli):
    device = _new(cli)
    cli("desire", device, '{"power": "on"}')
    watched = cli("watch", device, "--since", "0", "--count", "2")
    assert watched.returncode == APPLIED, watched.stderr
    events = [json.loads(line) for line in watched.stdout.splitlines()]
    assert [(event["version"], event["kind"], event["delta"]) for event in events] == [
        (1, "created", {}), (2, "updated", {"power": "on"})]
    other = _new(cli)
    refused = cli("watch", device, other, "--since", "0", DEVICE_STATE_TOKEN=token(device=device))
    assert refused.returncode == REFUSED and refused.stderr.startswith(f"error: {other}: 403 forbidden"), refused.stderr


def test_tx_applies_all_or_nothing_and_names_each_failing_operation(cli, tmp_path):
    first, second = _new(cli), _new(cli)
    (tmp_path / "operations.json").write_text(json.dumps({"operations": [
        {"deviceId": first, "mergePatch": {"scene": "evening"}}, {"deviceId": second, "delete": True}]}))
    applied = cli("tx", "operations.json")
    assert applied.returncode == APPLIED, applied.stderr
    assert [device and device["version"] for device in json.loads(applied.stdout)["devices"]] == [2, None]
    refused = cli("tx", "-", input=json.dumps([{"deviceId": first, "check": True, "ifMatch": '"1"'},
                                               {"deviceId": second, "mergePatch": {"n": 1}}]))
    assert refused.returncode == REFUSED and refused.stderr.startswith("error: 409 transaction-failed"), refused.stderr
    assert f"operations[0] {first}: 412" in refused.stderr and f"operations[1] {second}: 404" in refused.stderr
    assert json.loads(cli("get", first).stdout)["version"] == 2  # nothing of the refused one written


def test_lease_runs_a_command_whose_writes_carry_the_token_and_a_busy_lease_is_409(cli, server):
    device = _new(cli)
    held = cli("lease", device, "--ttl", "30", "--owner", "cli-test", "--", sys.executable, "-c",
               "import os, subprocess, sys\n"
               f"done = subprocess.run([sys.executable, '-m', 'device_state_client.cli', 'patch', '{device}', "
               "'--merge', '{\"job\": \"firmware\"}'], capture_output=True, text=True)\n"
               "print(os.environ['DEVICE_STATE_FENCING_TOKEN'], done.returncode, done.stderr)\n"
               "sys.exit(7)")
    assert held.returncode == 7, held.stderr  # the command's own status
    assert held.stdout.split()[:2] == ["1", "0"], held.stdout  # its patch carried the lease's token
    assert json.loads(cli("get", device).stdout)["state"]["job"] == "firmware"
    assert json.loads(cli("patch", device, "--merge", '{"job": null}').stdout)["version"] == 3  # released
    first = cli.start("lease", device, "--", "sleep", "20")
    try:
        _until_held(server, device)
        _refused(cli("lease", device, "--", "true"), 409, "lease-busy")
        _refused(cli("patch", device, "--merge", '{"job": "other"}'), 423, "locked")  # outside the lease
    finally:
        first.kill()
        first.wait()


def test_a_lease_ended_under_its_command_stops_the_command_and_exits_1(cli, server):
    device = _new(cli)
    running = cli.start("lease", device, "--ttl", "2", "--", "sleep", "60")
    try:
        holder = _until_held(server, device)
        started = time.monotonic()
        assert server.request("DELETE", f"/devices/{device}/leases/{holder['fencingToken']}")[0] == 204
        _, stderr = running.communicate(timeout=30)
        assert running.returncode == REFUSED and time.monotonic() - started < 10  # not the command's 60 s
        assert stderr.startswith("error: 410 lease-gone") and "it was stopped" in stderr, stderr
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()


def _until_held(server, device: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        holder = json.loads(server.request("GET", f"/devices/{device}/leases")[2])["holder"]
        if holder:
            return holder
        assert time.monotonic() < deadline, "the lease was never held"
        time.sleep(0.1)


def test_delete_asks_nothing_when_piped_and_a_stale_if_match_is_412(cli):
    device = _new(cli)
    _refused(cli("delete", device, "--if-match", "5"), 412, "version-conflict")
    deleted = cli("delete", device)  # stdin is no terminal: no question
    assert (deleted.returncode, deleted.stdout, deleted.stderr) == (APPLIED, "", "")
    _refused(cli("get", device), 404, "device-not-found")
    _refused(cli("delete", device), 404, "device-not-found")


def test_credentials_add_list_and_revoke_and_their_refusals(cli, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    device = _new(cli)
    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    (tmp_path / "lamp.pub.pem").write_bytes(key.public_bytes(serialization.Encoding.PEM,
                                                             serialization.PublicFormat.SubjectPublicKeyInfo))
    added = cli("credentials", "add", device, "--public-key", "@lamp.pub.pem", "--expires-at", "2099-01-01T00:00:00Z")
    assert added.returncode == APPLIED, added.stderr
    public = json.loads(added.stdout)
    assert public["type"] == "publicKey" and public["expiresAt"].startswith("2099-01-01")
    secret = json.loads(cli("credentials", "add", device, "--secret").stdout)
    assert secret["type"] == "secret" and len(base64.b64decode(secret["secret"])) >= 32  # shown this once
    listed = cli("credentials", "list", device)
    assert listed.returncode == APPLIED
    assert sorted(item["credentialId"] for item in json.loads(listed.stdout)) == sorted(
        [public["credentialId"], secret["credentialId"]])
    assert "secret" not in listed.stdout.replace('"type": "secret"', "")
    table = cli("credentials", "list", device, "-o", "table")
    assert "CREDENTIAL" in table.stdout and public["credentialId"] in table.stdout
    revoked = cli("credentials", "revoke", device, secret["credentialId"])
    assert (revoked.returncode, revoked.stdout, revoked.stderr) == (APPLIED, "", "")
    assert [item["credentialId"] for item in json.loads(cli("credentials", "list", device).stdout)] == [
        public["credentialId"]]
    _refused(cli("credentials", "revoke", device, secret["credentialId"]), 404, "credential-not-found")
    _refused(cli("credentials", "add", device, "--public-key", "not a key"), 400, "invalid-credential")
    _refused(cli("credentials", "list", device, DEVICE_STATE_TOKEN=token((READ_SCOPE, WRITE_SCOPE))), 403,
             "forbidden")
    both = cli("credentials", "add", device, "--secret", "--public-key", "@lamp.pub.pem")
    assert both.returncode == USAGE and "one of --public-key" in both.stderr


def test_enrollments_create_list_show_and_delete_and_their_refusals(cli):
    name = f"line-{uuid.uuid4().hex[:8]}"
    created = cli("enrollments", "create", "--enrollment-id", name, "--id-pattern", "lamp-[0-9]{4}",
                  "--max-devices", "100", "--initial", '{"desired": {"power": "off"}}')
    assert created.returncode == APPLIED, created.stderr
    enrollment = json.loads(created.stdout)
    assert enrollment["enrollmentId"] == name and enrollment["provisioned"] == 0
    assert len(base64.b64decode(enrollment["groupKey"])) == 32  # shown this once
    assert enrollment["initial"] == {"desired": {"power": "off"}}
    listed = json.loads(cli("enrollments", "list").stdout)
    assert name in [item["enrollmentId"] for item in listed] and "groupKey" not in json.dumps(listed)
    shown = cli("enrollments", "show", name, "-o", "yaml")
    assert shown.returncode == APPLIED and yaml.safe_load(shown.stdout)["maxDevices"] == 100
    assert "groupKey" not in shown.stdout
    _refused(cli("enrollments", "create", "--enrollment-id", name, "--id-pattern", "x", "--max-devices", "1"),
             409, "enrollment-exists")
    deleted = cli("enrollments", "delete", name)
    assert (deleted.returncode, deleted.stdout, deleted.stderr) == (APPLIED, "", "")
    _refused(cli("enrollments", "show", name), 404, "enrollment-not-found")
    _refused(cli("enrollments", "list", DEVICE_STATE_TOKEN=token((READ_SCOPE, WRITE_SCOPE))), 403, "forbidden")
    bad = cli("enrollments", "create", "--id-pattern", "x", "--max-devices", "1", "--initial", "[]")
    assert bad.returncode == USAGE and "--initial" in bad.stderr


def test_credentials_and_endpoint_refusals_and_a_service_that_does_not_answer(cli):
    device = _new(cli)
    _refused(cli("get", device, DEVICE_STATE_TOKEN="not-a-token"), 401, "unauthorized")
    no_endpoint = cli("get", device, DEVICE_STATE_ENDPOINT=None)
    assert no_endpoint.returncode == USAGE and "no endpoint" in no_endpoint.stderr
    no_token = cli("get", device, DEVICE_STATE_TOKEN=None)
    assert no_token.returncode == USAGE and "no credentials" in no_token.stderr
    unanswered = cli("patch", device, "--merge", '{"n": 1}', "--idempotency-key", "k-1",
                     DEVICE_STATE_ENDPOINT="http://127.0.0.1:1")
    assert unanswered.returncode == UNKNOWN and "no answer from http://127.0.0.1:1" in unanswered.stderr
    assert "the write was not applied: no copy of it reached the service" in unanswered.stderr  # nothing listens
    assert "--idempotency-key k-1" in unanswered.stderr
    failing = cli("get", device, DEVICE_STATE_TOKEN=None, DEVICE_STATE_TOKEN_COMMAND="exit 4")
    assert failing.returncode == USAGE and "the token command exited 4" in failing.stderr


def test_a_write_sent_again_with_its_idempotency_key_answers_as_the_first_and_applies_once(cli):
    device = _new(cli, '{"state": {"n": 0}}')
    increment = ("patch", device, "--json-patch", '[{"op": "increment", "path": "/n", "value": 1}]',
                 "--idempotency-key", f"k-{device}")
    first, again = cli(*increment), cli(*increment)
    assert first.returncode == again.returncode == APPLIED
    assert json.loads(first.stdout) == json.loads(again.stdout)
    assert json.loads(cli("get", device).stdout)["state"]["n"] == 1
    _refused(cli("patch", device, "--merge", '{"n": 5}', "--idempotency-key", f"k-{device}"), 422,
             "idempotency-key-reused")


def test_configure_saves_a_profile_that_a_later_run_uses_and_options_and_the_environment_come_first(cli, server):
    device = _new(cli)
    saved = cli("configure", "--profile", "lab", "--endpoint", f"http://127.0.0.1:{server.port}",
                "--token-command", f"echo {token()}")
    assert saved.returncode == APPLIED and "token_command = echo" in saved.stdout
    from_profile = cli("--profile", "lab", "get", device, DEVICE_STATE_ENDPOINT=None, DEVICE_STATE_TOKEN=None)
    assert from_profile.returncode == APPLIED and json.loads(from_profile.stdout)["deviceId"] == device
    # The environment's endpoint and token beat the profile's, the command line's beat both.
    _refused(cli("--profile", "lab", "get", device, DEVICE_STATE_TOKEN="not-a-token"), 401, "unauthorized")
    assert cli("--profile", "lab", "--token", token(), "get", device, DEVICE_STATE_TOKEN="not-a-token").returncode \
        == APPLIED
    assert cli("--profile", "lab", "get", device, DEVICE_STATE_ENDPOINT="http://127.0.0.1:1").returncode == UNKNOWN
    missing = cli("--profile", "nowhere", "get", device)
    assert missing.returncode == USAGE and "no profile 'nowhere'" in missing.stderr
    assert cli("configure").returncode == USAGE  # piped, with nothing to save, it asks nothing


def test_completion_prints_a_script_the_shell_runs(cli):
    script = cli("completion", "bash")
    assert script.returncode == APPLIED and "_DEVICE_STATE_COMPLETE=bash_complete" in script.stdout
    sourced = subprocess.run(["bash", "-c", script.stdout + "\ncomplete -p device-state"], capture_output=True,
                             text=True, timeout=30)
    assert sourced.returncode == 0 and "_device_state_completion" in sourced.stdout, sourced.stderr
    assert cli("completion", "tcsh").returncode == USAGE


# --- jobs (docs/api/jobs.md): the server runs its job runner and stream processor -------------


def _job_id() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


def _until_job(cli, job_id: str, predicate, seconds: float = 30) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        job = json.loads(cli("jobs", "show", job_id).stdout)
        if predicate(job):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.3)


def test_jobs_create_from_a_filter_with_its_options_and_the_refusals_of_a_job_that_cannot_run(cli, tmp_path):
    site = f"site-{uuid.uuid4().hex[:6]}"
    devices = [_new(cli, json.dumps({"state": {"site": site}})) for _ in range(2)]
    job_id = _job_id()
    (tmp_path / "desired.json").write_text('{"mode": "eco"}')
    created = cli("jobs", "create", "--filter", f'eq(state/site,"{site}")', "--desired", "@desired.json",
                  "--job-id", job_id, "--expires-in", "3600", "--clear-on-confirm", "--max-per-minute", "600",
                  "--abort", "FAILED:50:2", "--abort", '{"on": "ANY", "thresholdPercent": 90, "minExecuted": 1}',
                  "--timeout", "600")
    assert created.returncode == APPLIED, created.stderr
    job = json.loads(created.stdout)
    assert (job["jobId"], job["status"], job["filter"], job["desired"]) == (
        job_id, "IN_PROGRESS", f'eq(state/site,"{site}")', {"mode": "eco"})
    assert (job["expiresIn"], job["clearOnConfirm"], job["rollout"], job["timeoutSeconds"]) == (
        3600, True, {"maxPerMinute": 600}, 600)
    assert job["abort"] == [{"on": "FAILED", "thresholdPercent": 50, "minExecuted": 2},
                            {"on": "ANY", "thresholdPercent": 90, "minExecuted": 1}]
    _until_job(cli, job_id, lambda job: job["counts"]["IN_PROGRESS"] == 2)
    assert all(json.loads(cli("get", device).stdout)["desired"] == {"mode": "eco"} for device in devices)
    taken = cli("jobs", "create", "--device-ids", devices[0], "--desired", '{"mode": "eco"}', "--job-id", job_id)
    _refused(taken, 409, "job-exists")
    assert f"jobId: {job_id}" in taken.stderr
    _refused(cli("jobs", "create", "--filter", "exists(desired/mode)", "--desired", '{"mode": "eco"}'), 400,
             "unindexed-filter")
    invalid = cli("jobs", "create", "--device-ids", "-", "--desired", '{"mode": null}', input=json.dumps(devices))
    _refused(invalid, 400, "invalid-job")
    assert "member: desired" in invalid.stderr
    listed_continuous = cli("jobs", "create", "--device-ids", devices[0], "--desired", '{"mode": "eco"}', "--continuous")
    assert listed_continuous.returncode == REFUSED and listed_continuous.stderr.startswith("error: 400 ")
    assert "targets" in listed_continuous.stderr  # a list is a snapshot only
    _refused(cli("jobs", "create", "--filter", "exists(state/site)", "--desired", '{"mode": "eco"}',
                 DEVICE_STATE_TOKEN=token(device=devices[0])), 403, "forbidden")
    for usage in (["--desired", '{"mode": "eco"}'],  # neither --filter nor --device-ids
                  ["--filter", "exists(state/site)", "--device-ids", "a", "--desired", "{}"],
                  ["--device-ids", "a", "--desired", '{"mode": '], ["--device-ids", "a", "--desired", '"eco"'],
                  ["--device-ids", "a", "--desired", "{}", "--abort", "SOME:1:2"],
                  ["--device-ids", "a", "--desired", "{}", "--max-per-minute", "0"]):
        assert cli("jobs", "create", *usage).returncode == USAGE, usage


def test_jobs_create_a_continuous_job_until_its_end_and_an_end_past_is_refused(cli):
    site = f"site-{uuid.uuid4().hex[:6]}"
    _new(cli, json.dumps({"state": {"site": site}}))
    ends_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    job_id = _job_id()
    created = cli("jobs", "create", "--filter", f'eq(state/site,"{site}")', "--desired", '{"mode": "eco"}',
                  "--continuous", "--ends-at", ends_at, "--job-id", job_id)
    assert created.returncode == APPLIED, created.stderr
    assert (json.loads(created.stdout)["targets"], json.loads(created.stdout)["endsAt"][:19]) == (
        "continuous", ends_at[:19])
    _until_job(cli, job_id, lambda job: job["counts"]["IN_PROGRESS"] == 1)
    assert cli("jobs", "cancel", job_id).returncode == APPLIED
    _refused(cli("jobs", "create", "--filter", f'eq(state/site,"{site}")', "--desired", '{"mode": "eco"}',
                 "--continuous", "--ends-at", "2020-01-01T00:00:00Z"), 400, "invalid-job")


def test_jobs_show_list_and_executions_and_a_job_that_is_not_there_is_404(cli):
    devices, ghost, job_id = [_new(cli) for _ in range(2)], f"ghost-{uuid.uuid4().hex[:6]}", _job_id()
    created = cli("jobs", "create", "--device-ids", ",".join([*devices, ghost]), "--desired", '{"mode": "eco"}',
                  "--job-id", job_id)
    assert created.returncode == APPLIED, created.stderr
    job = _until_job(cli, job_id, lambda job: job["counts"]["IN_PROGRESS"] == 2 and job["counts"]["REMOVED"] == 1)
    assert (job["total"], job["deviceIdCount"]) == (3, 3)
    table = cli("jobs", "show", job_id, "-o", "table")
    assert table.returncode == APPLIED and f"jobId          {job_id}" in table.stdout
    assert "IN_PROGRESS 2" in table.stdout and "REMOVED 1" in table.stdout
    listed = cli("jobs", "list", "--status", "IN_PROGRESS")
    assert listed.returncode == APPLIED and job_id in [job["jobId"] for job in json.loads(listed.stdout)]
    assert len(json.loads(cli("jobs", "list", "--limit", "1").stdout)) == 1
    executions = cli("jobs", "executions", job_id, "--page-size", "2")
    assert executions.returncode == APPLIED, executions.stderr
    assert [(execution["deviceId"], execution["state"]) for execution in json.loads(executions.stdout)] == [
        (devices[0], "IN_PROGRESS"), (devices[1], "IN_PROGRESS"), (ghost, "REMOVED")]
    removed = json.loads(cli("jobs", "executions", job_id, "--state", "REMOVED").stdout)
    assert [execution["deviceId"] for execution in removed] == [ghost]
    rows = cli("jobs", "executions", job_id, "-o", "table").stdout.splitlines()
    assert rows[0].split() == ["DEVICE", "STATE", "VERSION", "UPDATED", "REASON"] and len(rows) == 4
    for command in (["show", "none-such"], ["executions", "none-such"], ["show", "none-such", "--watch"]):
        _refused(cli("jobs", *command), 404, "job-not-found")
    _refused(cli("jobs", "list", DEVICE_STATE_TOKEN=token(device=devices[0])), 403, "forbidden")
    _refused(cli("jobs", "list", DEVICE_STATE_TOKEN="not-a-token"), 401, "unauthorized")
    assert cli("jobs", "list", "--status", "DONE").returncode == USAGE
    assert cli("jobs", "executions", job_id, "--state", "DONE").returncode == USAGE
    cli("jobs", "cancel", job_id)


def test_jobs_cancel_then_cancel_again_is_409_and_force_takes_the_leaves_back(cli):
    device, job_id = _new(cli), _job_id()
    assert cli("jobs", "create", "--device-ids", device, "--desired", '{"mode": "eco"}', "--job-id",
               job_id).returncode == APPLIED
    _until_job(cli, job_id, lambda job: job["counts"]["IN_PROGRESS"] == 1)
    canceled = cli("jobs", "cancel", job_id)
    assert canceled.returncode == APPLIED, canceled.stderr
    assert (json.loads(canceled.stdout)["status"], json.loads(canceled.stdout)["counts"]["IN_PROGRESS"]) == (
        "CANCELED", 1)  # what was written stays tracked
    again = cli("jobs", "cancel", job_id)
    _refused(again, 409, "job-ended")
    assert "jobStatus: CANCELED" in again.stderr
    forced = cli("jobs", "cancel", job_id, "--force")
    assert forced.returncode == APPLIED and json.loads(forced.stdout)["status"] == "CANCELED"
    job = _until_job(cli, job_id, lambda job: job["counts"]["CANCELED"] == 1)
    assert job["counts"]["IN_PROGRESS"] == 0 and json.loads(cli("get", device).stdout)["desired"] == {}
    _refused(cli("jobs", "cancel", "none-such", "--force"), 404, "job-not-found")
    _refused(cli("jobs", "cancel", job_id, DEVICE_STATE_TOKEN=token((READ_SCOPE,))), 403, "forbidden")


def test_jobs_show_watch_piped_prints_one_json_document_per_change_until_nothing_is_left_to_happen(cli):
    confirming, silent, ghost, job_id = _new(cli), _new(cli), f"ghost-{uuid.uuid4().hex[:6]}", _job_id()
    assert cli("jobs", "create", "--device-ids", f"{confirming},{silent},{ghost}", "--desired", '{"mode": "eco"}',
               "--job-id", job_id, "--timeout", "7").returncode == APPLIED
    watching = cli.start("jobs", "show", job_id, "--watch")
    try:
        printed = []
        while not printed or json.loads(printed[-1])["counts"]["IN_PROGRESS"] != 2:  # as it prints each change
            printed.append(watching.stdout.readline())
            assert printed[-1], (printed, watching.stderr.read())
        assert cli("report", confirming, '{"mode": "eco"}').returncode == APPLIED  # one confirms, one never does
        stdout, stderr = watching.communicate(timeout=60)
    finally:
        if watching.poll() is None:
            watching.kill()
            watching.wait()
    assert watching.returncode == APPLIED, stderr
    seen = [json.loads(line) for line in printed + stdout.splitlines()]
    assert seen[-1]["counts"] == {**dict.fromkeys(seen[-1]["counts"], 0), "SUCCEEDED": 1, "TIMED_OUT": 1,
                                  "REMOVED": 1}, seen[-1]
    assert any(job["counts"]["SUCCEEDED"] == 1 and job["counts"]["IN_PROGRESS"] == 1 for job in seen)
    moments = [(job["status"], job["counts"], job["total"], job.get("targeting"), job.get("completedAt")) for job in seen]
    assert all(before != after for before, after in zip(moments, moments[1:])), moments  # one per change
