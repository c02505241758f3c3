"""One API before the first release (issue #42, part 4): no module keeps an old path
alive and no name has a second spelling for code written against an earlier layout."""

from __future__ import annotations

import importlib

import pytest

import alchemi_lit as al

#: paths that modules had before they moved into layer packages (never released)
OLD_PATHS = [
    "alchemi_lit._moved", "alchemi_lit.state", "alchemi_lit.hooks", "alchemi_lit.stages",
    "alchemi_lit.units", "alchemi_lit.results", "alchemi_lit.convergence",
    "alchemi_lit.strategies.fused", "alchemi_lit.report_plots",
]  # fmt: skip


@pytest.mark.parametrize("path", OLD_PATHS)
def test_an_old_module_path_does_not_import(path: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(path)


def test_the_packages_public_names_are_its_only_names() -> None:
    for name in ("stages", "hooks", "state"):
        with pytest.raises(AttributeError):
            getattr(al, name)
    import alchemi_lit.cli as cli

    assert not [n for n in vars(cli) if n.startswith("_") and not n.startswith("__")]
