"""`pip install ./clients/python` gives a device author the client on its own: a wheel built
from clients/python installs into a fresh virtual environment that holds nothing but the
standard library and websockets (its one dependency), imports there, and loads nothing of the
service (`functions`, `localdev`) or of its dependencies. With the `cli` extra it installs the
`device-state` command, whose `--help` runs on Click alone. Offline: the build uses the repo
venv's setuptools and wheel (--no-build-isolation), the dependencies come from the repo venv."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import click
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


def _pins() -> dict:
    """requirements.txt's and requirements-dev.txt's pins by lower-case name."""
    pins = {}
    lines = [line for name in ("requirements.txt", "requirements-dev.txt")
             for line in (REPO_ROOT / name).read_text().splitlines()]
    for line in lines:
        text = line.split("#")[0].strip()
        if "==" in text:
            requirement = Requirement(text)
            pins[requirement.name.lower()] = next(iter(requirement.specifier)).version
    return pins


def test_the_wheel_holds_the_clients_alone_and_declares_ranges_around_the_suites_pins(wheel):
    """websockets for every install; Click, Rich and PyYAML only with the cli extra; cryptography
    only with the keys extra (a device signing with a private key)."""
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    assert {"device_state_client/follow.py", "device_state_client/app.py", "device_state_client/cli/__init__.py"} \
        <= set(names)
    assert not [name for name in names if not name.startswith(("device_state_client/", "device_state_client-"))]
    [metadata] = [name for name in names if name.endswith(".dist-info/METADATA")]
    requirements = [Requirement(line.split(":", 1)[1].strip())
                    for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    always = [requirement.name for requirement in requirements if requirement.marker is None]
    with_cli = sorted(requirement.name for requirement in requirements
                      if requirement.marker is not None and requirement.marker.evaluate({"extra": "cli"}))
    with_keys = [requirement.name for requirement in requirements
                 if requirement.marker is not None and requirement.marker.evaluate({"extra": "keys"})]
    assert always == ["websockets"] and with_cli == ["PyYAML", "click", "rich"] and with_keys == ["cryptography"]
    pins = _pins()
    for requirement in requirements:
        assert requirement.specifier.contains(pins[requirement.name.lower()]), (requirement, pins)
    [entry_points] = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    assert "device-state = device_state_client.cli:main" in archive.read(entry_points).decode()


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


def test_with_the_cli_extra_the_command_is_installed_and_its_help_loads_click_alone(wheel, tmp_path):
    """The console script of a fresh venv with Click beside it (Rich and PyYAML are not even
    there): --help answers and loads no HTTP, WebSocket, table or YAML library."""
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True, timeout=120)
    result = subprocess.run([sys.executable, "-m", "pip", "--python", str(fresh / "bin" / "python"), "install",
                             f"{wheel}[cli]", "--no-deps", "--no-index", "-q", "--disable-pip-version-check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    only_click = tmp_path / "deps"
    only_click.mkdir()
    (only_click / "click").symlink_to(Path(click.__file__).parent)
    environment = {"PYTHONPATH": str(only_click), "PATH": "/usr/bin:/bin"}
    command = subprocess.run([str(fresh / "bin" / "device-state"), "--help"], cwd=tmp_path, env=environment,
                             capture_output=True, text=True, timeout=60)
    assert command.returncode == 0, command.stderr
    assert command.stdout.startswith("Usage: device-state [OPTIONS] COMMAND") and "watch" in command.stdout
    code = ("import sys\n"
            "from device_state_client.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit as done:\n    assert done.code == 0\n"
            "loaded = {name for name in sys.modules if name.split('.')[0] in ('urllib', 'http', 'ssl', 'socket',\n"
            "          'websockets', 'rich', 'yaml', 'subprocess', 'configparser')}\n"
            "print(' '.join(sorted(loaded)), file=sys.stderr)\n")
    loaded = subprocess.run([str(fresh / "bin" / "python"), "-c", code], cwd=tmp_path, env=environment,
                            capture_output=True, text=True, timeout=60)
    assert loaded.returncode == 0 and loaded.stderr.strip() == "", loaded.stderr
