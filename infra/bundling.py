"""Local (Docker-free) bundling of the Lambda asset: the ``functions`` package plus the
runtime dependencies that neither the Lambda runtime (boto3) nor the Powertools layer
brings, as arm64 wheels for the function's Python, compiled to that Python's bytecode when this
machine has an interpreter of its version (Lambda cannot write bytecode into /var/task, so an
asset without it compiles every module it imports at each cold start)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsii
from aws_cdk import BundlingOptions, DockerImage, ILocalBundling

REPO_ROOT = Path(__file__).resolve().parent.parent
# What requirements.txt pins beyond boto3/botocore (runtime) and Powertools (layer).
# cryptography loads cffi's _cffi_backend at import; cffi declares pycparser.
BUNDLED_PACKAGES = ("jsonpatch", "jsonpointer", "PyJWT", "cryptography", "cffi", "pycparser")
# Wheel platforms pip may take for arm64: cryptography publishes manylinux_2_28/_2_34 aarch64
# wheels, not only manylinux2014. All run on the Python 3.13 runtime (Amazon Linux 2023, glibc 2.34).
PLATFORMS = ("manylinux2014_aarch64", "manylinux_2_28_aarch64", "manylinux_2_34_aarch64")


def pinned(requirements: Path = REPO_ROOT / "requirements.txt") -> list[str]:
    lines = [line.split("#")[0].strip() for line in requirements.read_text().splitlines()]
    return [line for line in lines if line and line.split("==")[0].split("[")[0] in BUNDLED_PACKAGES]


def pinned_version(package: str, requirements: Path = REPO_ROOT / "requirements.txt") -> str:
    """The version requirements.txt pins for ``package`` (``name[extras]==version``)."""
    for line in requirements.read_text().splitlines():
        spec = line.split("#")[0].strip()
        if spec.split("==")[0].split("[")[0].strip().lower() == package.lower():
            return spec.split("==")[1].strip()
    raise LookupError(f"{package} is not pinned in {requirements}")


def interpreter_of(version: str) -> str | None:
    """A Python interpreter of ``version`` ("3.13") on this machine: ``python3.13`` on PATH, or
    one pyenv installed; None when there is none."""
    pyenv_root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates = [shutil.which(f"python{version}"),
                  *sorted(glob.glob(f"{pyenv_root}/versions/{version}.*/bin/python{version}"), reverse=True)]
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


def compile_bytecode(directory: Path, version: str) -> bool:
    """Compile every module under ``directory`` with a Python of ``version``, as unchecked bytecode:
    the runtime reads it without comparing it to the source (an asset never changes once deployed,
    and a zip does not keep the times a check would compare). False, with a warning, when this
    machine has no such Python: the asset then works as well, its cold starts only slower."""
    interpreter = interpreter_of(version)
    if interpreter is None:
        print(f"warning: no Python {version} here, so the Lambda asset ships without bytecode and compiles "
              f"its modules at each cold start (install python{version} to ship it)", file=sys.stderr)
        return False
    subprocess.run([interpreter, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
                    str(directory)], check=True)
    return True


@jsii.implements(ILocalBundling)
class _PipLocalBundling:
    def __init__(self, python_version: str, platforms: tuple[str, ...]):
        self._python_version = python_version
        self._platforms = platforms

    def try_bundle(self, output_dir: str, *, image=None, **_options) -> bool:
        output = Path(output_dir)
        shutil.copytree(REPO_ROOT / "functions", output / "functions",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--no-deps", "--no-compile", "--only-binary=:all:",
             *(option for platform in self._platforms for option in ("--platform", platform)),
             "--python-version", self._python_version, "--implementation", "cp",
             "--target", str(output), *pinned()],
            check=True,
        )
        compile_bytecode(output, self._python_version)
        return True


def bundling_options(python_version: str, platforms: tuple[str, ...] = PLATFORMS) -> BundlingOptions:
    return BundlingOptions(
        # Never pulled: local bundling always succeeds, so no Docker is needed.
        image=DockerImage.from_registry("public.ecr.aws/sam/build-python" + python_version),
        local=_PipLocalBundling(python_version, platforms),
    )
