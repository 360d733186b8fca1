"""`make synth`: the real CDK CLI from npm, offline, with the asset bundled without
Docker; the template passes cfn-lint; the bundled asset alone imports the handler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# What the Lambda runtime (boto3) and the Powertools layer provide, nothing else.
RUNTIME_AND_LAYER = ("aws_lambda_powertools", "boto3", "botocore", "jmespath", "dateutil", "s3transfer",
                     "urllib3", "six.py", "typing_extensions.py", "aws_xray_sdk", "wrapt")


def test_make_synth_bundles_lints_and_the_asset_imports_the_handler(tmp_path):
    out = tmp_path / "cdk.out"
    environment = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    result = subprocess.run(["make", "-s", "synth", f"CDK_OUT={out}"], cwd=REPO_ROOT, env=environment,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    template = json.loads((out / "DeviceStateStack.template.json").read_text())

    function = next(resource for resource in template["Resources"].values()
                    if resource["Type"] == "AWS::Lambda::Function"
                    and resource["Properties"].get("Handler") == "functions.api.handler.lambda_handler")
    asset = out / function["Metadata"]["aws:asset:path"]
    assert (asset / "functions" / "api" / "handler.py").exists()
    assert (asset / "jsonpatch.py").exists() and (asset / "jsonpointer.py").exists()
    assert not (asset / "boto3").exists() and not (asset / "aws_lambda_powertools").exists()

    site_packages = Path(next(p for p in sys.path if p.endswith("site-packages")))
    provided = tmp_path / "runtime-and-layer"
    provided.mkdir()
    for name in RUNTIME_AND_LAYER:
        (provided / name).symlink_to(site_packages / name)
    probe = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]];"
        "import functions.api.handler, jsonpatch;"
        "assert jsonpatch.__file__.startswith(sys.argv[1]), jsonpatch.__file__;"
        "print('ok')"
    )
    imported = subprocess.run([sys.executable, "-S", "-c", probe, str(asset), str(provided)],
                              capture_output=True, text=True, env={"PATH": os.environ["PATH"]}, timeout=120)
    assert imported.stdout.strip() == "ok", imported.stderr
