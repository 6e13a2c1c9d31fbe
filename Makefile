# Every target works from a fresh clone: it builds .venv first when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast test-torchtitan bench lint sweep clean

install: $(STAMP)

# torch is pinned here (not in setup.cfg) so that this machine takes the local CPU
# wheel; users keep their own CUDA build through the open range in install_requires.
$(STAMP): setup.cfg pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,examples]'
	$(BIN)/python -m umsearch.search.precompile
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/umsearch search

test: $(STAMP)
	$(BIN)/pytest -q

test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow"

# torchtitan's own llama3 running a plan (pip install 'umsearch[torchtitan]'). A venv of its own, so that
# torchtitan and triton never change what `make test` runs against; `make test` skips these tests.
TT_VENV := .venv-torchtitan
$(TT_VENV)/.installed: setup.cfg pyproject.toml
	$(PY) -m venv $(TT_VENV)
	$(TT_VENV)/bin/pip install -q --upgrade pip
	$(TT_VENV)/bin/pip install -q torch==2.13.0
	$(TT_VENV)/bin/pip install -q -e '.[dev,torchtitan]'
	touch $@

test-torchtitan: $(TT_VENV)/.installed
	UMSEARCH_REQUIRE_TORCHTITAN=1 $(TT_VENV)/bin/pytest -q -p no:cacheprovider tests/runtime/test_torchtitan_pipeline.py

bench: $(STAMP)
	$(BIN)/python -m benchmarks.simulator
	$(BIN)/python -m benchmarks.search
	$(BIN)/python -m benchmarks.runtime

lint: $(STAMP)
	$(BIN)/ruff check umsearch tests benchmarks
	$(BIN)/mypy

SPACES := $(wildcard search_spaces/*.toml)
SWEEP_OUT := $(patsubst search_spaces/%.toml,results/sweep/%/plan.json,$(SPACES))

sweep: $(SWEEP_OUT)
	$(BIN)/python -m benchmarks.sweep results/sweep

results/sweep/%/plan.json: search_spaces/%.toml $(STAMP)
	$(BIN)/umsearch search $< --out results/sweep/$* --quiet

clean:
	rm -rf $(VENV) $(TT_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find umsearch -name '*.nbi' -delete -o -name '*.nbc' -delete
