"""`pip install .` gives the library: a wheel built from the repository holds the package
`functions.device_state` (and nothing of the HTTP layer), declares its runtime dependencies,
and imports and works from an install folder that is not the repository. Offline: the build
uses the venv's setuptools and wheel (--no-build-isolation), and nothing is downloaded."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.make_serve import REPO_ROOT

pytestmark = pytest.mark.toolchain


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")  # a copy, so the build leaves the checkout untouched
    shutil.copy(REPO_ROOT / "pyproject.toml", source)
    shutil.copytree(REPO_ROOT / "functions", source / "functions", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                             "--no-index", "--disable-pip-version-check", "-q", "-w", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    [built] = out.glob("*.whl")
    return built


def test_the_wheel_holds_the_library_and_not_the_service(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "functions/device_state/manager.py" in names and "functions/__init__.py" in names
    assert not [name for name in names if name.startswith(("functions/api/", "functions/changes/", "infra/", "tests/"))]


def test_the_wheel_declares_what_the_library_imports(wheel):
    archive = zipfile.ZipFile(wheel)
    [metadata] = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
    declared = {Requirement(line.split(":", 1)[1].strip()).name
                for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")}
    source = "\n".join(path.read_text() for path in (REPO_ROOT / "functions" / "device_state").rglob("*.py"))
    imported = set(re.findall(r"^\s*(?:import|from) (boto3|botocore|jsonpatch|jsonpointer|aws_lambda_powertools)\b",
                              source, re.MULTILINE))
    assert imported == declared, (imported, declared)


def test_the_declared_ranges_admit_the_pins_the_suite_runs_on():
    pins = {}
    for line in (REPO_ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()  # pip allows a comment after a requirement
        if line:
            requirement = Requirement(line)
            pins[requirement.name] = next(iter(requirement.specifier)).version
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        assert requirement.specifier.contains(pins[requirement.name]), (line, pins[requirement.name])


def test_installed_from_the_wheel_the_library_imports_outside_the_repository(wheel, tmp_path):
    target = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "pip", "install", str(wheel), "--no-deps", "--no-index", "-q",
                             "--disable-pip-version-check", "--target", str(target)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    code = ("import functions.device_state as library, sys\n"
            "print(library.__file__)\n"
            "print(library.DeviceStateManager.__name__, library.dynamodb_client.__name__)\n"
            "print('functions.api' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(target)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    location, names, api_loaded = result.stdout.splitlines()
    assert Path(location).is_relative_to(target)
    assert names == "DeviceStateManager dynamodb_client" and api_loaded == "False"
