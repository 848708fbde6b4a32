# The two commands of the README:
#   make demo   -- set up everything, then run the main job on an embedded default
#                  (FILES=1000000 for a bigger folder; it all lands in ./demo, ~60 MB)
#   make test   -- set up everything, then run ruff and the whole test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint venv bench-venv clean

$(STAMP): pyproject.toml setup.py ci/dev-constraints.txt $(wildcard src/manyfiles/*.c src/manyfiles/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	MANYFILES_REQUIRE_C_EXTENSION=1 $(PY) -m pip install -q -c ci/dev-constraints.txt -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m manyfiles.demo $(if $(FILES),--files $(FILES))

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks notebooks
	$(VENV)/bin/ruff format --check src tests benchmarks

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks notebooks
	MANYFILES_REQUIRE_C_EXTENSION=1 $(PY) -m pytest -q

# Benchmark peers (awscli pins botocore exactly, so it lives in its own venv; boto3's CRT and
# obstore in a third, since the aws cli's botocore is older than boto3[crt] wants).
bench-venv:
	test -x .venv-bench/bin/python || $(PYTHON) -m venv .venv-bench
	.venv-bench/bin/pip install -q -r benchmarks/requirements.txt
	test -x .venv-peers/bin/python || $(PYTHON) -m venv .venv-peers
	.venv-peers/bin/pip install -q -r benchmarks/requirements-peers.txt

clean:
	rm -rf $(VENV) build src/*.egg-info src/manyfiles/*.so src/manyfiles/_dents_not_built.txt demo
