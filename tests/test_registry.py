"""Plugin discovery through entry points, with a real (tiny) installed package.

``tests/plugin_pkg`` is a separate distribution, ``alchemi-lit-toy``, declaring an
``alchemi_lit.plugins`` entry point that registers the integrator ``ToyDamped`` and
the model ``ToyHarmonic``.  conftest pip-installs this checkout's copy into a temporary
site for the session (removed afterwards), so the test exercises the same path a
user's plugin takes.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import types
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from alchemi_lit.cli import main
from alchemi_lit.core import registry
from alchemi_lit.core.registry import Entry, PluginConflictError
from alchemi_lit.integrators import Integrator
from conftest import add_entry_point

PLUGIN_DIR = Path(__file__).resolve().parent / "plugin_pkg"
DIST = "alchemi-lit-toy"


def _installed() -> bool:
    try:
        dist = metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        return False
    return any(ep.group == registry.ENTRY_POINT_GROUP for ep in dist.entry_points)


@pytest.fixture(scope="session")
def toy_plugin(toy_plugin_site: Path) -> Iterator[types.ModuleType]:
    """This checkout's ``alchemi-lit-toy``, installed by conftest into a temporary site."""
    assert _installed(), f"{DIST} is not visible to importlib.metadata"
    importlib.invalidate_caches()
    module = importlib.import_module("alchemi_lit_toy")
    registry.reset_for_tests()
    yield module
    registry.reset_for_tests()


def test_entry_point_registers_with_package_name(toy_plugin: types.ModuleType) -> None:
    entry = registry.get("integrator", "ToyDamped")
    assert entry.cls is toy_plugin.ToyDamped
    assert entry.source == DIST
    model = registry.get("model", "toyharmonic")  # names are case-insensitive
    assert model.cls is toy_plugin.ToyHarmonic and model.source == DIST
    assert registry.get("integrator", "FIRE").source == registry.BUILTIN_SOURCE


def test_plugin_usable_by_short_name_in_config(
    toy_plugin: types.ModuleType, tmp_path: Path
) -> None:
    store = tmp_path / "toy.zarr"
    config = {
        "simulator": {
            "model": {"class_path": "ToyHarmonic", "init_args": {"k": 0.5}},
            "stages": [{"class_path": "ToyDamped", "init_args": {"step": 0.2, "max_steps": 15}}],
            "sinks": [{"class_path": "ZarrSink", "init_args": {"store": str(store)}}],
        },
        "data": {"structures": "builtin:argon", "builtin_args": {"n_systems": 2, "repeat": 2}},
    }
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["validate", "--config", str(path)]) == 0
    assert main(["run", "--config", str(path)]) == 0
    summary = json.loads((tmp_path / "toy.summary.json").read_text())
    assert summary["systems"] == 2
    assert [s["name"] for s in summary["stages"]] == ["0:ToyDamped"]
    resolved = yaml.safe_load((tmp_path / "toy.config.yaml").read_text())
    assert resolved["simulator"]["stages"][0]["class_path"].startswith("alchemi_lit_toy")
    assert resolved["simulator"]["model"]["init_args"] == {"k": 0.5, "r0": 3.8, "cutoff": 5.0}


def test_two_packages_claiming_one_name(toy_plugin: types.ModuleType) -> None:
    class Impostor(Integrator):
        """Another package's ToyDamped."""

    registry._loading_source.name = "fake-package"
    try:
        with pytest.raises(PluginConflictError) as info:
            registry.register("integrator", "ToyDamped")(Impostor)
    finally:
        registry._loading_source.name = None
    message = str(info.value)
    assert DIST in message and "fake-package" in message and "ToyDamped" in message
    with pytest.raises(PluginConflictError, match=rf"{DIST}.*fake-model-package"):
        registry.REGISTRIES["model"].add(
            Entry("ToyHarmonic", "model", Impostor, "fake-model-package")
        )
    # the first registration stands
    assert registry.get("integrator", "ToyDamped").cls is toy_plugin.ToyDamped


def test_conflicting_entry_point_fails_loading(
    toy_plugin: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A second installed package whose entry point claims ``ToyDamped``: loading the
    plugins fails with an error naming both packages, and the CLI reports it in one line."""

    class Impostor(Integrator):
        """Another package's ToyDamped."""

    fake = types.ModuleType("fake_conflicting_plugin")
    fake.register_plugins = lambda: registry.register("integrator", "ToyDamped")(Impostor)
    monkeypatch.setitem(sys.modules, "fake_conflicting_plugin", fake)
    add_entry_point(monkeypatch, "fake", "fake_conflicting_plugin:register_plugins")
    registry.reset_for_tests()
    try:
        with pytest.raises(PluginConflictError, match=rf"{DIST}.*fake_conflicting_plugin"):
            registry.all_entries()
        registry.reset_for_tests()
        assert main(["plugins"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert DIST in err and "fake_conflicting_plugin" in err
    finally:
        monkeypatch.undo()
        registry.reset_for_tests()
    assert registry.get("integrator", "ToyDamped").cls is toy_plugin.ToyDamped


def test_plugins_command_shows_the_package(
    toy_plugin: types.ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    rows = [[c.strip() for c in re.split(r"[│┃]", line)[1:-1]] for line in out.splitlines()]
    by_name = {r[1]: r for r in rows if len(r) == 5}
    assert by_name["ToyDamped"][0] == "integrator" and by_name["ToyDamped"][2] == DIST
    assert by_name["ToyHarmonic"][0] == "model" and by_name["ToyHarmonic"][2] == DIST
    assert by_name["FIRE"][2] == "alchemi_lit"
