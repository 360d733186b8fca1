"""Local (Docker-free) bundling of the Lambda asset: the ``functions`` package plus the
runtime dependencies that neither the Lambda runtime (boto3) nor the Powertools layer
brings, as arm64 wheels for the function's Python."""

from __future__ import annotations

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
        return True


def bundling_options(python_version: str, platforms: tuple[str, ...] = PLATFORMS) -> BundlingOptions:
    return BundlingOptions(
        # Never pulled: local bundling always succeeds, so no Docker is needed.
        image=DockerImage.from_registry("public.ecr.aws/sam/build-python" + python_version),
        local=_PipLocalBundling(python_version, platforms),
    )
