"""Engines for tests: moto (in process, single-threaded tests only) and DynamoDB Local
(AWS's own engine, for everything concurrent). Neither needs AWS credentials."""

from __future__ import annotations

import functools
import os
import signal
import uuid
from collections import Counter

import pytest

# Tests never talk to AWS: fake credentials and a region for every client they make.
for _name, _value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}.items():
    os.environ[_name] = _value

# A suite started in the background of a shell without job control (`make test &` in a script)
# inherits SIGINT ignored, as would every process a test starts and sends Ctrl-C to: each takes
# it as from a terminal (a handled signal is default again in a program exec'd).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from tests.auth import DEVICE_TOKEN_ENVIRONMENT, ISSUER, SEALING_ENVIRONMENT  # noqa: E402

# Every handler in process and every server a test starts accepts the suite's own tokens,
# and signs device tokens with the suite's key...
os.environ.update(ISSUER.environment())
os.environ.update(DEVICE_TOKEN_ENVIRONMENT)
os.environ.update(SEALING_ENVIRONMENT)
# ... and seals its listings' cursors with the suite's key (one per test process).
os.environ["CURSOR_KEY"] = uuid.uuid4().hex + uuid.uuid4().hex
from functions.device_state import DeviceStateManager  # noqa: E402
from functions.device_state.client import dynamodb_client, new_client  # noqa: E402
from functions.device_state.table import create_table  # noqa: E402
from localdev.dynamodb_local import DynamoDBLocal, DynamoDBLocalError  # noqa: E402

_running_engines: list[DynamoDBLocal] = []


def started_dynamodb_local():
    """A DynamoDB Local process (in memory), stopped when the generator closes: a fixture's body."""
    server = DynamoDBLocal()
    try:
        server.start()
    except DynamoDBLocalError as error:
        pytest.fail(f"DynamoDB Local could not start: {error}", pytrace=False)
    _running_engines.append(server)
    yield server
    _running_engines.remove(server)
    server.stop()


@pytest.fixture(autouse=True)
def no_connection_left_idle():
    """Each test opens its own connections to DynamoDB Local. Its server (Jetty) closes a
    connection idle for 30.0 s (measured), and a request sent at that instant on a connection an
    earlier test left in the shared client's pool is answered by a closed socket: a lost answer
    the library rightly settles, with requests a test counting them does not expect."""
    for engine in _running_engines:
        dynamodb_client(engine.endpoint, "us-east-1").close()  # empties its pool; the client stays usable


@pytest.fixture(scope="session")
def dynamodb_local():
    """One DynamoDB Local process (in memory) for the whole session (a module that adds
    indexes to tables holding items has its own: see ``started_dynamodb_local``)."""
    yield from started_dynamodb_local()


def pytest_itemcollected(item):
    """A test that reaches DynamoDB Local through its fixtures is in that tier, marked or not
    (marked here, during collection, so `-m "not dynamodb_local"` deselects it)."""
    if "dynamodb_local" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.dynamodb_local)


# `make test` hands whole files to four workers in the order collected (--no-loadscope-reorder);
# xdist's own order, most tests first, left these files of a few slow tests (a CDK synth, make
# serve, a bench, a stall) for last, where one worker ran them alone while the others sat done.
# They go first, slowest first (the seconds its tests took in `make test`, the mean of two runs on
# three and four workers: `--junitxml` times summed by file); every other file follows, most
# tests first.
SLOW_FILES = (
    "tests/integration/test_job_runner.py",  # 107: jobs paced and slowed on purpose, mostly waiting
    "tests/test_readme_examples.py",  # 99: two make serve, the docs' examples
    "tests/api/test_push.py",  # 95
    "tests/api/test_authorization_api.py",  # 90: every route, every kind of caller
    "tests/api/test_cli.py",  # 86: every command as a process, each once applied and once refused
    "tests/console/test_console.py",  # 79: make serve and Chromium, 15 pages in the browser
    "tests/api/test_http.py",  # 74
    "tests/api/test_openapi_negative.py",  # 57: schemathesis' negative data, 12 cases for each of 28 operations
    "tests/infra/test_synth_cli.py",  # 54: a CDK CLI synth
    "tests/api/test_device_client.py",  # 52
    "tests/api/test_identity_faults_api.py",  # 51: DynamoDB Local stalled 3 times, once past 13 s
    "tests/test_make_serve.py",  # 48
    "tests/api/test_stall.py",  # 45: DynamoDB Local stalled four times
    "tests/console/test_console_jobs.py",  # 42
    "tests/api/test_handler.py",  # 40
    "tests/api/test_fleet_query.py",  # 39
    "tests/integration/test_fleet_index.py",  # 38
    "tests/api/test_app_client.py",  # 36
    "tests/test_bench_jobs_smoke.py",  # 35
    "tests/api/test_openapi_positive.py",  # 35
    "tests/test_bench_smoke.py",  # 35
    "tests/integration/test_leases.py",  # 34
    "tests/api/test_sections_api.py",  # 34
    "tests/infra/test_stack.py",  # 31
    "tests/api/test_refusals_write_nothing.py",  # 30
    "tests/integration/test_manager.py",  # 30
    "tests/api/test_leases_api.py",  # 30
    "tests/api/test_changes_api.py",  # 27
    "tests/integration/test_changes.py",  # 27
    "tests/infra/test_auth_stack.py",  # 25
    "tests/test_bench_console_smoke.py",  # 25: a dev server and Chromium
    "tests/api/test_hostile_input.py",  # 25
    "tests/test_bench_identity_units_smoke.py",  # 25: the reference fleet's hour twice, through the handler
    "tests/api/test_limits_api.py",  # 25
    "tests/api/test_transactions_api.py",  # 24
    "tests/integration/test_identity.py",  # 22
    "tests/test_bench_fleet_smoke.py",  # 21
    "tests/integration/test_concurrency.py",  # 20
    "tests/test_bench_costs_smoke.py",  # 19: two synths
    "tests/test_make_test_fast.py",  # 19: the suite collected in a second pytest
    "tests/integration/test_push_sections.py",  # 18
    "tests/unit/test_cli.py",  # 17: a listing of 10,000 devices, twice
    "tests/api/test_jobs_faults_api.py",  # 16: its keyed cancel and the naive one wait out one stall
    "tests/integration/test_faults.py",  # 16
    "tests/api/test_schemathesis.py",  # 15
)


def pytest_collection_modifyitems(items):
    """Whole files in SLOW_FILES' order, then by number of tests (see SLOW_FILES)."""
    def file_of(item) -> str:
        return item.nodeid.split("::", 1)[0]

    rank = {path: number for number, path in enumerate(SLOW_FILES)}
    tests_in = Counter(map(file_of, items))
    items.sort(key=lambda item: (rank.get(file_of(item), len(rank)), -tests_in[file_of(item)], file_of(item)))


# The CDK's tests (tests/infra) go to one worker as one unit, not a file each: every process that
# synthesizes pays for jsii's start (node, aws-cdk-lib's assembly) and its first synth, so
# tests/infra cost make test-fast 41 CPU-s on two workers against 29 on one (measured).
ONE_UNIT = "tests/infra/"


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with tests/infra as one unit (ONE_UNIT); any other --dist as xdist has it."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LoadFileWithInfraAsOne(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return ONE_UNIT if nodeid.startswith(ONE_UNIT) else super()._split_scope(nodeid)

    return LoadFileWithInfraAsOne(config, log)


def new_table_name() -> str:
    return f"devices-{uuid.uuid4().hex[:12]}"


def table_admin(endpoint: str):
    """A client for making and dropping test tables: patient, unlike the service's (3 s reads,
    one attempt), since DynamoDB Local's first CreateTable on a loaded machine takes longer and
    a table that is only being made is no write of the code under test."""
    from botocore.config import Config

    return new_client("dynamodb", endpoint_url=endpoint, region_name="us-east-1",
                      config=Config(read_timeout=60, retries={"max_attempts": 5, "mode": "standard"}))


def reads_table_stream(request) -> bool:
    """Whether the test is marked ``table_stream``: only then is its table made with a stream.
    DynamoDB Local keeps every stream's records for good, a dropped table's too, and each later
    write to a table with a stream costs its engine more for them (measured: 1.5 ms of CPU a write
    on a fresh engine, 8-10 ms once it held 12,000 records; a write to a table without a stream
    stayed at about 1.2 ms): 18 % of the CPU of nine integration files."""
    return request.node.get_closest_marker("table_stream") is not None


@pytest.fixture
def local_table(dynamodb_local, request):
    """A fresh table on DynamoDB Local: (client, table name)."""
    client, admin = dynamodb_client(dynamodb_local.endpoint, "us-east-1"), table_admin(dynamodb_local.endpoint)
    name = new_table_name()
    create_table(admin, name, stream=reads_table_stream(request))
    yield client, name
    admin.delete_table(TableName=name)


@pytest.fixture
def connectivity_fleet(dynamodb_local, request):
    """A manager over a fresh DynamoDB Local table declaring connectivity/connected for fleet
    query, its index ready; the table (and its index) deleted after, as local_table's is."""
    from functions.device_state import FleetIndex

    client, admin = dynamodb_client(dynamodb_local.endpoint, "us-east-1"), table_admin(dynamodb_local.endpoint)
    fleet, name = FleetIndex.parse("connectivity/connected:boolean"), new_table_name()
    create_table(admin, name, fleet_index=fleet, stream=reads_table_stream(request))
    manager = DeviceStateManager(client, name, fleet_index=fleet)
    manager.reindex()
    yield manager
    admin.delete_table(TableName=name)


@functools.cache
def moto_client():
    """One client for every moto test of a process (made in the first one's mock): moto serves
    whichever client sends while a mock is on, and a client costs 9-12 ms to make, a third of
    what a moto table costs a test."""
    return new_client("dynamodb", region_name="us-east-1")


@pytest.fixture
def moto_table():
    from moto import mock_aws

    with mock_aws():
        client = moto_client()
        name = new_table_name()
        create_table(client, name)
        yield client, name


# The marks are part of the parameters, so they exist at collection time: `-m "not
# dynamodb_local"` (make test-fast) deselects the DynamoDB Local runs and `-m "not moto_twin"`
# (make test) the moto ones (a mark applied inside the fixture comes too late).
@pytest.fixture(params=[pytest.param("moto", marks=pytest.mark.moto_twin),
                        pytest.param("dynamodb_local", marks=pytest.mark.dynamodb_local)])
def engine(request):
    """The same test on both engines: (client, table name). make test runs it on DynamoDB Local,
    AWS's own engine; make test-fast on moto, in process, for a quick answer."""
    return request.getfixturevalue(f"{'local' if request.param == 'dynamodb_local' else 'moto'}_table")


@pytest.fixture
def timed(engine):
    """(manager, its Clock, the RecordingClient it sends through), on either engine."""
    from tests.helpers import Clock, RecordingClient

    client, name = engine
    clock, spy = Clock(), RecordingClient(client)
    return DeviceStateManager(spy, name, clock=clock), clock, spy


@pytest.fixture
def manager(engine):
    client, name = engine
    return DeviceStateManager(client, name)
