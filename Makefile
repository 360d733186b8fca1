# The two commands that matter: `make serve` and `make test`. Both set up what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PY_STAMP := $(VENV)/.installed
NPM_STAMP := node_modules/.installed
PORT ?= 3000

.PHONY: setup java test test-fast serve invoke synth deploy bench clean

# The CDK CLI runs app.py with the venv's python3; no telemetry, no notices (no network).
CDK := PATH=$(CURDIR)/$(VENV)/bin:$$PATH CDK_DISABLE_CLI_TELEMETRY=1 JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 \
	node_modules/.bin/cdk
CDK_OUT ?= cdk.out

setup: $(PY_STAMP) $(NPM_STAMP) java

$(PY_STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

# DynamoDB Local's jar (amplify-dynamodb-simulator) and the CDK CLI, pinned in package-lock.json.
$(NPM_STAMP): package.json package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	touch $@

# DynamoDB Local runs on Java; install a JRE where it is missing and we may (root, Debian).
java:
	@command -v java >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless; \
	  else \
	    echo "DynamoDB Local needs Java 17+: install it (e.g. apt-get install openjdk-17-jre-headless)"; exit 1; \
	  fi; }

test: setup
	$(PY) -m pytest

# The quick tier: no DynamoDB Local, no threads.
test-fast: setup
	$(PY) -m pytest -m "not dynamodb_local and not concurrency"

# The API on http://127.0.0.1:$(PORT), on a DynamoDB Local it starts and stops itself.
# DYNAMODB_ENDPOINT=http://... uses another endpoint; DYNAMODB_DATA_DIR=dir keeps data on disk.
serve: setup
	PORT=$(PORT) $(PY) -m localdev.server

# Replay one API Gateway event through the handler: make invoke EVENT=events/patch-device.json
invoke: $(PY_STAMP)
	@test -n "$(EVENT)" || { echo "usage: make invoke EVENT=events/<name>.json"; exit 2; }
	$(PY) -m localdev.invoke $(EVENT)

# Contention and cold-start benchmark on DynamoDB Local: bench/results/latest.{json,md,png}.
bench: setup
	$(PY) bench/contention.py $(BENCH_ARGS)

# Synthesize offline (no AWS account needed) and lint the template.
synth: setup
	$(CDK) synth --no-notices --quiet --output $(CDK_OUT)
	$(VENV)/bin/cfn-lint --config-file .cfnlintrc.yaml -- $(CDK_OUT)/DeviceStateStack.template.json

# Needs AWS credentials and a bootstrapped account (see README); never run by CI.
deploy: synth
	$(CDK) deploy --no-notices --app $(CDK_OUT) $(DEPLOY_ARGS)

clean:
	rm -rf $(VENV) node_modules cdk.out .pytest_cache
