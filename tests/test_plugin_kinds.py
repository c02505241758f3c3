"""Strategies, criteria and samplers as registered plugins; a broken plugin package;
the CLI's per-plugin help, saved configs that re-run anywhere, unwritable outputs.

Inputs are tiny (2 argon crystals of 32 atoms, a few dozen steps).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from ase.io import write

from alchemi_lit import Simulator
from alchemi_lit.cli import main
from alchemi_lit.core import registry
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.core.registry import Entry, PluginLoadError
from alchemi_lit.data import argon_crystals
from alchemi_lit.integrators import FIRE
from alchemi_lit.integrators.convergence import All, EnergyChange, ForceMax
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import read_results
from alchemi_lit.strategies import SingleDeviceStrategy, Strategy
from conftest import add_entry_point

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def lj() -> LennardJones:
    return LennardJones(epsilon=0.0104, sigma=3.40, cutoff=8.5)


def crystals() -> list:
    return argon_crystals(n_systems=2, repeat=2)


def relax_config(store: Path, **data: Any) -> dict[str, Any]:
    """A FIRE relax of 2 x 32 argon atoms as a config dict."""
    return {
        "simulator": {
            "model": {"class_path": "lj-argon"},
            "stages": [{"class_path": "FIRE", "init_args": {"fmax": 0.05, "max_steps": 60}}],
            "sinks": [{"class_path": "ZarrSink", "init_args": {"store": str(store), "mode": "w"}}],
        },
        "data": {
            "structures": "builtin:argon",
            "builtin_args": {"n_systems": 2, "repeat": 2},
            **data,
        },
    }


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------------- strategies
def test_strategy_names_are_a_closed_set(capsys: pytest.CaptureFixture[str]) -> None:
    assert registry.get("strategy", "single").cls is SingleDeviceStrategy
    assert {"single", "pipeline", "replicas"} <= set(registry.REGISTRIES["strategy"].names())
    with pytest.raises(ConfigError, match=r"unknown strategy 'pipline'.*Did you mean pipeline"):
        Simulator(model=lj(), stages=FIRE(), strategy="pipline")
    with pytest.raises(ConfigError, match=r"strategy must be a registered strategy name"):
        Simulator(model=lj(), stages=FIRE(), strategy=3)  # type: ignore[arg-type]
    argv = ["validate", "--config", str(QUICKSTART), "--simulator.strategy", "singel"]
    assert main(argv) == 2
    line = one_error(capsys)
    assert line.startswith("error: simulator.strategy:") and "Did you mean single" in line


class CountingStrategy(SingleDeviceStrategy):
    """A third-party strategy: the single-device loop, counting its runs."""

    runs = 0

    def run(self, sim: Simulator, data: Any, resume: str | None = None) -> Any:
        type(self).runs += 1
        return super().run(sim, data, resume)


def test_third_party_strategy_by_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A registered Strategy subclass is usable by name from Python and from a config,
    and gives the built-in single-device results; a registered non-Strategy is refused."""
    registry.all_entries()  # load the plugins first: the test entries go on top
    entries = registry.REGISTRIES["strategy"]._entries
    monkeypatch.setitem(
        entries, "counting", Entry("counting", "strategy", CountingStrategy, "test-package")
    )
    monkeypatch.setattr(CountingStrategy, "runs", 0)
    stage = FIRE(fmax=0.05, max_steps=60)
    sim = Simulator(model=lj(), stages=stage, strategy="counting", accelerator="cpu")
    assert sim.strategy_name == "counting" and isinstance(sim.strategy, Strategy)
    got = sim.run(crystals())
    want = Simulator(model=lj(), stages=FIRE(fmax=0.05, max_steps=60), accelerator="cpu").run(
        crystals()
    )
    assert CountingStrategy.runs == 1
    torch.testing.assert_close(got.energy, want.energy, rtol=0, atol=0)

    store = tmp_path / "c.zarr"
    config = relax_config(store)
    config["simulator"]["strategy"] = "counting"
    assert main(["run", "--config", str(write_config(tmp_path / "c.yaml", config))]) == 0
    assert CountingStrategy.runs == 2
    np.testing.assert_array_equal(read_results(store).energy.numpy(), want.energy.numpy())

    monkeypatch.setitem(entries, "bogus", Entry("bogus", "strategy", dict, "bad-package"))
    with pytest.raises(ConfigError, match=r"'bogus'.*bad-package.*not a subclass"):
        Simulator(model=lj(), stages=FIRE(), strategy="bogus")

    class Incomplete(Strategy):
        """A strategy that forgot run()."""

    monkeypatch.setitem(entries, "incomplete", Entry("incomplete", "strategy", Incomplete, "pkg"))
    with pytest.raises(ConfigError, match=r"'incomplete'.*does not implement run"):
        Simulator(model=lj(), stages=FIRE(), strategy="incomplete")


# ---------------------------------------------------------------------- broken plugins
@pytest.fixture
def broken_plugin(monkeypatch: pytest.MonkeyPatch) -> Any:
    """An installed entry point whose module does not import."""
    add_entry_point(monkeypatch, "broken", "no_such_plugin_module_xyz:register")
    registry.reset_for_tests()
    yield
    monkeypatch.undo()
    registry.reset_for_tests()


@pytest.mark.usefixtures("broken_plugin")
def test_broken_plugin_does_not_disable_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert registry.get("integrator", "FIRE").cls is FIRE  # built-ins still load
    [failure] = registry.failures()
    assert failure.entry_point == "broken" and "ModuleNotFoundError" in failure.error
    # a name that might have been the broken package's: the error leads with the failure
    with pytest.raises(PluginLoadError, match=r"'broken'.*no_such_plugin_module_xyz"):
        registry.get("integrator", "MyIntegrator")
    assert main(["plugins"]) == 0
    captured = capsys.readouterr()
    assert "FAILED" in captured.out and "broken" in captured.out and "FIRE" in captured.out
    assert "warning:" in captured.err and "no_such_plugin_module_xyz" in captured.err
    # a config of built-ins still validates and runs
    path = write_config(tmp_path / "r.yaml", relax_config(tmp_path / "r.zarr"))
    assert main(["run", "--config", str(path)]) == 0
    config = relax_config(tmp_path / "x.zarr")
    config["simulator"]["stages"][0]["class_path"] = "MyIntegrator"
    assert main(["validate", "--config", str(write_config(tmp_path / "x.yaml", config))]) == 2
    line = one_error(capsys)
    assert line.startswith("error: simulator.stages.0.class_path:") and "failed to load" in line


# ---------------------------------------------------------------------- criteria
def test_criteria_by_registered_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``criterion: {class_path: All, init_args: {parts: [ForceMax, EnergyChange]}}``
    in a config builds the same criterion as ``ForceMax(..) & EnergyChange(..)``."""
    store = tmp_path / "k.zarr"
    config = relax_config(store)
    config["simulator"]["stages"][0]["init_args"]["criterion"] = {
        "class_path": "All",
        "init_args": {
            "parts": [
                {"class_path": "ForceMax", "init_args": {"fmax": 0.02}},
                {"class_path": "EnergyChange", "init_args": {"tol": 1e-6}},
            ]
        },
    }
    assert main(["run", "--config", str(write_config(tmp_path / "k.yaml", config))]) == 0
    stage = FIRE(fmax=0.05, max_steps=60, criterion=ForceMax(0.02) & EnergyChange(1e-6))
    want = Simulator(model=lj(), stages=stage, accelerator="cpu").run(crystals())
    got = read_results(store)
    np.testing.assert_array_equal(got.energy.numpy(), want.energy.numpy())
    np.testing.assert_array_equal(got.steps.numpy(), want.steps.numpy())

    config["simulator"]["stages"][0]["init_args"]["criterion"] = {"class_path": "ForceMx"}
    assert main(["validate", "--config", str(write_config(tmp_path / "k.yaml", config))]) == 2
    line = one_error(capsys)
    assert "criterion" in line and "Did you mean ForceMax" in line
    with pytest.raises(ValueError, match="needs at least one criterion"):
        All(parts=[])


# ---------------------------------------------------------------------- samplers
def test_sampler_by_class_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``data.sampler`` as a registered class runs like the budgets shorthand; the CLI
    passes the structures itself, so ``dataset`` in init_args is an error."""
    energies = []
    for name, sampler in [
        ("short", {"max_atoms": 40}),
        ("named", {"class_path": "SizeAwareSampler", "init_args": {"max_atoms": 40}}),
    ]:
        store = tmp_path / f"{name}.zarr"
        path = write_config(tmp_path / f"{name}.yaml", relax_config(store, sampler=sampler))
        assert main(["run", "--config", str(path)]) == 0
        energies.append(read_results(store).energy.numpy())
    np.testing.assert_array_equal(*energies)
    bad = {"class_path": "SizeAwareSampler", "init_args": {"max_atoms": 40, "dataset": []}}
    path = write_config(tmp_path / "bad.yaml", relax_config(tmp_path / "b.zarr", sampler=bad))
    assert main(["validate", "--config", str(path)]) == 2
    assert one_error(capsys).startswith("error: data.sampler.init_args.dataset:")


# ---------------------------------------------------------------------- CLI help / outputs
def test_preset_help_shows_the_bound_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--simulator.stages.help", "fire-ase"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "preset of alchemi_lit.integrators.fire.FIRE binding mode='ase'" in out
    assert "default: ase" in out  # the bound value, not FIRE's own default
    assert main(["run", "--simulator.stages.0.init_args.criterion.help"]) == 0
    out = capsys.readouterr().out
    assert "ForceMax" in out and "EnergyChange" in out and "FIRE" not in out


def test_saved_config_reruns_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A structure file given relative to the config is saved as an absolute path, so
    the resolved config re-runs from anywhere to the same results."""
    project = tmp_path / "project"
    project.mkdir()
    write(project / "ar.extxyz", crystals())
    config = relax_config(Path("out/r.zarr"))
    config["data"] = {"structures": "ar.extxyz"}
    monkeypatch.chdir(project)
    assert main(["run", "--config", str(write_config(project / "r.yaml", config))]) == 0
    saved = project / "out" / "r.config.yaml"
    resolved = yaml.safe_load(saved.read_text())
    assert resolved["data"]["structures"] == str(project / "ar.extxyz")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    rerun = dict(resolved)
    rerun["simulator"]["sinks"][0]["init_args"]["store"] = str(elsewhere / "again.zarr")
    assert main(["run", "--config", str(write_config(elsewhere / "again.yaml", rerun))]) == 0
    np.testing.assert_array_equal(
        read_results(elsewhere / "again.zarr").energy.numpy(),
        read_results(project / "out" / "r.zarr").energy.numpy(),
    )
    summary = json.loads((elsewhere / "again.summary.json").read_text())
    assert [s["name"] for s in summary["stages"]] == ["0:FIRE"]


def test_unwritable_store_names_its_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    for store, text in [
        (blocker / "r.zarr", "is a file"),
        (blocker, "exists and is a file, not a directory"),
    ]:
        path = write_config(tmp_path / "w.yaml", relax_config(store))
        assert main(["validate", "--config", str(path)]) == 2
        line = one_error(capsys)
        assert line.startswith("error: simulator.sinks.0.init_args.store:") and text in line
    config = relax_config(tmp_path / "ok.zarr")
    config["output"] = {"dir": str(blocker / "out")}
    assert main(["run", "--config", str(write_config(tmp_path / "o.yaml", config))]) == 2
    assert one_error(capsys).startswith("error: output.dir:")
    assert not (tmp_path / "ok.zarr").exists()  # refused before running


def test_plugin_kinds_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--kind", "strategy"]) == 0
    out = capsys.readouterr().out
    for name in ("single", "pipeline", "replicas", "auto"):
        assert name in out
    assert isinstance(registry.KINDS, tuple) and "criterion" in registry.KINDS
