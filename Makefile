# The two entry points of the README: `make demo` (main job) and `make test` (lint, types, tests).
# Both create .venv on first use and install the project into it; nothing else needs installing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_DIR ?= demo_out

.PHONY: demo test install lint typecheck pytest sshd clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Tune the shipped 512^3 f32 matmul for this machine's CPU: enumerate, order, compile, benchmark,
# verify, and write $(DEMO_DIR)/tuning_spec.mlir, results.jsonl and summary.md. Starts fresh each time
# (the loop itself resumes an existing output directory).
demo: $(STAMP)
	rm -rf $(DEMO_DIR)
	$(BIN)/dispatchtune tune examples/matmul_f32_512.mlir --target host --budget 30 --output-dir $(DEMO_DIR)

lint: $(STAMP)
	$(BIN)/ruff check .

# mypy needs the package under its import name; the repository root *is* `dispatchtune`.
typecheck: $(STAMP)
	mkdir -p .typecheck && ln -sfn .. .typecheck/dispatchtune
	MYPYPATH=.typecheck $(BIN)/mypy --config-file pyproject.toml -p dispatchtune

# The remote-runner tests start their own OpenSSH server on 127.0.0.1 (tests/test_remote.py).
# It is installed here only when missing and we are root; otherwise those tests skip and say why.
sshd:
	@command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server \
	      >/dev/null) || echo "could not install openssh-server: the ssh tests will skip"; \
	  else echo "no sshd and not root: the ssh tests of tests/test_remote.py will skip"; fi; }

pytest: $(STAMP) sshd
	$(BIN)/pytest

test: lint typecheck pytest

clean:
	rm -rf $(VENV) .typecheck .mypy_cache .ruff_cache .pytest_cache $(DEMO_DIR) build *.egg-info
