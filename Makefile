# The two set-up commands of README.md: `make run` and `make test`.
PY ?= python3
.PHONY: install run test lint bench

.install.stamp: pyproject.toml scripts/install.sh plugins/alchemi_lit_sevenn/pyproject.toml
	PYTHON=$(PY) ./scripts/install.sh
	touch .install.stamp

install: .install.stamp

run: install  ## the main job: relax + heat built-in argon crystals, write results.zarr
	alchemi-lit run --config configs/quickstart.yaml

# One torch thread per test process: multi-rank tests run several processes on few
# cores, and oversubscribed torch threads slow everything down by an order of magnitude.
test: install  ## lint, then the whole test-suite (CPU, < 10 min on 2 cores)
	$(PY) -m ruff check .
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider

bench: install
	$(PY) bench/run_all.py
