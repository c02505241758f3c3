# The two set-up commands of README.md: `make run` and `make test`.
PY ?= python3
.PHONY: install install-test run test lint bench

.install.stamp: pyproject.toml scripts/install.sh plugins/alchemi_lit_sevenn/pyproject.toml
	PYTHON=$(PY) ./scripts/install.sh
	touch .install.stamp

# The test-suite also needs the MACE, CHGNet and TorchSim plugins (see the scripts).
.install-test.stamp: .install.stamp scripts/install_mace.sh plugins/alchemi_lit_mace/pyproject.toml \
		scripts/install_extra_models.sh plugins/alchemi_lit_chgnet/pyproject.toml \
		plugins/alchemi_lit_torchsim/pyproject.toml
	PYTHON=$(PY) ./scripts/install_mace.sh
	PYTHON=$(PY) ./scripts/install_extra_models.sh
	touch .install-test.stamp

install: .install.stamp
install-test: .install-test.stamp

run: install  ## the main job: relax + heat built-in argon crystals, write results.zarr
	alchemi-lit run --config configs/quickstart.yaml

# One torch thread per test process: multi-rank tests run several processes on few
# cores, and oversubscribed torch threads slow everything down by an order of magnitude.
test: install-test  ## lint, then the whole test-suite (CPU, < 10 min on 2 cores)
	$(PY) -m ruff check .
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider

bench: install
	$(PY) bench/run_all.py
