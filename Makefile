# Two entry points for users: `make demo` and `make test`. Both install into .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-shuffled lint docs bench clean

# aligner's bytecode is compiled here, as pip does for a wheel: a sandbox with PYTHONDONTWRITEBYTECODE set would
# otherwise compile every module from source on every `align` run (~40 ms of its start)
install: $(STAMP)
	$(PY) -m compileall -q aligner

$(STAMP): pyproject.toml setup.py aligner/metrics/_kernel.c aligner/metrics/xxhash.h requirements-zoo.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "torch==2.13.0" -e ".[dev]"
	$(PY) -c "import torch, mindspore, numpy, safetensors, click; assert numpy.__version__ < '2'"
	scripts/install_zoo.sh $(VENV)
	touch $(STAMP)

demo: install
	$(PY) scripts/demo.py

# Lint and types first, then the suite in file order; `make test-shuffled` runs the suite in a random order
# (pytest-randomly prints the seed to repeat it with -p randomly -p "randomly_seed=N").
test: install lint docs
	$(PY) -m pytest -n 2 -q -p no:randomly tests

test-shuffled: install
	$(PY) -m pytest -n 2 -q -p randomly tests

lint: install
	$(PY) -m ruff check aligner tests scripts
	$(PY) -m mypy

# The docs site (mkdocs + material, API page from the docstrings) into site/; --strict fails on any warning: a broken
# link or anchor, a page missing from the nav, a docstring the API page cannot render. No network needed.
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

bench: install
	$(PY) scripts/bench_convert.py
	$(PY) scripts/bench_compare.py
	$(PY) scripts/bench_cluster.py
	$(PY) scripts/bench_dump.py --model resnet18 --batch 8 --threads 2 --steps 12 --quick
	$(PY) scripts/bench_watch.py --model resnet18 --batch 8 --threads 2 --sync
	$(PY) scripts/bench_memory.py

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache aligner/metrics/_kernel*.so
