# The two set-up commands of README.md: `make run` and `make test`.
PY ?= python3
.PHONY: install install-test run test test-slow test-all lint bench docs

.install.stamp: pyproject.toml scripts/install.sh scripts/pip_install.sh scripts/requirements_met.py \
		plugins/alchemi_lit_sevenn/pyproject.toml
	PYTHON=$(PY) ./scripts/install.sh
	touch .install.stamp

# The test-suite also needs the MACE, CHGNet and TorchSim plugins (see the scripts).
.install-test.stamp: .install.stamp scripts/install_mace.sh plugins/alchemi_lit_mace/pyproject.toml \
		scripts/install_extra_models.sh plugins/alchemi_lit_chgnet/pyproject.toml \
		plugins/alchemi_lit_torchsim/pyproject.toml .install-docs.stamp
	PYTHON=$(PY) ./scripts/install_mace.sh
	PYTHON=$(PY) ./scripts/install_extra_models.sh
	touch .install-test.stamp

# The docs tools (the `docs` extra): `make docs` needs only these; the tests build the site.
.install-docs.stamp: .install.stamp pyproject.toml scripts/install_docs.sh
	PYTHON=$(PY) ./scripts/install_docs.sh
	touch .install-docs.stamp

install: .install.stamp
install-test: .install-test.stamp

run: install  ## the main job: relax + heat built-in argon crystals, write results.zarr
	alchemi-lit run --config configs/quickstart.yaml

# One torch thread per test process: multi-rank tests run several processes on few
# cores, and oversubscribed torch threads slow everything down by an order of magnitude.
# Two pytest workers (pytest-xdist) share the machine's cores.  Tests marked `slow`
# (real processes killed and resumed, launchers, soak and ensemble statistics) run in
# `make test-slow`; each behaviour they check also has a fast test in `make test`.
PYTEST = OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider
# The site builds with warnings as errors in `make test` too: tests/docs/test_docs.py
# builds it into a temporary folder, and tests/docs/test_code_blocks.py runs every code
# block of README.md and docs/.
docs: .install-docs.stamp  ## build the documentation site into site/ (warnings are errors)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d site

test: install-test  ## lint, then the test-suite without the slow tests (CPU, about 5 min of tests on 2 cores)
	$(PY) -m ruff check --no-cache .
	$(PYTEST) -n 2 -m "not slow"

test-slow: install-test  ## the slow tests only (10-15 min on 2 cores)
	$(PYTEST) -n 2 -m slow

test-all: install-test  ## lint, then every test
	$(PY) -m ruff check --no-cache .
	$(PYTEST) -n 2

bench: install
	$(PY) bench/run_all.py
