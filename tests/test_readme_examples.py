"""The README's and docs/'s examples, run as written against a fresh `make serve`.

Every fenced block in README.md and docs/ (docs/api/ too) is marked: `<!-- readme-test: NAME -->` blocks
run (shell blocks in bash, every `# NNN` comment on a command checked against the HTTP status
that command got; Python blocks with the environment the docs tell a reader to set, every
`# ...` after a `print` checked against the line it printed), and `<!-- not-run: why -->`
blocks say why they cannot run here (they need AWS, or are not commands). So the examples
cannot drift from the code, and no block goes untested without saying so. The same documents'
relative links resolve (the file, and the heading anchor as GitHub makes it), and the cost
figures they quote are the committed bench results."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from tests.make_serve import REPO_ROOT, make_serve

DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
# The contract: with the README, the documents that name no test file (see the test below).
CONTRACT = [REPO_ROOT / "README.md", REPO_ROOT / "docs" / "api.md",
            *sorted((REPO_ROOT / "docs" / "api").glob("*.md"))]
LINKED_DOCUMENTS = [*DOCUMENTS, REPO_ROOT / "clients" / "python" / "README.md"]
FENCE = re.compile(r"^```(\w*)\n(.*?)\n```$", re.DOTALL | re.MULTILINE)
MARK = re.compile(r"<!-- (readme-test|not-run): ?([^>]*?) -->\n$")


def _name(document: Path) -> str:
    return str(document.relative_to(REPO_ROOT)) if document.is_relative_to(REPO_ROOT) else document.name


def blocks() -> list[tuple[str, str, str, str, str]]:
    """(document, mark, name or reason, language, code) of every fenced block."""
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for match in FENCE.finditer(text):
            mark = MARK.search(text[:match.start()])
            kind, label = mark.groups() if mark else ("", "")
            found.append((_name(document), kind, label, match.group(1), match.group(2)))
    return found


TLS_WALKTHROUGH = "docs/devices.md"  # its blocks run in order on make serve TLS=1, the others on make serve


def examples(walkthrough: bool = False) -> dict[str, tuple[str, str]]:
    """The runnable blocks by name: the device walkthrough's (in order), or every other document's."""
    found = {}
    for document, kind, name, language, code in blocks():
        if kind == "readme-test" and (document == TLS_WALKTHROUGH) == walkthrough:
            assert name not in found, f"two examples named {name}"
            found[name] = (language, code)
    expected = ({"devices-app-desires", "devices-certificate-loop", "devices-token-loop", "devices-expiry",
                 "devices-enrollment", "devices-enrollment-loop", "devices-enrollment-outcome"}
                if walkthrough else {"quickstart", "quickstart-cli", "tour-cli", "lease", "transaction", "changes",
                                     "sections", "python-client", "library", "device-token", "push-client"})
    assert expected <= set(found), sorted(found)
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


CLI_BLOCK_SUFFIX = "-cli"  # an example of the device-state command: its commands' exit statuses are checked
EXIT_COMMENT = re.compile(r"\s*exit (\d+)\b(?:, (\d{3})\b)?")


def cli_commands(script: str) -> list[tuple[str, int, int | None]]:
    """A command-line example's commands (continued lines joined), each with the exit status its
    `# exit N` comment names (0 without one) and the problem status after it (`# exit 1, 412`)."""
    commands, pending = [], ""
    for line in script.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        code, hash_, comment = line.partition(" #")
        if not code.strip() or code.lstrip().startswith("#"):
            continue
        match = EXIT_COMMENT.match(comment) if hash_ else None
        commands.append((code.rstrip(), int(match.group(1)) if match else 0,
                         int(match.group(2)) if match and match.group(2) else None))
    return commands


def cli_on_path(folder: Path) -> dict:
    """The environment of a shell with `device-state` on its PATH, as `pip install
    './clients/python[cli]'` puts it there: a script running this checkout's command."""
    script = folder / "device-state"
    script.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(REPO_ROOT / 'clients' / 'python'))} "
                      f"exec {shlex.quote(sys.executable)} -m device_state_client.cli \"$@\"\n")
    script.chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def run_cli_example(name: str, script: str, environment: dict) -> None:
    """Runs a command-line example in one bash, as a reader types it, each command's exit
    status (and, for a refusal, the problem status it printed) checked against its comment."""
    commands = cli_commands(script)
    marked = "set -uo pipefail\nexec 2>&1\n" + "".join(f"{code}\necho \"::exit $?\"\n" for code, _, _ in commands)
    result = subprocess.run(["bash", "-c", marked], capture_output=True, text=True, timeout=180, cwd=REPO_ROOT,
                            env=environment, stdin=subprocess.DEVNULL)
    *outputs, _ = re.split(r"^::exit \d+$\n?", result.stdout, flags=re.MULTILINE)
    statuses = [int(status) for status in re.findall(r"^::exit (\d+)$", result.stdout, re.MULTILINE)]
    assert len(statuses) == len(commands), f"{name}:\n{result.stdout}\n{result.stderr}"
    for (code, expected, problem), status, output in zip(commands, statuses, outputs):
        assert status == expected, f"{name}: {code}\nexited {status}, not {expected}:\n{output}\n{result.stderr}"
        if problem is not None:
            assert f"error: {problem} " in output, f"{name}: {code}\nprinted no {problem} problem:\n{output}"


def expected_prints(code: str) -> list[str]:
    """The `# ...` comment of every `print(...)` line of a Python example, in order."""
    return [line.partition("# ")[2].strip() for line in code.splitlines()
            if line.lstrip().startswith("print(") and "# " in line]


def test_the_status_comments_are_read_as_intended():
    script = "curl -si x   # 201, ETag\n# 200 only a comment\nLEASE=$(curl -s x)\ncurl -si y  # 423: no token"
    assert expected_statuses(script) == [201, 423]


def test_the_exit_comments_of_command_line_examples_are_read_as_intended():
    script = ("export X=1\n# a comment\n\ndevice-state get a   # exit 0: shown\n"
              "device-state patch a --merge '{}' \\\n    --if-match 1   # exit 1, 412: moved\ndevice-state get b  # 404")
    assert cli_commands(script) == [("export X=1", 0, None), ("device-state get a", 0, None),
                                    ("device-state patch a --merge '{}'      --if-match 1", 1, 412),
                                    ("device-state get b", 0, None)]


def test_the_print_comments_are_read_as_intended():
    code = "x = 1  # not a print\nprint(x)      # 1\n# print(2)  # a comment\nprint(x, 2)   # 1 2"
    assert expected_prints(code) == ["1", "1 2"]


def test_every_block_is_run_or_says_why_not():
    unmarked = [(document, code[:60]) for document, kind, _, _, code in blocks() if not kind]
    assert not unmarked, f"blocks neither marked readme-test nor not-run: {unmarked}"
    assert all(label for _, kind, label, _, _ in blocks() if kind == "not-run"), "a not-run block gives no reason"


def test_the_mark_check_finds_an_unmarked_block(tmp_path, monkeypatch):
    document = tmp_path / "x.md"
    document.write_text("<!-- not-run: needs AWS -->\n```sh\naws s3 ls\n```\n\ntext\n\n```sh\nmake x\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "DOCUMENTS", [document])
    assert [kind for _, kind, *_ in blocks()] == ["not-run", ""]


def test_every_markdown_table_is_contiguous():
    """A blank line inside a table makes the rest render as raw text."""
    for document in DOCUMENTS:
        lines = document.read_text().splitlines()
        for number, line in enumerate(lines):
            if line.startswith("|") and number and not lines[number - 1].strip():
                following = lines[number + 1] if number + 1 < len(lines) else ""
                assert re.match(r"^\|[-| :]+\|$", following), f"{_name(document)} line {number + 1}: a table with no header"


def test_the_docs_speak_of_the_project_not_of_how_it_was_built():
    stale = re.compile(r"\bissue \d+|\(issue|this session|these machines|this shared|about 9\.5 minutes", re.I)
    for document in DOCUMENTS:
        for number, line in enumerate(document.read_text().splitlines(), 1):
            assert not stale.search(line), f"{_name(document)} line {number}: {line}"


def test_the_docs_say_what_is_not_what_changed():
    """History belongs in git and, stated as decisions, in docs/decisions.md: no document tells
    what the code did before or no longer does."""
    history = re.compile(r"\bno longer\b|\banymore\b|\bused to\b|\bstays? missed\b|\bdecades\b|"
                         r"(?<!from )\bnow\b(?! and then)|(?:^|\. |\()\s*before,|\bbefore this\b|"
                         r"\buntil recently\b", re.I)
    for document in DOCUMENTS:
        for number, line in enumerate(document.read_text().splitlines(), 1):
            assert not history.search(line), f"{_name(document)} line {number}: {line}"


def test_the_front_door_and_the_contract_leave_the_test_harness_to_development_md():
    """README.md, docs/api.md and its pages under docs/api/ name no test file and explain no
    example markers: how the examples are run is told in docs/development.md. The markers
    themselves (HTML comments, not rendered) stay beside their blocks."""
    assert len(CONTRACT) > 3, CONTRACT
    for document in CONTRACT:
        for number, line in enumerate(document.read_text().splitlines(), 1):
            if line.startswith("<!-- ") and line.endswith(" -->"):
                continue
            assert not re.search(r"\btests/[\w/]+\.py|readme-test|not-run|\bno test\b", line), \
                f"{_name(document)} line {number}: {line}"
    development = (REPO_ROOT / "docs" / "development.md").read_text()
    assert "<!-- readme-test: NAME -->" in development and "<!-- not-run: why -->" in development


def test_nothing_in_the_repository_points_outside_it():
    outside = "\\.\\." + "/shared"  # spelled apart so this file does not match itself
    result = subprocess.run(["git", "grep", "-n", "-e", outside], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 1 and not result.stdout, result.stdout


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: its text as rendered (no code marks, emphasis or link
    targets), lower-cased, punctuation dropped (letters, digits, `_`, `-` and spaces stay),
    spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _without_code(text: str) -> str:
    """The text with fenced blocks blanked (line count kept) and inline code spans removed."""
    text = FENCE.sub(lambda match: "\n" * match.group(0).count("\n"), text)
    return re.sub(r"`[^`]*`", "", text)


def anchors(document: Path) -> set[str]:
    """The anchors a Markdown document offers: each heading's (a repeated one gets -1, -2, ...,
    as on GitHub) and any explicit `<a id=...>`/`<a name=...>`."""
    found, seen = set(), {}
    text = FENCE.sub("", document.read_text())
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.MULTILINE):
        anchor = github_anchor(heading)
        found.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
        seen[anchor] = seen.get(anchor, 0) + 1
    found.update(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    return found


LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]+)\)")


def broken_links(document: Path) -> list[str]:
    """Every relative link of a Markdown document whose file or heading anchor does not exist."""
    broken = []
    for match in LINK.finditer(_without_code(document.read_text())):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    return broken


def test_github_anchors_are_made_as_github_makes_them():
    assert github_anchor("Device tokens: certificate to token") == "device-tokens-certificate-to-token"
    assert github_anchor("A desire's life: acknowledgements, expiry, clear on confirm") == \
        "a-desires-life-acknowledgements-expiry-clear-on-confirm"
    assert github_anchor("Exactly once: `Idempotency-Key`") == "exactly-once-idempotency-key"
    assert github_anchor("Configuration (environment, read in `functions/config.py`)") == \
        "configuration-environment-read-in-functionsconfigpy"
    assert github_anchor("Benchmark: `make bench`") == "benchmark-make-bench"


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Two words\n\n```sh\n# not a heading\n```\n")
    document = tmp_path / "x.md"
    document.write_text("[a](other.md#two-words) [b](other.md#not-a-heading) [c](gone.md) [d](#x)\n"
                        "`[e](gone.md)` [f](https://example.com/gone.md)\n\n"
                        "```sh\n[g](gone.md)\n```\n\n# X\n")
    assert broken_links(document) == ["other.md#not-a-heading: no heading with that anchor",
                                      "gone.md: no such file"]


def test_every_relative_link_and_anchor_in_the_docs_resolves():
    """README.md, docs/ (docs/api/ too) and the device client's README: each relative link names
    a file that exists and, where it has one, a heading anchor that file has."""
    broken = {_name(document): found for document in LINKED_DOCUMENTS if (found := broken_links(document))}
    assert not broken, broken


def _dollars(figure: float) -> int:
    """A figure rounded to whole dollars as the documents write them (half up, as costs.md does)."""
    return int(Decimal(str(figure)).quantize(Decimal(1), ROUND_HALF_UP))


def _committed_bill() -> tuple[dict, dict, dict]:
    """The committed month's bill: this service on demand, with provisioned capacity, Device Shadow."""
    results = json.loads((REPO_ROOT / "bench" / "results" / "costs.json").read_text())
    return (results["bill"]["this service"], results["provisioned capacity"]["bill"]["this service"],
            results["bill"]["Device Shadow"])


def test_the_cost_figures_the_readme_states_are_the_committed_results():
    """Every dollar figure of the README is one of the committed month's totals, each in its
    place, and a report's request units are the committed measurement's."""
    on_demand, provisioned, shadow = (_dollars(sum(bill.values())) for bill in _committed_bill())
    readme = (REPO_ROOT / "README.md").read_text()
    stated = [int(figure.replace(",", "")) for figure in re.findall(r"\$(\d[\d,]*)", readme)]
    assert stated and set(stated) <= {on_demand, provisioned, shadow}, stated
    headline = re.search(r"\$([\d,]+) on demand and \$([\d,]+) with provisioned capacity, against Device "
                         r"Shadow's \$([\d,]+)", readme)
    assert headline, "the README states no month's headline"
    assert [int(figure.replace(",", "")) for figure in headline.groups()] == [on_demand, provisioned, shadow]
    report = json.loads((REPO_ROOT / "bench" / "results" / "costs.json").read_text())["operations"]["report"]
    units = re.search(r"about (\d+) DynamoDB write units \((\S+) on its item, (\S+) for its change item\) "
                      r"and (\S+) read unit", readme)
    assert units, "the README states no report's request units"
    assert float(units[2]) == report["service_write"] and float(units[3]) == round(report["changes_write"], 2)
    assert int(units[1]) == round(report["service_write"] + report["changes_write"])
    assert float(units[4]) == report["push_read"]


def test_the_cost_headline_and_components_of_costs_md_are_the_committed_results():
    bills = _committed_bill()
    on_demand, provisioned, shadow = (_dollars(sum(bill.values())) for bill in bills)
    costs = (REPO_ROOT / "docs" / "costs.md").read_text()
    headline = re.search(r"this\s+service ([\d,]+) on demand \([\d,-]+\), ([\d,]+) with "
                         r"`-c capacity=provisioned`\s+\([\d,-]+\), Device Shadow ([\d,]+)\*\*", costs)
    assert headline, "costs.md states no month's headline"
    assert [int(figure.replace(",", "")) for figure in headline.groups()] == [on_demand, provisioned, shadow]
    below, times = re.search(r"the bill is (\d+) % below Shadow's; on demand .*? it is ([\d.]+) times "
                             r"Shadow's", costs, re.DOTALL).groups()
    assert int(below) == round(100 * (1 - provisioned / shadow))
    assert float(times) == round(on_demand / shadow, 2)
    table = costs.split("| component | on demand | provisioned |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| ([\d,]+) \| ([\d,]+) \|", table, re.MULTILINE)
    assert len(rows) == len(bills[0]), rows
    for component, stated_on_demand, stated_provisioned in rows:
        (key,) = [key for key in bills[0] if component in key]
        assert (int(stated_on_demand.replace(",", "")), int(stated_provisioned.replace(",", ""))) == \
            (_dollars(bills[0][key]), _dollars(bills[1][key])), component


def test_the_readme_stays_a_front_door():
    readme = (REPO_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    first_screen = "\n".join(readme.splitlines()[:20])
    assert "make serve" in first_screen and "make test" in first_screen
    for document in ("docs/api.md", "docs/operations.md", "docs/decisions.md", "docs/library.md", "docs/costs.md"):
        assert f"]({document})" in readme, f"the README does not link {document}"


def _run_python(code: str, environment_lines: str, cwd: Path = REPO_ROOT, **variables: str
                ) -> subprocess.CompletedProcess:
    """A Python example as a reader runs it in the shell that started make serve (the same
    credentials, if any): the environment the docs name, then the code."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("AWS_REGION", "AWS_DEFAULT_REGION", "DYNAMODB_ENDPOINT", "URL", "PYTHONPATH")}
    env.update(variables)
    script = f"{environment_lines}\nexec {shlex.quote(sys.executable)} - <<'EXAMPLE'\n{code}\nEXAMPLE\n"
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=60)


def _pip_installed_library(folder: Path) -> Path:
    """`pip install .` as docs/library.md tells a reader, into a folder of its own (offline: the
    venv's setuptools, no dependencies fetched; the venv has them). Built from a copy, so the
    build leaves the checkout untouched."""
    source, site = folder / "source", folder / "site"
    source.mkdir()
    shutil.copy(REPO_ROOT / "pyproject.toml", source)
    shutil.copytree(REPO_ROOT / "functions", source / "functions", ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([sys.executable, "-m", "pip", "install", str(source), "--no-deps", "--no-index",
                             "--no-build-isolation", "--disable-pip-version-check", "-q",
                             "--target", str(site)],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    return site


def _token() -> str:
    """`make -s token` as a reader runs it: one line, a token make serve accepts."""
    result = subprocess.run(["make", "-s", "token"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and len(result.stdout.splitlines()) == 1, result.stderr
    return result.stdout.strip()


@pytest.mark.dynamodb_local
def test_the_examples_run_as_written_on_a_fresh_make_serve(tmp_path):
    blocks_by_name = examples()
    with make_serve() as served:
        base = f"localhost:{served.port}"
        # What the README's first block exports, as a reader's shell keeps it for the later blocks.
        token = _token()
        assert "export TOKEN=$(make -s token)" in blocks_by_name["quickstart"][1]
        with_cli = {**os.environ, "TOKEN": token, **cli_on_path(tmp_path)}
        for name, (language, script) in blocks_by_name.items():
            if language != "sh":
                continue
            script = script.replace("localhost:3000", base)
            if name.endswith(CLI_BLOCK_SUFFIX):
                run_cli_example(name, script, with_cli)
                continue
            result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                                    timeout=120, cwd=REPO_ROOT, env={**os.environ, "TOKEN": token})
            assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"
            got = [int(status) for status in re.findall(r"HTTP/1\.[01] (\d{3}) ", result.stdout)]
            assert got == expected_statuses(script), f"{name}:\n{result.stdout}"

        # The library, pointed at make serve's DynamoDB Local by the line make serve printed.
        export = re.search(r"^For scripts and the library: (export .+)$", served.output, re.MULTILINE)
        assert export, served.output
        language, code = blocks_by_name["library"]
        assert language == "python"
        result = _run_python(code, export.group(1))
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == expected_prints(code), result.stdout
        # Again, saved outside the repository after `pip install .`: it imports the installed
        # library, and a second run succeeds as the first did.
        site, elsewhere = _pip_installed_library(tmp_path), tmp_path / "elsewhere"
        elsewhere.mkdir()
        where = _run_python("import functions.device_state as library\nprint(library.__file__)", "",
                            cwd=elsewhere, PYTHONPATH=str(site))
        assert where.returncode == 0, where.stderr
        assert Path(where.stdout.strip()).is_relative_to(site), where.stdout
        result = _run_python(code, export.group(1), cwd=elsewhere, PYTHONPATH=str(site))
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == expected_prints(code), result.stdout

        language, code = blocks_by_name["python-client"]
        assert language == "python"
        result = _run_python(code, "", URL=f"http://{base}/", TOKEN=token)  # as docs/api/deployed.md runs it
        assert result.returncode == 0, result.stderr
        assert [line.split(",")[0] for line in result.stdout.splitlines()] == ["(201", "(200"], result.stdout

        language, code = blocks_by_name["push-client"]  # after the quickstart made lamp-1's versions 1 and 2
        assert language == "python"
        result = _run_python(code.replace("localhost:3000", base), "", TOKEN=token)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == expected_prints(code), result.stdout


@pytest.mark.dynamodb_local
def test_the_device_walkthrough_runs_as_written_on_a_fresh_make_serve_tls():
    """docs/devices.md, block after block as a reader runs them in one shell: the sh blocks'
    statuses, the Python blocks' prints (run from the repository, as it says)."""
    with make_serve(TLS="1") as served:
        base = f"localhost:{served.port}"
        environment = {"TOKEN": _token()}
        for name, (language, code) in examples(walkthrough=True).items():
            code = code.replace("localhost:3000", base)
            if language == "sh":
                # what a reader's shell keeps from one block to the next: the variables exported
                exported = "|".join(re.findall(r"^export (\w+)=", code, re.MULTILINE)) or "-"
                script = code + f"\necho\nexport -p | grep -E ' ({exported})=' || true"
                result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                                        timeout=120, cwd=REPO_ROOT, env={**os.environ, **environment})
                assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"
                got = [int(status) for status in re.findall(r"HTTP/1\.[01] (\d{3}) ", result.stdout)]
                assert got == expected_statuses(code), f"{name}:\n{result.stdout}"
                environment.update(re.findall(r'^declare -x (\w+)="([^"]*)"$', result.stdout, re.MULTILINE))
            else:
                result = _run_python(code, "", **environment)
                assert result.returncode == 0, f"{name}:\n{result.stderr}"
                assert result.stdout.splitlines() == expected_prints(code), f"{name}:\n{result.stdout}"
