"""`make synth`: the real CDK CLI from npm, offline, with the asset bundled without
Docker; the template passes cfn-lint; the bundled asset alone imports the handlers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.api import PYTHON_VERSION
from infra.bundling import compile_bytecode, interpreter_of

REPO_ROOT = Path(__file__).resolve().parents[2]
# What the Lambda runtime (boto3) and the Powertools layer provide, nothing else.
RUNTIME_AND_LAYER = ("aws_lambda_powertools", "boto3", "botocore", "jmespath", "dateutil", "s3transfer",
                     "urllib3", "six.py", "typing_extensions.py", "aws_xray_sdk", "wrapt")


ELF_AARCH64 = 183  # e_machine of an ELF file built for arm64


def elf_machine(path: Path) -> int:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", path
    return int.from_bytes(header[18:20], "little")


def assert_no_node_warning(output: str) -> None:
    """jsii and the CDK CLI print a banner on an unsupported Node; nothing may hide it."""
    assert "end-of-life" not in output and "not supported" not in output.lower(), output
    assert "upgrade to a supported node" not in output.lower(), output


def test_nothing_silences_the_node_support_warning_and_node_22_is_declared():
    for path in ("Makefile", "tests/infra/conftest.py", "tests/conftest.py", "cdk.json", ".ci/run"):
        assert "JSII_SILENCE" not in (REPO_ROOT / path).read_text(), path
    package = json.loads((REPO_ROOT / "package.json").read_text())
    assert package["engines"]["node"] == ">=22"
    lock = json.loads((REPO_ROOT / "package-lock.json").read_text())["packages"]
    for name, version in package["optionalDependencies"].items():
        assert lock[f"node_modules/{name}"]["version"] == version and version.startswith("22.")
    node = subprocess.run(["node", "--version"], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{REPO_ROOT / 'node_modules' / '.bin'}:{os.environ['PATH']}"})
    assert int(node.stdout.strip().lstrip("v").split(".")[0]) >= 22, node.stdout


def without_aws(extra: dict | None = None) -> dict:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    environment.update({"AWS_EC2_METADATA_DISABLED": "true", "CDK_DISABLE_CLI_TELEMETRY": "1",
                        "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"})
    return environment | (extra or {})


@pytest.mark.toolchain
def test_make_deploy_runs_make_synth_with_its_deploy_args_and_the_asset_imports_the_handler(tmp_path):
    """`make deploy` runs `make synth`'s recipe (the CDK CLI as plain `npx cdk synth`, offline, the
    asset bundled without Docker, cfn-lint) with its DEPLOY_ARGS, then `cdk deploy --app` on that
    assembly: so plain `npx cdk synth` works from a set-up clone (cdk.json runs the venv's python,
    npx puts node_modules/.bin, Node 22, first on PATH), with no other run of the CLI. No account
    here, so the deploy itself fails (for that reason, not another): reaching it shows synth and
    lint passed, and the assembly shows the flags took effect and the asset is complete. One
    synthesis serves both commands (each costs about 20 s of CPU). A fleet index is declared, so
    cfn-lint checks its indexes and the reindex function too."""
    from functions.device_state import FleetIndex
    from tests.infra.test_fleet_index_stack import FLEET

    out = tmp_path / "cdk.out"
    result = subprocess.run(
        ["make", "-s", "deploy", f"CDK_OUT={out}",
         f"DEPLOY_ARGS=-c alarmEmail=ops@example.com -c throttleRateLimit=42 -c fleetIndex={FLEET}"],
        cwd=REPO_ROOT, env=without_aws(), capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode != 0  # no credentials: nothing was deployed
    assert "Unable to resolve AWS account" in output, output
    assert_no_node_warning(output)
    template = json.loads((out / "DeviceStateStack.template.json").read_text())
    resources = template["Resources"].values()
    subscription = next(r for r in resources if r["Type"] == "AWS::SNS::Subscription")
    assert subscription["Properties"]["Endpoint"] == "ops@example.com"
    stages = [r for r in resources if r["Type"] == "AWS::ApiGatewayV2::Stage"]
    assert len(stages) == 2  # the HTTP API's and the WebSocket API's
    assert all(stage["Properties"]["DefaultRouteSettings"]["ThrottlingRateLimit"] == 42 for stage in stages)
    table = next(r for r in resources if r["Type"] == "AWS::DynamoDB::Table")
    assert table["Properties"]["GlobalSecondaryIndexes"] == FleetIndex.parse(FLEET).global_secondary_indexes()
    assert_the_asset_is_complete(template, out, tmp_path)


def assert_the_asset_is_complete(template: dict, out: Path, tmp_path: Path) -> None:
    """The bundled asset holds the handlers and what neither the runtime nor the layer brings,
    as arm64 binaries, and alone (with the runtime's and the layer's packages) imports them."""
    function = next(resource for resource in template["Resources"].values()
                    if resource["Type"] == "AWS::Lambda::Function"
                    and resource["Properties"].get("Handler") == "functions.api.handler.lambda_handler")
    asset = out / function["Metadata"]["aws:asset:path"]
    assert (asset / "functions" / "api" / "handler.py").exists()
    assert (asset / "jsonpatch.py").exists() and (asset / "jsonpointer.py").exists()
    assert (asset / "jwt" / "__init__.py").exists() and (asset / "cryptography" / "__init__.py").exists()
    assert not (asset / "boto3").exists() and not (asset / "aws_lambda_powertools").exists()
    # Bytecode of the function's Python, when this machine has one (CI's has pyenv's 3.13).
    compiled = (asset / "functions" / "api" / "__pycache__" / "handler.cpython-313.pyc").exists()
    assert compiled == (interpreter_of(PYTHON_VERSION) is not None)
    # cryptography's and cffi's compiled parts for the function's platform (arm64, Python 3.13).
    binaries = [asset / "cryptography" / "hazmat" / "bindings" / "_rust.abi3.so",
                asset / "_cffi_backend.cpython-313-aarch64-linux-gnu.so"]
    assert all(elf_machine(binary) == ELF_AARCH64 for binary in binaries), binaries
    authorizer = next(resource for resource in template["Resources"].values()
                      if resource["Type"] == "AWS::Lambda::Function"
                      and resource["Properties"].get("Handler") == "functions.auth.authorizer.lambda_handler")
    assert authorizer["Metadata"]["aws:asset:path"] == function["Metadata"]["aws:asset:path"]
    [reindex] = [resource for resource in template["Resources"].values()  # a fleet index is declared
                 if resource["Type"] == "AWS::Lambda::Function"
                 and resource["Properties"].get("Handler") == "functions.reindex.handler.handler"]
    assert reindex["Metadata"]["aws:asset:path"] == function["Metadata"]["aws:asset:path"]

    site_packages = Path(next(p for p in sys.path if p.endswith("site-packages")))
    provided = tmp_path / "runtime-and-layer"
    provided.mkdir()
    for name in RUNTIME_AND_LAYER:
        (provided / name).symlink_to(site_packages / name)
    probe = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]];"
        "import functions.api.handler, functions.auth.authorizer, functions.push.handler, functions.push.fanout;"
        "import functions.reindex.handler;"
        "import jsonpatch;"
        "assert jsonpatch.__file__.startswith(sys.argv[1]), jsonpatch.__file__;"
        "print('ok')"
    )
    imported = subprocess.run([sys.executable, "-S", "-c", probe, str(asset), str(provided)],
                              capture_output=True, text=True, env={"PATH": os.environ["PATH"]}, timeout=120)
    assert imported.stdout.strip() == "ok", imported.stderr


def test_make_deploy_runs_the_synth_recipe_with_lint_first():
    """What the test above relies on: `make deploy` is `make synth` (CLI synth, then cfn-lint)
    followed by the deploy of that assembly."""
    dry_run = subprocess.run(["make", "-n", "deploy", "CDK_OUT=out", "DEPLOY_ARGS=-c x=1"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=60)
    lines = [line for line in dry_run.stdout.splitlines() if "cdk " in line or "cfn-lint" in line]
    assert [("synth" in line, "cfn-lint" in line, "deploy" in line) for line in lines] == [
        (True, False, False), (False, True, False), (False, False, True)], dry_run.stdout
    assert all("-c x=1" in line for line in (lines[0], lines[2])), lines
    assert "npx --no-install cdk synth" in lines[0], lines  # the plain command the test above runs


def test_the_asset_is_compiled_unchecked_by_a_python_of_its_version_and_ships_without_bytecode_when_none_is_here(
        tmp_path, capsys):
    version = "%d.%d" % sys.version_info[:2]  # this interpreter's: found on PATH as python3.X
    for directory in (tmp_path / "found", tmp_path / "missing"):
        (directory / "package").mkdir(parents=True)
        (directory / "package" / "module.py").write_text("VALUE = 1\n")
    assert compile_bytecode(tmp_path / "found", version) is True
    [compiled] = (tmp_path / "found" / "package" / "__pycache__").glob(f"module.*{sys.version_info[0]}{sys.version_info[1]}.pyc")
    assert int.from_bytes(compiled.read_bytes()[4:8], "little") == 0b01  # hash-based, source not checked
    assert compile_bytecode(tmp_path / "missing", "3.99") is False
    assert not (tmp_path / "missing" / "package" / "__pycache__").exists()
    assert "no Python 3.99 here, so the Lambda asset ships without bytecode" in capsys.readouterr().err
