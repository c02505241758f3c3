"""The ``CLI`` class's hooks, as a user extends it: ``TrialCLI`` of
docs/how-to/extend-cli.md (an option read by ``before_instantiate``, a ``count``
command) and a ``build_simulator`` that builds the Simulator in Python.  Inputs are tiny:
2 argon crystals of 32 atoms."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ase.io import read

from alchemi_lit.cli import CLI, CLIError, main
from conftest import doc_block

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
COPPER = ROOT / "tests" / "bad_inputs" / "copper.extxyz"


@pytest.fixture(scope="module")
def trial_cli() -> type[CLI]:
    """The docs' ``TrialCLI``, run from the page's block itself (no copy to drift)."""
    namespace: dict[str, Any] = {"__name__": "readme_custom_cli"}
    exec(compile(doc_block("custom-cli"), "docs block custom-cli", "exec"), namespace)
    return namespace["TrialCLI"]


def tiny(store: Path) -> list[str]:
    return [
        "--config",
        str(QUICKSTART),
        "--data.builtin_args.n_systems",
        "2",
        "--data.builtin_args.repeat",
        "2",
        "--simulator.stages.1.init_args.steps",
        "10",
        "--simulator.sinks.0.init_args.store",
        str(store),
    ]


def stage_steps(summary_path: Path) -> list[int]:
    return [s["steps_max"] for s in json.loads(summary_path.read_text())["stages"]]


def error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


def test_added_option_reaches_before_instantiate_and_the_saved_config(
    trial_cli: type[CLI], tmp_path: Path
) -> None:
    """``--max_steps 3`` (added by add_arguments_to_parser) caps FIRE's 500 and
    Langevin's 10 steps in before_instantiate; the saved config holds the capped
    plan and the option.  (The first CLI run of a session pays the imports.)"""
    store = tmp_path / "q.zarr"
    assert trial_cli().main(["run", *tiny(store), "--max_steps", "3"]) == 0
    assert stage_steps(tmp_path / "q.summary.json") == [3, 3]
    saved = yaml.safe_load((tmp_path / "q.config.yaml").read_text())
    assert saved["max_steps"] == 3
    assert [s["init_args"].get("steps", s["init_args"].get("max_steps")) for s in
            saved["simulator"]["stages"]] == [3, 3]  # fmt: skip
    # the option in a config file, like any other key
    path = tmp_path / "trial.yaml"
    path.write_text(yaml.safe_dump({"max_steps": 2}))
    assert trial_cli().main(["run", *tiny(store), "--config", str(path)]) == 0
    assert stage_steps(tmp_path / "q.summary.json") == [2, 2]


def test_added_option_in_help_print_config_and_errors(
    trial_cli: type[CLI], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert trial_cli().main(["run", "--help"]) == 0
    assert "cap every stage's step budget" in capsys.readouterr().out
    argv = ["validate", *tiny(tmp_path / "q.zarr")]
    assert trial_cli().main([*argv, "--max_steps", "4", "--print_config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["max_steps"] == 4
    assert trial_cli().main([*argv, "--max_steps", "many"]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("error: max_steps: expected"), lines
    assert trial_cli().main([*argv, "--max_step", "4"]) == 2
    line = error_lines(capsys.readouterr().err)[0]
    assert line.startswith("error: max_step: unknown option. Did you mean --max_steps"), line
    assert "--max_steps" not in _help_of(main, ["run", "--help"], capsys)  # not in the base CLI
    assert main([*argv, "--max_steps", "4"]) == 2


def _help_of(entry: Any, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert entry(argv) == 0
    return capsys.readouterr().out


def test_added_command(
    trial_cli: type[CLI], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = read(COPPER, ":")
    assert trial_cli().main(["count", str(COPPER)]) == 0
    atoms = sum(len(a) for a in expected)
    assert capsys.readouterr().out.strip() == f"{len(expected)} structures, {atoms} atoms"
    # listed with the built-in commands, which still work
    out = _help_of(trial_cli().main, ["--help"], capsys)
    commands = "run,validate,plugins,report,merge,eos,elastic,phonons,vibrations,qha,order,count"
    assert out.startswith(f"usage: my-alchemi [--debug] {{{commands}}}")
    assert "count the structures and atoms" in out and "my-alchemi validate --config" in out
    assert trial_cli().main(["plugins", "--kind", "sink"]) == 0
    assert "ZarrSink" in capsys.readouterr().out
    # its errors are one line, status 2, like the built-in commands'
    assert trial_cli().main(["count", str(tmp_path / "none.extxyz")]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "does not exist" in lines[0], lines
    assert trial_cli().main(["count"]) == 2
    line = error_lines(capsys.readouterr().err)[0]  # argparse's words, after the command's name
    assert line.startswith("error: count: ") and "required" in line and "path" in line, line
    assert main(["count", str(COPPER)]) == 2  # the base CLI has no such command
    assert "unknown command 'count'" in capsys.readouterr().err


class PythonSimulatorCLI(CLI):
    """A Simulator built in Python (here: a shorter cutoff and one FIRE stage) for the
    config's data, sinks and summary."""

    def build_simulator(self, config: dict[str, Any]) -> Any:
        from alchemi_lit import Simulator
        from alchemi_lit.integrators import FIRE
        from alchemi_lit.models import LennardJones
        from alchemi_lit.sinks import ZarrSink

        if config["simulator"]["seed"] != 0:
            raise CLIError("simulator.seed", "this CLI runs seed 0 only")
        store = config["simulator"]["sinks"][0]["init_args"]["store"]
        model = LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0)
        return Simulator(model, FIRE(max_steps=4), sinks=[ZarrSink(store, mode="w")])


def test_build_simulator_hook(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "q.zarr"
    assert PythonSimulatorCLI().main(["validate", *tiny(store)]) == 0
    out = capsys.readouterr().out
    assert "cutoff 6 Å" in out and "0:FIRE" in out and "Langevin" not in out
    assert PythonSimulatorCLI().main(["run", *tiny(store)]) == 0
    assert stage_steps(tmp_path / "q.summary.json") == [4]
    assert PythonSimulatorCLI().main(["validate", *tiny(store), "--simulator.seed", "1"]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert lines == ["error: simulator.seed: this CLI runs seed 0 only"]
