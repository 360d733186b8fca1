"""The README's examples, run as written against a fresh `make serve`: each shell block marked
`<!-- readme-test: NAME -->` runs in bash and every `# NNN` comment on a command is checked
against the HTTP status that command got; the Python SigV4 client runs too. So the examples
cannot drift from the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.make_serve import REPO_ROOT, make_serve

README = REPO_ROOT / "README.md"
MARKER = re.compile(r"<!-- readme-test: ([\w-]+) -->\n```(\w+)\n(.*?)\n```", re.DOTALL)


def examples() -> dict[str, tuple[str, str]]:
    found = {name: (language, code) for name, language, code in MARKER.findall(README.read_text())}
    assert {"quickstart", "lease", "transaction", "changes", "sections", "python-client"} <= set(found), sorted(found)
    return found


def expected_statuses(script: str) -> list[int]:
    """`# NNN` comments that end a command line (not comment-only lines), in order."""
    statuses = []
    for line in script.splitlines():
        code, hash_, comment = line.partition(" #")
        match = re.match(r"\s*(\d{3})\b", comment)
        if hash_ and code.strip() and match:
            statuses.append(int(match.group(1)))
    return statuses


def test_the_status_comments_are_read_as_intended():
    script = "curl -si x   # 201, ETag\n# 200 only a comment\nLEASE=$(curl -s x)\ncurl -si y  # 423: no token"
    assert expected_statuses(script) == [201, 423]


def test_every_markdown_table_is_contiguous():
    """A blank line inside a table makes the rest render as raw text."""
    lines = README.read_text().splitlines()
    for number, line in enumerate(lines):
        if line.startswith("|") and number and not lines[number - 1].strip():
            following = lines[number + 1] if number + 1 < len(lines) else ""
            assert re.match(r"^\|[-| :]+\|$", following), f"README line {number + 1} starts a table with no header"


@pytest.mark.dynamodb_local
def test_the_readme_examples_run_as_written_on_a_fresh_make_serve():
    blocks = examples()
    with make_serve() as served:
        base = f"localhost:{served.port}"
        for name in ("quickstart", "lease", "transaction", "changes", "sections"):
            language, script = blocks[name]
            assert language == "sh"
            script = script.replace("localhost:3000", base)
            result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                                    timeout=120)
            assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"
            got = [int(status) for status in re.findall(r"HTTP/1\.[01] (\d{3}) ", result.stdout)]
            assert got == expected_statuses(script), f"{name}:\n{result.stdout}"

        language, code = blocks["python-client"]
        assert language == "python"
        environment = dict(os.environ, URL=f"http://{base}/", AWS_REGION="eu-west-1",
                           AWS_ACCESS_KEY_ID="AKIDEXAMPLE", AWS_SECRET_ACCESS_KEY="example")
        environment.pop("AWS_SESSION_TOKEN", None)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                                timeout=60)
        assert result.returncode == 0, result.stderr
        assert [line.split(",")[0] for line in result.stdout.splitlines()] == ["(201", "(200"], result.stdout
