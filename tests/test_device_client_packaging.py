"""`pip install ./clients/python` gives a device author the client on its own: a wheel built
from clients/python installs into a fresh virtual environment that holds nothing but the
standard library and websockets (its one dependency), imports there, and loads nothing of the
service (`functions`, `localdev`) or of its dependencies. Offline: the build uses the repo
venv's setuptools and wheel (--no-build-isolation), websockets comes from the repo venv."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import websockets
from packaging.requirements import Requirement

from tests.make_serve import REPO_ROOT

pytestmark = pytest.mark.toolchain
PACKAGE = REPO_ROOT / "clients" / "python"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source") / "python"  # a copy, so the build leaves the checkout untouched
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                             "--no-index", "--disable-pip-version-check", "-q", "-w", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    [built] = out.glob("device_state_client-*.whl")
    return built


def test_the_wheel_holds_the_client_alone_and_declares_websockets_around_the_suites_pin(wheel):
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    assert "device_state_client/follow.py" in names
    assert not [name for name in names if not name.startswith(("device_state_client/", "device_state_client-"))]
    [metadata] = [name for name in names if name.endswith(".dist-info/METADATA")]
    requirements = [Requirement(line.split(":", 1)[1].strip())
                    for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    assert [requirement.name for requirement in requirements] == ["websockets"]
    pins = [Requirement(line.split("#")[0]) for line in (REPO_ROOT / "requirements-dev.txt").read_text().splitlines()
            if line.startswith("websockets")]
    [pinned] = [next(iter(pin.specifier)).version for pin in pins]
    assert requirements[0].specifier.contains(pinned), (requirements[0], pinned)


def test_installed_into_a_fresh_venv_it_imports_with_websockets_alone(wheel, tmp_path):
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True, timeout=120)
    python = fresh / "bin" / "python"
    result = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", str(wheel),
                             "--no-deps", "--no-index", "-q", "--disable-pip-version-check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    only_websockets = tmp_path / "deps"  # websockets and nothing else of the repo venv's site-packages
    only_websockets.mkdir()
    (only_websockets / "websockets").symlink_to(Path(websockets.__file__).parent)
    code = ("import sys\n"
            "import device_state_client as client\n"
            "from device_state_client import DeviceClient, TokenCredentials\n"
            "DeviceClient('http://127.0.0.1:1/', 'lamp-1', TokenCredentials('t')).follow(since=0)\n"
            "print(client.__file__)\n"
            "loaded = {name.split('.')[0] for name in sys.modules} - set(sys.stdlib_module_names)\n"
            "print(' '.join(sorted(loaded - {'__main__'})))\n")
    result = subprocess.run([str(python), "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(only_websockets)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    location, loaded = result.stdout.splitlines()
    assert Path(location).is_relative_to(fresh)  # the installed copy, not the checkout's
    assert loaded == "device_state_client websockets"
