# The two commands of the README:
#   make demo   -- set up everything, then run the main job on an embedded default
#                  (FILES=1000000 for a bigger folder; it all lands in ./demo, ~60 MB)
#   make test   -- set up everything, then run ruff and the whole test suite (what CI runs: .ci/run)
# and for working on the code:
#   make test-fast -- the suite without the fresh-venv tests (tests/packaging: wheels, [all], notebooks)
#   make flake     -- the whole suite 5 times in a row, then twice in random order; stops at the
#                     first failure and prints how to rerun it (FLAKE_RUNS=, FLAKE_RANDOM= to change)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# tests in parallel, one worker per core; tests sharing an expensive session fixture (the Dask
# cluster, the fresh venvs) run on one worker (xdist groups, see tests/conftest.py)
# one pytest worker per core and one more: many tests wait on a subprocess, a timeout or a fault's
# length, and the extra worker fills that idle CPU (docs/benchmarks.md, "The test gate")
XDIST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
PYTEST := MANYFILES_REQUIRE_C_EXTENSION=1 $(PY) -m pytest -q -n $(XDIST_WORKERS) --dist loadgroup --no-loadscope-reorder
FLAKE_RUNS   ?= 5
FLAKE_RANDOM ?= 2

.PHONY: demo test test-fast flake lint venv bench-venv clean

$(STAMP): pyproject.toml setup.py ci/dev-constraints.txt $(wildcard src/manyfiles/*/*.c src/manyfiles/*/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'uv>=0.5'
	# uv installs the same constrained set as pip, in ~30 s instead of ~100-150 s (parallel downloads,
	# no byte-compiling ~150 packages up front); the packaging tests still use pip, as users do
	MANYFILES_REQUIRE_C_EXTENSION=1 $(VENV)/bin/uv pip install -q --python $(PY) -c ci/dev-constraints.txt -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m manyfiles.demo $(if $(FILES),--files $(FILES))

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks notebooks
	$(VENV)/bin/ruff format --check src tests benchmarks

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks notebooks
	$(PYTEST) --durations=15

test-fast: $(STAMP)
	$(PYTEST) --ignore=tests/packaging

flake: $(STAMP)
	@for i in $$(seq $(FLAKE_RUNS)); do \
	  echo "make flake: run $$i of $(FLAKE_RUNS), file order"; \
	  $(PYTEST) -x || { echo "make flake: run $$i (file order) failed"; exit 1; }; \
	done; \
	for i in $$(seq $(FLAKE_RANDOM)); do \
	  seed=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); \
	  echo "make flake: random order $$i of $(FLAKE_RANDOM), --randomly-seed=$$seed"; \
	  $(PYTEST) -x -p randomly --randomly-seed=$$seed || { \
	    echo "make flake: failed in random order; rerun that order with:"; \
	    echo "  $(PYTEST) -p randomly --randomly-seed=$$seed"; exit 1; }; \
	done; \
	echo "make flake: $(FLAKE_RUNS) runs in file order and $(FLAKE_RANDOM) in random order passed"

# Benchmark peers (awscli pins botocore exactly, so it lives in its own venv; boto3's CRT and
# obstore in a third, since the aws cli's botocore is older than boto3[crt] wants).
bench-venv:
	test -x .venv-bench/bin/python || $(PYTHON) -m venv .venv-bench
	.venv-bench/bin/pip install -q -r benchmarks/requirements.txt
	test -x .venv-peers/bin/python || $(PYTHON) -m venv .venv-peers
	.venv-peers/bin/pip install -q -r benchmarks/requirements-peers.txt

clean:
	rm -rf $(VENV) build src/*.egg-info src/manyfiles/*.so src/manyfiles/_dents_not_built.txt demo
