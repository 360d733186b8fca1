"""The `device-state` command without the service: its help (an example on every command, the
reference in docs/cli.md written from it, nothing but Click loaded to print it), its exit
statuses for answers the real server cannot be made to give at will (504 and 503 after every
attempt), a terminal's table and question, a watched job's progress bar, and a listing of 10,000 devices streamed page by
page in the memory of one page, beside a control that collects the listing first. The
commands against the real server: tests/api/test_cli.py."""

from __future__ import annotations

import http.server
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
import urllib.parse

import click
import pytest

from tests.helpers import served
from tests.make_serve import REPO_ROOT
from tests.unit.test_device_client import ScriptedServer, scripted  # noqa: F401 - the fixture

sys.path.insert(0, str(REPO_ROOT / "clients" / "python"))
from device_state_client.cli import main  # noqa: E402
from device_state_client.cli.reference import commands, help_text, rewrite  # noqa: E402

COMMAND = [sys.executable, "-m", "device_state_client.cli"]
DEVICE = {"deviceId": "lamp-1", "version": 4, "state": {"power": "on"}, "desired": {}, "reported": {}, "delta": {},
          "updatedAt": "2026-11-28T00:00:00.000Z"}


def _environment(port: int, **settings) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith("DEVICE_STATE_")}
    env.update({"PYTHONPATH": str(REPO_ROOT / "clients" / "python"), "DEVICE_STATE_ENDPOINT": f"http://127.0.0.1:{port}",
                "DEVICE_STATE_TOKEN": "t0k", "DEVICE_STATE_CONFIG": os.devnull, **settings})
    return env


def _run(port: int, *arguments, **settings) -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *arguments], capture_output=True, text=True, env=_environment(port, **settings),
                          stdin=subprocess.DEVNULL, timeout=120)


def test_every_command_ends_its_help_with_an_example_of_itself():
    for path, command in commands():
        text = help_text(command, path)
        assert "\n  Example:\n" in text, path
        examples = text.split("\n  Example:\n", 1)[1].splitlines()
        invoked = " ".join(path[1:])
        assert examples and all(line.startswith("    ") for line in examples), path
        assert any(re.search(rf"\bdevice-state( --?[\w-]+(=| )?\S*)* {invoked}\b", line) or not invoked
                   for line in examples), (path, examples)


def test_the_reference_in_docs_cli_md_is_what_the_commands_print():
    """Regenerate it with: PYTHONPATH=clients/python .venv/bin/python -m device_state_client.cli.reference docs/cli.md"""
    document = (REPO_ROOT / "docs" / "cli.md").read_text()
    assert rewrite(document) == document
    for path, _ in commands():
        assert f"### `{' '.join(path)}`" in document
    for path, command in commands()[:4]:  # as a wide terminal shows it
        printed = _run(1, *path[1:], "--help", COLUMNS="160").stdout
        assert printed.rstrip() == help_text(command, path).rstrip(), path


def test_help_loads_click_and_nothing_it_does_not_print_with():
    code = ("import sys\n"
            "from device_state_client.cli import main\n"
            "try:\n    main(['--help'], prog_name='device-state')\nexcept SystemExit as done:\n    assert done.code == 0\n"
            "print(' '.join(sorted(name for name in sys.modules if name.split('.')[0] in (\n"
            "    'urllib', 'http', 'ssl', 'socket', 'email', 'websockets', 'rich', 'yaml', 'subprocess', 'configparser'))),"
            " file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "clients" / "python")})
    assert result.returncode == 0 and result.stdout.startswith("Usage: device-state")
    assert result.stderr == "\n", result.stderr


def test_an_outcome_unknown_after_every_attempt_exits_3_and_names_the_key_to_send_again(scripted):
    unknown = {"type": "urn:device-state:problem:outcome-unknown", "status": 504, "title": "The change may or may "
               "not have been applied", "detail": "DynamoDB did not answer"}
    server = scripted((504, {"Content-Type": "application/problem+json", "Retry-After": "0"}, unknown))
    result = _run(server.port, "patch", "lamp-1", "--merge", '{"power": "off"}', "--idempotency-key", "k-7")
    assert result.returncode == 3 and result.stdout == ""
    assert result.stderr.splitlines()[:2] == ["error: 504 outcome-unknown: The change may or may not have been applied",
                                              "  DynamoDB did not answer"]
    assert "may or may not have been applied; the same command with --idempotency-key k-7" in result.stderr
    keys = {headers["Idempotency-Key"] for _, _, headers, _, _ in server.requests}
    assert len(server.requests) == 4 and keys == {"k-7"}  # every attempt under the one key
    busy = scripted((503, {"Retry-After": "0"}, {"type": "urn:device-state:problem:contention", "status": 503,
                                                  "title": "Too much contention", "detail": "nothing was written"}))
    result = _run(busy.port, "delete", "lamp-1", "--yes")
    assert result.returncode == 3 and "the write was not applied" in result.stderr


@pytest.mark.parametrize("last", [503, 429, 401])
def test_a_write_whose_first_copy_went_unanswered_is_unknown_whatever_says_nothing_last(scripted, last):
    """A 504 (or a lost answer) first, then answers given before the key is looked at: the first
    copy may have applied, so not "not applied" (3) nor "refused" (1 for the 401)."""
    unknown = {"type": "urn:device-state:problem:outcome-unknown", "status": 504, "title": "unknown", "detail": "x"}
    server = scripted((504, {}, unknown), (last, {"Retry-After": "0"}, {"status": last, "title": "t", "detail": "d"}))
    result = _run(server.port, "patch", "lamp-1", "--merge", '{"power": "off"}', "--idempotency-key", "k-8")
    assert result.returncode == 3, result.stderr
    assert "may or may not have been applied; the same command with --idempotency-key k-8" in result.stderr
    assert "not applied;" not in result.stderr.replace("may or may not have been applied;", "")


def test_a_refusal_exits_1_and_bad_usage_2_before_anything_is_sent(scripted):
    server = scripted((404, {}, {"type": "urn:device-state:problem:device-not-found", "status": 404,
                                 "title": "No such device", "detail": "device 'lamp-1' does not exist",
                                 "deviceId": "lamp-1"}))
    refused = _run(server.port, "get", "lamp-1")
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == ("error: 404 device-not-found: No such device\n  device 'lamp-1' does not exist\n"
                              "  deviceId: lamp-1\n")
    for usage in (["patch", "lamp-1"], ["create", "lamp-1", "[1"], ["get"], ["count"], ["history", "lamp-1", "x"],
                  ["nosuch"], ["--ca-file", "/nonexistent/ca.pem", "get", "lamp-1"]):
        assert _run(server.port, *usage).returncode == 2, usage
    assert len(server.requests) == 1


def test_json_that_json_has_not_an_unreadable_file_and_a_bad_endpoint_are_usage_not_tracebacks(scripted, tmp_path):
    """NaN and Infinity (which Python's reader takes), a file that is not UTF-8, JSON nested past
    what Python reads, an empty id (its path would name the collection), a PERCENT that is not
    finite and an endpoint that is not a URL exit 2 with a message, before anything is sent."""
    server = scripted((200, {}, DEVICE))
    (tmp_path / "nan.json").write_text('{"a": NaN}')
    (tmp_path / "bytes.json").write_bytes(b"\xff\xfe{}")
    (tmp_path / "deep.json").write_text("[" * 100_000)
    job = ["jobs", "create", "--device-ids", "lamp-1", "--desired"]
    for usage in (["desire", "lamp-1", '{"a": NaN}'], ["desire", "lamp-1", f"@{tmp_path / 'deep.json'}"],
                  ["get", ""], ["watch", ""], ["jobs", "show", ""], [*job, '{"a": -Infinity}'],
                  [*job, f"@{tmp_path / 'nan.json'}"],
                  [*job, f"@{tmp_path / 'bytes.json'}"], *([*job, '{"a": 1}', "--abort", f"FAILED:{percent}:1"]
                                                           for percent in ("NaN", "Infinity", "sNaN")),
                  *(["--endpoint", endpoint, "get", "lamp-1"] for endpoint in (
                      "notaurl", "ftp://127.0.0.1/", "http://[::1", "http://127.0.0.1:abc/", "http://exa mple.com/"))):
        result = _run(server.port, *usage)
        assert (result.returncode, "Traceback" in result.stderr) == (2, False), (usage, result.stderr)
        assert result.stderr.startswith(("Usage:", "Error:")), (usage, result.stderr)
    piped = subprocess.run([*COMMAND, "desire", "lamp-1", "-"], input=b'{"a": "\xff"}', capture_output=True,
                           env=_environment(server.port, LC_ALL="C.UTF-8"), timeout=120)
    assert (piped.returncode, b"not UTF-8" in piped.stderr) == (2, True), piped.stderr
    assert server.requests == []



def test_a_config_file_that_cannot_be_read_or_a_name_it_cannot_hold_is_usage_naming_the_file(scripted, tmp_path):
    server = scripted((200, {}, DEVICE))
    for number, text in enumerate(("[a]\nendpoint = x\n[a]\n", "endpoint = x\n", "[a\n")):
        broken = tmp_path / f"broken-{number}"
        broken.write_text(text)
        result = _run(server.port, "--profile", "a", "get", "lamp-1", DEVICE_STATE_CONFIG=str(broken))
        assert (result.returncode, "Traceback" in result.stderr) == (2, False), result.stderr
        assert str(broken) in result.stderr
    config = tmp_path / "config"
    for name in ("DEFAULT", "a]\n[b"):
        result = _run(server.port, "configure", "--profile", name, "--endpoint", "http://x",
                      DEVICE_STATE_CONFIG=str(config))
        assert (result.returncode, "Traceback" in result.stderr) == (2, False), (name, result.stderr)
    result = _run(server.port, "configure", "--token-command", "echo t\r[default]\rendpoint=http://elsewhere",
                  DEVICE_STATE_CONFIG=str(config))  # a value that would start a section of its own
    assert (result.returncode, "Traceback" in result.stderr) == (2, False), result.stderr
    assert not config.exists() and server.requests == []


def test_a_watch_says_why_it_reconnects_at_once_then_at_most_every_30_seconds(capsys):
    from device_state_client.cli.commands import _Reconnecting

    now = [0.0]
    reconnecting = _Reconnecting(clock=lambda: now[0])
    for moment in (0, 1, 2, 29, 31):
        now[0] = moment
        reconnecting("ConnectionRefusedError: [Errno 111] Connection refused")
    said = capsys.readouterr().err.splitlines()
    refused = "reconnecting: ConnectionRefusedError: [Errno 111] Connection refused"
    assert said == [refused, f"{refused} (3 more since the last said)"]


@pytest.mark.parametrize("release", [503, "no answer"])
def test_a_lease_whose_release_fails_exits_with_its_commands_status_and_warns(scripted, release):
    """The command ran: its status is the exit status the help promises, not the release's 3."""
    grant = {"deviceId": "lamp-1", "leaseId": "1.ab", "leaseToken": "cd" * 16, "fencingToken": 3,
             "expiresAt": "2026-11-28T00:00:30.000Z", "ttlSeconds": 30}
    failed = ((503, {"Retry-After": "0"}, {"status": 503, "title": "busy", "detail": "nothing was written"})
              if release == 503 else (200, {}, b"<html>a proxy's page</html>"))
    server = scripted((201, {}, grant), failed)
    result = _run(server.port, "lease", "lamp-1", "--", sys.executable, "-c", "raise SystemExit(7)")
    assert result.returncode == 7, result.stderr
    assert "warning: releasing the lease on lamp-1 failed" in result.stderr, result.stderr
    assert "ends by itself within 30 s" in result.stderr and "Traceback" not in result.stderr  # the grant's TTL
    assert [method for method, *_ in server.requests] == ["POST"] + ["DELETE"] * 4  # the release, sent again

def test_a_lease_whose_release_cannot_get_a_token_exits_with_its_commands_status_and_warns(scripted, tmp_path):
    """The token command works for the grant and fails at the release: a warning and the
    command's status, not the CLI's 2 for a token it could not get."""
    grant = {"deviceId": "lamp-1", "leaseId": "1.ab", "leaseToken": "cd" * 16, "fencingToken": 3,
             "expiresAt": "2026-11-28T00:00:30.000Z", "ttlSeconds": 30}
    once = tmp_path / "once"
    server = scripted((201, {}, grant), (204, {}, None))
    result = _run(server.port, "lease", "lamp-1", "--", sys.executable, "-c", "raise SystemExit(7)",
                  DEVICE_STATE_TOKEN="", DEVICE_STATE_TOKEN_COMMAND=f"test ! -e {once} && touch {once} && "
                                             "echo '{\"access_token\": \"t0k\", \"expires_in\": 0}'")
    assert result.returncode == 7, result.stderr
    assert "warning: releasing the lease on lamp-1 failed" in result.stderr and "Traceback" not in result.stderr
    assert [method for method, *_ in server.requests] == ["POST"]


def test_a_transaction_run_under_a_lease_carries_its_token_on_the_leased_devices_operations(scripted):
    server = scripted((200, {}, {"devices": [None, None]}))
    operations = '[{"deviceId": "lamp-1", "mergePatch": {"a": 1}}, {"deviceId": "lamp-2", "delete": true}]'
    result = _run(server.port, "tx", operations, DEVICE_STATE_LEASE_DEVICE="lamp-1", DEVICE_STATE_LEASE_TOKEN="ab" * 16)
    assert result.returncode == 0, result.stderr
    sent = server.requests[0][3]["operations"]
    assert sent == [{"deviceId": "lamp-1", "mergePatch": {"a": 1}, "leaseToken": "ab" * 16},
                    {"deviceId": "lamp-2", "delete": True}]  # another device's would be refused as a lease not held


def test_ctrl_c_ends_a_watch_with_130_not_a_refusals_1(scripted):
    server = scripted((200, {"ETag": '"a"'}, _job({"QUEUED": 2})), (304, {"ETag": '"a"'}, None))
    process = subprocess.Popen([*COMMAND, "jobs", "show", "porch-eco", "--watch", "-o", "json"], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                               env=_environment(server.port))
    deadline = time.monotonic() + 60
    while len(server.requests) < 3 and time.monotonic() < deadline:  # watching: its long-polls go on
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert (process.returncode, "Traceback" in stderr, "Aborted" in stderr) == (130, False, False), stderr


def test_a_ctrl_c_that_lands_in_a_finalizer_is_not_lost():
    """Python drops an exception raised in an object's __del__: a Ctrl-C landing there (a watch frees
    the 304 answer of each long-poll) would leave the command running. The CLI delivers it again."""
    script = ("import time\n"
              "from device_state_client.cli import deliver_dropped_interrupts\n"
              "deliver_dropped_interrupts()\n"
              "class Answer:\n"
              "    def __del__(self):\n"
              "        raise KeyboardInterrupt  # as SIGINT's handler does where the signal lands\n"
              "Answer()\n"
              "try:\n"
              "    time.sleep(120)  # a long-poll's wait: the Ctrl-C ends it, not its end the Ctrl-C\n"
              "    print('went on')\n"
              "except KeyboardInterrupt:\n"
              "    print('interrupted')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env=_environment(1))  # TimeoutExpired: the Ctrl-C waited for the sleep to end
    assert (result.stdout, result.stderr) == ("interrupted\n", "")


def _on_a_terminal(port: int, *arguments, answer: bytes = b"", columns: int = 100) -> tuple[int, str]:
    """Runs the command with stdin, stdout and stderr on a pseudo-terminal; its exit status and
    what the terminal showed."""
    controller, terminal = pty.openpty()
    os.set_blocking(controller, False)
    env = _environment(port, COLUMNS=str(columns), TERM="xterm")
    process = subprocess.Popen([*COMMAND, *arguments], stdin=terminal, stdout=terminal, stderr=terminal, env=env)
    os.close(terminal)
    shown, deadline = b"", time.monotonic() + 60
    while time.monotonic() < deadline:
        readable, _, _ = select.select([controller], [], [], 0.1)
        if readable:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal closed with the process
                break
            shown += chunk
            if answer and b"[y/N]" in shown:
                os.write(controller, answer)
                answer = b""
        elif process.poll() is not None:
            break
    os.close(controller)
    return process.wait(timeout=30), shown.decode(errors="replace")


def test_on_a_terminal_a_listing_is_a_table_and_delete_asks_first(scripted):
    pages = [(200, {}, {"items": [{**DEVICE, "deviceId": f"lamp-{number}"} for number in range(3)],
                        "nextCursor": "6c.61"}),
             (200, {}, {"items": [{**DEVICE, "deviceId": "lamp-3"}], "nextCursor": None})]
    server = scripted(*pages)
    status, shown = _on_a_terminal(server.port, "list")
    assert status == 0, shown
    lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line).strip() for line in shown.splitlines()]
    rows = [line.split() for line in lines if line.startswith(("DEVICE", "lamp-"))]
    assert [row[0] for row in rows] == ["DEVICE", "lamp-0", "lamp-1", "lamp-2", "lamp-3"], shown  # one header
    deleting = scripted((204, {}, None))
    status, shown = _on_a_terminal(deleting.port, "delete", "lamp-1", answer=b"n\n")
    assert status == 1 and "Delete lamp-1? [y/N]" in shown and deleting.requests == []
    status, shown = _on_a_terminal(deleting.port, "delete", "lamp-1", answer=b"y\n")
    assert status == 0 and "deleted lamp-1" in shown and [request[0] for request in deleting.requests] == ["DELETE"]


def test_on_a_terminal_what_devices_stored_is_shown_never_acted_on(scripted):
    """A device's ack reason, a reported value and a problem's detail holding terminal controls
    (clear the screen, retitle the window, a bidi override) are shown escaped, in tables and on
    stderr alike."""
    clear, title, override = "\x1b[2J\x1b[H", "\x1b]0;pwned\x07", "\u202e"
    executions = {"items": [{"deviceId": "lamp-1", "state": "FAILED", "version": 2, "code": 500,
                             "reason": f"{clear}overheated{override}"}], "nextCursor": None}
    count = {"count": 1, "groups": [{"value": f"{title}1.0", "count": 1}]}
    refused = (409, {}, {"type": "urn:device-state:problem:conflict", "title": "Conflict", "status": 409,
                         "detail": f"held by {clear}someone"})
    counting = ("count", "--filter", "eq(reported/online,true)", "--group-by", "reported/firmware")
    for arguments, answer in ((("jobs", "executions", "porch-eco"), (200, {}, executions)),
                              (counting, (200, {}, count)), (("get", "lamp-1"), refused)):
        status, shown = _on_a_terminal(scripted(answer).port, *arguments)
        assert clear not in shown and title not in shown and override not in shown, (arguments, shown)
        assert "\\u001b" in shown or "\\u202e" in shown, (arguments, shown)


def test_what_a_terminal_shows_keeps_words_spelled_with_joiners_and_escapes_what_it_would_act_on():
    from device_state_client.cli.output import shown

    spelled = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 \U0001f469\u200d\U0001f4bb \u4e2d\u6587\t\n"
    assert shown(spelled) == spelled  # Persian, an emoji sequence, CJK, a tab and a line break
    assert shown("a\u061cb\u2028c\U000e0041d\x1b") == "a\\u061cb\\u2028c\\U000e0041d\\u001b"


def _job(etag_counts: dict, **members) -> dict:
    counts = dict.fromkeys(("QUEUED", "IN_PROGRESS", "SUCCEEDED", "FAILED", "TIMED_OUT", "SUPERSEDED", "REMOVED",
                            "CANCELED"), 0)
    return {"jobId": "porch-eco", "targets": "snapshot", "desired": {"mode": "eco"}, "status": "IN_PROGRESS",
            "counts": {**counts, **etag_counts}, "total": 2, "createdAt": "2026-11-28T00:00:00.000Z", **members}


def test_on_a_terminal_a_watched_job_is_a_progress_bar_redrawn_in_place_by_long_polls_on_its_etag(scripted):
    server = scripted((200, {"ETag": '"a"'}, _job({"QUEUED": 2})),
                      (304, {"ETag": '"a"'}, None),  # the wait ran out, nothing changed
                      (200, {"ETag": '"b"'}, _job({"IN_PROGRESS": 2})),
                      (200, {"ETag": '"c"'}, _job({"IN_PROGRESS": 1, "SUCCEEDED": 1})),
                      (200, {"ETag": '"d"'}, _job({"SUCCEEDED": 1, "FAILED": 1}, status="COMPLETED",
                                                  completedAt="2026-11-28T00:01:00.000Z")))
    status, shown = _on_a_terminal(server.port, "jobs", "show", "porch-eco", "--watch")
    assert status == 0, shown
    assert [(path, headers.get("If-None-Match")) for _, path, headers, _, _ in server.requests] == [
        ("/jobs/porch-eco", None), ("/jobs/porch-eco?waitSeconds=20", '"a"'), ("/jobs/porch-eco?waitSeconds=20", '"a"'),
        ("/jobs/porch-eco?waitSeconds=20", '"b"'), ("/jobs/porch-eco?waitSeconds=20", '"c"')]
    assert "\x1b[2K" in shown and "\x1b[1A" in shown  # each state drawn over the one before
    drawn = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", part).strip() for part in shown.split("porch-eco")[1:]]
    screens = [screen for number, screen in enumerate(drawn) if number == 0 or screen != drawn[number - 1]]
    assert [screen.split("\n")[0].split()[0:1] + screen.split("\n")[0].split()[-2:] for screen in screens] == [
        ["IN_PROGRESS", "0/2", "final"], ["IN_PROGRESS", "0/2", "final"], ["IN_PROGRESS", "1/2", "final"],
        ["COMPLETED", "2/2", "final"]]
    last = [line.split() for line in screens[-1].splitlines()[1:3]]
    assert dict(zip(*last)) == {"QUEUED": "0", "IN_PROGRESS": "0", "SUCCEEDED": "1", "FAILED": "1", "TIMED_OUT": "0",
                                "SUPERSEDED": "0", "REMOVED": "0", "CANCELED": "0"}
    assert "{" not in shown  # a terminal shows the bar, not the JSON a pipe gets


class Fleet:
    """GET /devices of ``size`` made-up devices of about 2 KB each, 100 a page, made as asked."""

    def __init__(self, size: int):
        state = {f"setting-{number}": "x" * 40 for number in range(40)}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the stdlib's naming
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                start, limit = int(query.get("cursor", ["0.30"])[0].split(".")[0] or 0), int(query["limit"][0])
                end = min(start + limit, size)
                page = {"items": [{"deviceId": f"lamp-{number}", "version": 1, "state": state,
                                   "updatedAt": "2026-11-28T00:00:00.000Z"} for number in range(start, end)],
                        "nextCursor": f"{end}.30" if end < size else None}
                payload = json.dumps(page).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.close = served(self._server)


COLLECTING_CONTROL = ("import os, sys\n"
                      "from device_state_client import AppClient, TokenCredentials\n"
                      "from device_state_client.values import dumps\n"
                      "client = AppClient(os.environ['DEVICE_STATE_ENDPOINT'], TokenCredentials('t0k'))\n"
                      "sys.stdout.write(dumps(list(client.list())))\n")


# Started from this small process, not from pytest's: a child's peak (ru_maxrss) counts what it
# held before exec too, which for a fork of pytest is pytest's whole memory.
PEAK_OF = ("import os, subprocess, sys\n"
           "child = subprocess.Popen(sys.argv[1:])\n"
           "_, status, usage = os.wait4(child.pid, 0)\n"
           "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss, file=sys.stderr)\n")


def _peak_kib_and_devices(command: list[str], env: dict) -> tuple[int, int]:
    """The command's peak resident memory (KiB) and the devices it printed."""
    process = subprocess.Popen([sys.executable, "-c", PEAK_OF, *command], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env, stdin=subprocess.DEVNULL)
    devices = sum(chunk.count(b'"deviceId"') for chunk in iter(lambda: process.stdout.read(1 << 16), b""))
    status, peak = process.stderr.read().split()[-2:]
    assert process.wait() == 0 and status == b"0"
    return int(peak), devices


def test_a_listing_of_10000_devices_streams_in_the_memory_of_a_page_beside_a_control_that_collects_it():
    peaks = {}
    for size in (1_000, 10_000):
        fleet = Fleet(size)
        try:
            env = _environment(fleet.port)
            streamed, count = _peak_kib_and_devices([*COMMAND, "list"], env)
            assert count == size
            collected, count = _peak_kib_and_devices([sys.executable, "-c", COLLECTING_CONTROL], env)
            assert count == size
            peaks[size] = streamed, collected
        finally:
            fleet.close()
    streamed_growth = peaks[10_000][0] - peaks[1_000][0]
    collected_growth = peaks[10_000][1] - peaks[1_000][1]
    # 9,000 more devices are about 18 MB of JSON: the stream holds a page at a time (measured: 0.1 MB
    # more at 10,000 than at 1,000: 26 MB in all), the control all of them (measured: 87 MB more).
    assert streamed_growth < 8 * 1024, peaks
    assert collected_growth > 40 * 1024, peaks


def test_the_top_command_is_click_group_and_its_settings_are_options_of_the_group():
    assert isinstance(main, click.Group)
    names = {option.name for option in main.params}
    assert {"endpoint", "token", "token_command", "websocket_url", "ca_file", "profile"} <= names


def test_a_write_that_takes_no_key_whose_answer_is_unknown_says_so_and_how_to_find_out(scripted):
    """credentials add, enrollments create and lease take no Idempotency-Key: a lost answer
    (here a 504) was told like a refused connection, though the credential had been registered
    and its secret, shown once, was lost with the answer (found by a hostile review)."""
    unknown = {"type": "urn:device-state:problem:outcome-unknown", "status": 504, "title": "unknown", "detail": "x"}
    server = scripted((504, {}, unknown))
    for arguments, hint in ((["credentials", "add", "lamp-1", "--secret"], "device-state credentials list lamp-1"),
                            (["enrollments", "create", "--id-pattern", "lamp-[0-9]+", "--max-devices", "5"],
                             "device-state enrollments list"),
                            (["lease", "lamp-1", "--ttl", "30", "--", "true"], "ends by itself within 30 s")):
        result = _run(server.port, *arguments)
        assert result.returncode == 3, (arguments, result.stderr)
        assert "the write may or may not have been applied; " in result.stderr and hint in result.stderr, result.stderr


def test_watch_refuses_what_it_cannot_follow_as_usage_and_delta_waits_whole_seconds(scripted):
    """101 devices were a traceback; a section that is none was a watch printing nothing forever
    (the service takes the subscription); `delta --wait 20` (docs/cli.md) sent 20.0, which the
    service refuses (found by a hostile review)."""
    server = scripted((200, {}, {"deviceId": "lamp-1", "version": 4, "delta": {}}))
    many = _run(server.port, "watch", *(f"w{number}" for number in range(101)))
    typo = _run(server.port, "watch", "lamp-1", "--since", "0", "--sections", "reportd")
    for result, said in ((many, "follow 1 to 100 devices"), (typo, "not reportd")):
        assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert _run(server.port, "delta", "lamp-1", "--since", "4", "--wait", "20").returncode == 0
    assert [path for _, path, _, _, _ in server.requests] == ["/devices/lamp-1/delta?since=4&waitSeconds=20"]


def test_a_table_into_a_pipe_its_reader_closed_exits_as_the_command_did_and_an_output_setting_can_go(
        scripted, tmp_path):
    """Rich exits 1 ("refused") on a broken pipe, though the write had applied; `configure
    --output ''` was refused although an empty value removes a setting (found by a hostile review)."""
    server = scripted((200, {}, DEVICE))
    command = " ".join([*COMMAND, "patch", "lamp-1", "--merge", "'{\"power\": \"off\"}'", "-o", "table"])
    piped = subprocess.run(["bash", "-c", f"set -o pipefail; {command} | true"], capture_output=True, text=True,
                           env=_environment(server.port), timeout=120)
    assert piped.returncode == 0, piped.stderr
    config = tmp_path / "config"
    for setting in ("table", ""):
        assert _run(server.port, "configure", "--output", setting, DEVICE_STATE_CONFIG=str(config)).returncode == 0
    assert "output" not in config.read_text()


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_json_and_yaml_escape_what_a_terminal_would_act_on_and_parse_to_the_same_document(output, capsys):
    import yaml

    from device_state_client.cli.output import Stream, show

    acting = "\x1b]0;pwned\x07 \x85\x9b2J \u202eevil\u202c \u2028\u2066x\u2069 \ufeff\U000e0041 \x7f"
    document = {"reason": acting, acting: ["\U0001f469\u200d\U0001f4bb \u0645\u06cc\u200c\u062e", "\t\n"],
                "nested": {"a": acting * 20}}
    show(document, output)
    one = capsys.readouterr().out
    with Stream(output, "devices") as stream:
        stream.add_page([document, {"deviceId": "\u202elamp"}])
    many = capsys.readouterr().out
    for printed in (one, many):
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028-\u202e\u2060-\u2069"
                             "\ufeff\U000e0000-\U000e007f]", printed), printed
        assert "\U0001f469\u200d\U0001f4bb \u0645\u06cc\u200c\u062e" in printed  # words keep their joiners
    parse = json.loads if output == "json" else yaml.safe_load
    assert parse(one) == document and parse(many) == [document, {"deviceId": "\u202elamp"}]
