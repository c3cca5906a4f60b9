# Both public targets bootstrap .venv themselves: a fresh machine needs only Python 3.11+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint fmt golden bench clean dist

# The editable install runs hatch_build.py, which generates the git-ignored modules (the OIP
# gRPC code, the private Envoy API copy): a changed .proto or build_support/ reinstalls.
$(STAMP): pyproject.toml hatch_build.py $(wildcard build_support/*.py inferway/backends/protocol/*.proto)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# the code distribution is inferway-core now; drop a venv's editable install of old `inferway`
	@$(BIN)/python -m pip uninstall --quiet --yes inferway 2>/dev/null || true
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/inferway demo $(DEMO_ARGS)

# The Debian packages of the real components (Prometheus, Redis, SoftHSM, etcd: scripts/test-deps.txt)
# are installed first when this runs as root with apt-get; otherwise the script says what is
# missing and why, and those tests skip saying so (under CI=true both are failures instead).
# The run ends with the skips, counted by reason. The test LLM engine (llama-cpp-python, the
# llm-engine extra) is compiled once per machine and cached outside the clone, then installed
# into .venv (scripts/build_llm_engine.py; INFERWAY_LLM_ENGINE=skip skips it outside CI).
test: $(STAMP)
	@scripts/install_test_deps.sh
	@$(BIN)/python scripts/build_llm_engine.py
	$(BIN)/ruff check inferway tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# For the edit-test loop, under a minute: tests/unit and tests/golden (markers unit, golden) less
# their few tests that start a real Envoy (also marked integration) or take minutes of CPU (slow);
# no lint.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m '(unit or golden) and not integration and not slow' \
		tests/unit tests/golden $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check inferway tests bench
	$(BIN)/mypy
	$(BIN)/ruff format --check inferway tests bench docs README.md

fmt: $(STAMP)
	$(BIN)/ruff check --fix inferway tests bench
	$(BIN)/ruff format inferway tests bench docs README.md

golden: $(STAMP)
	INFERWAY_UPDATE_GOLDEN=1 $(BIN)/python -m pytest tests/golden tests/unit/test_policy_broken.py tests/unit/test_layering.py -q

# The wheels of inferway-core and its meta-distributions (inferway, inferway-gateway,
# inferway-backend, inferway-gpu) into dist/, a --find-links folder (docs/install.md).
dist: $(STAMP)
	$(BIN)/python -m build_support.dists dist

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
