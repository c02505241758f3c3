"""Settings every test of the repository shares (``tests/`` and the plugins' suites).

``tests/conftest.py`` holds the structure builders; this file holds only what must
apply to the plugins' tests as well.
"""

from __future__ import annotations

import os

import pytest
import torch

#: Tests that share costly per-process state without a fixture to show it: the first
#: build of a plugin's model pays for importing its library (e3nn's code generation
#: included), a module's cache of reference runs (``test_pipeline._FUSED``,
#: ``test_neb_workflow._RUNS``) is filled by whichever test needs it first.  Node-id
#: prefix -> pytest-xdist group.
SHARED_STATE_GROUPS = {
    "plugins/": "mlip",
    "tests/cli/test_configs.py::test_config_runs[sevennet_relax]": "mlip",
    "tests/cli/test_configs.py::test_config_runs[chgnet_relax]": "mlip",
    "tests/cli/test_configs.py::test_config_runs[torchsim_relax]": "mlip",
    "tests/strategies/test_pipeline.py::": "tests/strategies/test_pipeline.py",
    "tests/workflows/test_neb_workflow.py::": "tests/workflows/test_neb_workflow.py",
}


def pytest_configure(config: pytest.Config) -> None:
    """``-n N`` without ``--dist`` distributes as ``loadgroup``, not ``load``: like
    ``load``, test by test to whichever worker is free, except that the tests of one
    ``xdist_group`` (below) run on one worker, so what they share is set up once, not
    once per worker (a module-scoped fixture is set up in every worker that runs one of
    its tests).  ``--dist`` given explicitly is left alone."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # a worker: it names the groups as its controller chose
        config.option.loadgroup = bool(workerinput.get("loadgroup"))
        return
    given = [*config.invocation_params.args, *os.environ.get("PYTEST_ADDOPTS", "").split()]
    explicit = any(arg == "--dist" or arg.startswith("--dist=") for arg in given)
    if getattr(config.option, "dist", "no") == "load" and not explicit:
        config.option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """(pytest-xdist, in the controller) Tell each worker whether to name the groups."""
    node.workerinput["loadgroup"] = node.config.getvalue("dist") == "loadgroup"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group (``xdist_group``) the tests of a module that use one of its module-scoped
    fixtures, and those of ``SHARED_STATE_GROUPS``.  (First: pytest-xdist names the
    groups in its own hook; without ``--dist loadgroup`` the marks change nothing.)"""
    for item in items:
        group = next(
            (g for prefix, g in SHARED_STATE_GROUPS.items() if item.nodeid.startswith(prefix)),
            None,
        )
        info = getattr(item, "_fixtureinfo", None)
        if group is None and info is not None:
            scopes = {defs[-1].scope for defs in info.name2fixturedefs.values() if defs}
            if "module" in scopes:
                group = item.nodeid.split("::")[0]
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """One intra-op thread: the tests' tensors are small, where more threads only add
    overhead, and test processes (xdist workers, pipeline ranks) share few cores --
    oversubscribed threads slow them by an order of magnitude on a busy machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
