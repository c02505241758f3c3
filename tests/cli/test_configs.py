"""Every ``configs/*.yaml`` runs end to end through the CLI, on tiny inputs.

The configs are discovered by glob (``configs/*.yaml`` and any ``plugins/*/configs/*.yaml``),
so a new config is tested without touching this file.  The shrinking overrides are
derived from each config's own content: a few systems (built-in sets) or frames (files),
a few steps per stage, and every output path (sinks' ``store``, callbacks' ``path``)
moved into ``tmp_path``.  A config whose model comes from a plugin of ``plugins/`` is
listed in ``NEEDS_PLUGIN`` and skipped, with the install command as reason, only when
that plugin is not installed (``make test`` installs them).
"""

from __future__ import annotations

import inspect
import json
import re
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from alchemi_lit.cli import main
from alchemi_lit.core import registry
from alchemi_lit.sinks import read_results

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(ROOT.glob("configs/*.yaml")) + sorted(ROOT.glob("plugins/*/configs/*.yaml"))
TINY_BUILTIN = {
    "argon": {"n_systems": 2, "repeat": 2},
    "mixed_argon": {"n_systems": 4, "min_atoms": 8, "max_atoms": 40},
}
TINY_FRAMES = ":3"
TINY_STEPS = {"steps": 6, "max_steps": 25}
#: configs whose model is slow on a CPU: fewer frames and steps (an MLIP forward costs
#: ~0.3 s here where a built-in potential costs milliseconds)
TINY_SLOW = {
    name: {"frames": ":2", "steps": {"steps": 3, "max_steps": 5}}
    for name in ("sevennet_relax", "chgnet_relax")
}
#: config -> (distribution of the plugin it needs, how to install it)
NEEDS_PLUGIN = {
    "sevennet_relax": ("alchemi-lit-sevenn", "pip install -e plugins/alchemi_lit_sevenn"),
    "chgnet_relax": ("alchemi-lit-chgnet", "pip install -e plugins/alchemi_lit_chgnet"),
    "torchsim_relax": ("alchemi-lit-torchsim", "scripts/install_extra_models.sh"),
}


def _params(class_path: str) -> set[str]:
    entry = registry.find(class_path) if "." not in class_path else None
    if entry is not None:
        cls = entry.cls
    else:
        import importlib

        module, _, name = class_path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
    return set(inspect.signature(cls.__init__).parameters)


def _component(item: Any) -> dict[str, Any]:
    return {"class_path": item} if isinstance(item, str) else item


def shrink(
    config: dict[str, Any], tmp_path: Path, name: str = ""
) -> tuple[list[str], int, list[Path], list[Path]]:
    """(overrides, expected systems, result stores, trajectory stores) for a tiny run of
    the config called ``name``."""
    tiny_steps = TINY_SLOW.get(name, {}).get("steps", TINY_STEPS)
    tiny_frames = TINY_SLOW.get(name, {}).get("frames", TINY_FRAMES)
    args: list[str] = []
    sim = config["simulator"]
    stages = sim["stages"] if isinstance(sim["stages"], list) else [sim["stages"]]
    for i, stage in enumerate(stages):
        # a list of lists is a pipeline: one inner list (fused plan) per rank
        inner = (
            [(f"{i}.{j}", s) for j, s in enumerate(stage)]
            if isinstance(stage, list)
            else [(str(i), stage)]
        )
        for key, item in inner:
            params = _params(_component(item)["class_path"])
            for param, value in tiny_steps.items():
                if param in params:
                    args += [f"--simulator.stages.{key}.init_args.{param}", str(value)]
    if sim.get("strategy") in ("pipeline", "replicas"):
        # in-process under pytest: fork the ranks (popen would re-run pytest's command)
        args += ["--simulator.start_method", "fork", "--simulator.timeout", "120"]
    stores, trajectories = [], []
    for i, sink in enumerate(sim.get("sinks") or []):
        if "store" in (_component(sink).get("init_args") or {}):
            stores.append(tmp_path / f"sink{i}.zarr")
            args += [f"--simulator.sinks.{i}.init_args.store", str(stores[-1])]
    for i, cb in enumerate(sim.get("callbacks") or []):
        cb = _component(cb)
        if "path" in (cb.get("init_args") or {}):
            trajectories.append(tmp_path / f"callback{i}.zarr")
            args += [f"--simulator.callbacks.{i}.init_args.path", str(trajectories[-1])]
    data = config["data"]
    if data["structures"].startswith("builtin:"):
        tiny = TINY_BUILTIN[data["structures"].split(":", 1)[1]]
        for name, value in tiny.items():
            args += [f"--data.builtin_args.{name}", str(value)]
        expected = tiny["n_systems"]
    else:
        args += ["--data.index", tiny_frames]
        start, _, stop = tiny_frames.partition(":")
        expected = int(stop) - int(start or 0)
    args += ["--output.dir", str(tmp_path / "output")]
    return args, expected, stores, trajectories


def test_configs_exist() -> None:
    names = {p.stem for p in CONFIGS}
    assert {"quickstart", "relax", "nvt", "relax_heat_cool", "screening"} <= names
    assert "sevennet_relax" in names  # the real-MLIP example (needs the SevenNet plugin)
    assert set(NEEDS_PLUGIN) <= names and set(TINY_SLOW) <= names  # no stale entries


def _plugin_installed(dist: str) -> bool:
    try:
        metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_runs(
    config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if config.stem in NEEDS_PLUGIN and not _plugin_installed(NEEDS_PLUGIN[config.stem][0]):
        dist, install = NEEDS_PLUGIN[config.stem]
        pytest.skip(f"{config.name} needs the {dist} plugin, which is not installed ({install})")
    monkeypatch.chdir(tmp_path)  # anything written relative to the cwd stays in tmp_path
    conf = yaml.safe_load(config.read_text())
    args, expected, stores, trajectories = shrink(conf, tmp_path, config.stem)
    assert main(["run", "--config", str(config), *args]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "systems" in out and "atom-steps/s" in out

    summary = json.loads((tmp_path / "output" / f"{stores[0].stem}.summary.json").read_text())
    assert summary["systems"] == expected
    assert summary["quarantined"] == 0
    saved = tmp_path / "output" / f"{stores[0].stem}.config.yaml"
    assert main(["validate", "--config", str(saved)]) == 0, capsys.readouterr().err  # re-runnable
    for store in stores:
        results = read_results(store)
        assert len(results.system_id) == expected
        assert np.isfinite(results.energy.numpy()).all()
    for traj in trajectories:
        assert traj.exists()

    # and the report of what it wrote; plots (slow) only where there is a trajectory to
    # plot (test_cli plots a results store)
    report = ["report", str(stores[0])]
    if trajectories and _has_matplotlib():
        report += ["--plots", str(tmp_path / "plots"), "--trajectory", str(trajectories[0])]
    assert main(report) == 0, capsys.readouterr().err
    # optimizing plans report how many converged, MD-only ones how many completed
    assert re.search(r"(converged|completed)\W+\d+ / \d+", capsys.readouterr().out)
    if "--plots" in report:
        assert (tmp_path / "plots" / "trajectory.png").exists()


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
