"""The ``alchemi-lit`` command line: runs, overrides, --print_config, validate, errors.

Runs go through ``main([...])`` in-process (fast); one subprocess checks the installed
console script.  Inputs are tiny: 2 argon crystals of 32 atoms, a few dozen steps.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from alchemi_lit.cli import main
from alchemi_lit.sinks import read_results

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def tiny(store: Path) -> list[str]:
    """Overrides that shrink the quickstart to 2 x 32 atoms and ~25 steps."""
    return [
        "--data.builtin_args.n_systems",
        "2",
        "--data.builtin_args.repeat",
        "2",
        "--simulator.stages.0.init_args.max_steps",
        "40",
        "--simulator.stages.1.init_args.steps",
        "10",
        "--simulator.sinks.0.init_args.store",
        str(store),
    ]


def energies(store: Path) -> np.ndarray:
    return read_results(store).energy.numpy()


def error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny quickstart, run once for the module; returns its results store."""
    store = tmp_path_factory.mktemp("base") / "q.zarr"
    assert main(["run", "--config", str(QUICKSTART), *tiny(store)]) == 0
    return store


# ---------------------------------------------------------------------- console script
def _console_script() -> str:
    """The installed ``alchemi-lit`` script (next to this Python, else on PATH)."""
    here = Path(sys.executable).with_name("alchemi-lit")
    exe = str(here) if here.exists() else shutil.which("alchemi-lit")
    assert exe is not None, "console script alchemi-lit is not installed (pip install -e .)"
    return exe


def test_console_script_help_without_fabric_or_torch() -> None:
    exe = _console_script()
    with open(exe, "rb") as fh:
        is_python = b"python" in fh.readline()
    cmd = [sys.executable, "-X", "importtime", exe] if is_python else [exe]
    proc = subprocess.run(
        [*cmd, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "run" in proc.stdout and "validate" in proc.stdout and "plugins" in proc.stdout
    if not is_python:  # a wrapper (e.g. a pyenv shim): importtime cannot see inside it
        return
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if "|" in ln]
    assert imported, "python -X importtime printed nothing"
    assert not [m for m in imported if m.startswith(("lightning_fabric", "lightning"))]
    assert "torch" not in imported, "`alchemi-lit --help` imported torch (slow start)"


def test_run_writes_store_config_summary_without_fabric(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = set(sys.modules)
    store = tmp_path / "out" / "q.zarr"
    assert main(["run", "--config", str(QUICKSTART), *tiny(store)]) == 0
    new = set(sys.modules) - before
    assert not [m for m in new if m.startswith(("lightning_fabric", "lightning."))]
    out = capsys.readouterr().out
    assert "systems" in out and "converged" in out and "atom-steps/s" in out and str(store) in out
    assert len(energies(store)) == 2
    # resolved config and summary next to the store; the config also in the store attrs
    config = yaml.safe_load((tmp_path / "out" / "q.config.yaml").read_text())
    assert config["simulator"]["stages"][1]["init_args"]["temperature"] == 60.0
    assert config["simulator"]["model"]["init_args"]["epsilon"] == 0.0104  # preset lj-argon
    summary = json.loads((tmp_path / "out" / "q.summary.json").read_text())
    assert summary["systems"] == 2 and summary["quarantined"] == 0
    assert [s["name"] for s in summary["stages"]] == ["0:FIRE", "1:Langevin"]
    import zarr

    run = zarr.open_group(str(store), mode="r").attrs["runs"][-1]
    assert run["config"] == config
    assert run["summary"]["atom_steps_per_s"] > 0
    # the numerics a comparison across machines needs (#41): printed, in summary and store
    import torch

    for env in (summary["environment"], run["environment"]):
        assert env["torch"]["version"] == torch.__version__
        assert env["torch"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
        assert env["numpy"]["version"] == np.__version__
    assert f"ATen {torch.backends.cpu.get_cpu_capability()}" in " ".join(out.split())


def test_summary_lists_what_skip_invalid_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An oversize structure under ``sampler: {skip_invalid: true}`` is skipped with its
    reason in the printed summary and in the summary JSON (it used to stop the run)."""
    store = tmp_path / "s.zarr"
    sets = "{n_systems: 4, min_atoms: 8, max_atoms: 20, seed: 2}"  # 18, 18, 20, 9 atoms
    argv = ["run", "--config", str(QUICKSTART), *tiny(store), "--data.structures",
            "builtin:mixed_argon", "--data.builtin_args", sets,
            "--data.sampler", "{max_atoms: 19, skip_invalid: true}"]  # fmt: skip
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "skipped" in out and "system_id 2: 20 atoms, more than max_atoms=19" in out, out
    summary = json.loads((tmp_path / "s.summary.json").read_text())
    assert summary["systems"] == 3
    assert summary["skipped"] == [
        {"index": 2, "system_id": 2, "reason": "20 atoms, more than max_atoms=19"}
    ]


def test_override_changes_result(tmp_path: Path, base_run: Path) -> None:
    store = tmp_path / "hot.zarr"
    argv = ["run", "--config", str(QUICKSTART), *tiny(store)]
    assert main([*argv, "--simulator.stages.1.init_args.temperature", "500"]) == 0
    hot, cold = energies(store), energies(base_run)
    assert hot.shape == cold.shape
    assert hot.mean() > cold.mean() + 1e-3  # 500 K MD ends far above the 60 K run


def test_print_config_reruns_to_same_results(
    tmp_path: Path, base_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["run", "--config", str(QUICKSTART), *tiny(base_run), "--print_config"]) == 0
    printed = capsys.readouterr().out
    resolved = yaml.safe_load(printed)
    assert resolved["simulator"]["stages"][0]["class_path"].endswith("FIRE")
    assert resolved["simulator"]["model"]["init_args"]["sigma"] == 3.4
    # the printed config runs as is; only the store moves
    resolved["simulator"]["sinks"][0]["init_args"]["store"] = str(tmp_path / "again.zarr")
    path = tmp_path / "printed.yaml"
    path.write_text(yaml.safe_dump(resolved))
    assert main(["run", "--config", str(path)]) == 0
    np.testing.assert_array_equal(energies(tmp_path / "again.zarr"), energies(base_run))


def test_list_append_and_short_names(tmp_path: Path) -> None:
    store = tmp_path / "a.zarr"
    argv = [
        "run",
        "--config",
        str(QUICKSTART),
        *tiny(store),
        "--simulator.stages+=fire-ase",
        "--simulator.stages.init_args.max_steps",
        "5",
    ]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "a.summary.json").read_text())
    assert [s["name"] for s in summary["stages"]] == ["0:FIRE", "1:Langevin", "2:FIRE"]
    assert summary["stages"][2]["steps_max"] <= 5


def test_validate_ok_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "v" / "q.zarr"
    assert main(["validate", "--config", str(QUICKSTART), *tiny(store)]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "LennardJones" in out and "2 systems" in out
    assert not (tmp_path / "v").exists()
    assert list(tmp_path.iterdir()) == []


def test_class_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--simulator.model.help", "LennardJones"]) == 0
    assert "epsilon" in capsys.readouterr().out
    assert main(["run", "--simulator.stages.help", "fire-ase"]) == 0  # presets name their class
    assert "fmax" in capsys.readouterr().out


DOCUMENTED = """
from alchemi_lit.integrators import FIRE
from alchemi_lit.integrators.fire import ASE_FIRE_DT_FS


class DocumentedFIRE(FIRE):
    \"\"\"FIRE whose parameters are documented the Google way.

    Args:
        fmax: converged when every atom's force is below this (eV/Å).
        max_steps: step budget of the stage.
        dt: initial time step (fs); ASE's default, 0.1 in its own time units.
        maxstep: largest displacement of an atom in one step, in Å.
    \"\"\"

    def __init__(self, fmax: float = 0.05, max_steps: int = 1000, dt: float = ASE_FIRE_DT_FS,
                 maxstep: float = 0.2) -> None:
        super().__init__(fmax=fmax, max_steps=max_steps, dt=dt, maxstep=maxstep)
"""


def test_class_help_shows_meaning_units_and_readable_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each parameter with the meaning and unit its docstring's Args give it, and its
    default in that unit, rounded where the exact value is unreadable."""
    from ase.units import fs

    (tmp_path / "documented_fire.py").write_text(DOCUMENTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    capsys.readouterr()
    assert main(["run", "--simulator.stages.help", "documented_fire.DocumentedFIRE"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # undo the help's line wrapping
    assert "converged when every atom's force is below this (eV/Å)." in out
    assert "initial time step (fs); ASE's default, 0.1 in its own time units." in out
    assert "default: 0.05 eV/Å" in out and "default: 0.2 Å" in out and "default: 1000)" in out
    ase_dt = f"≈{0.1 / fs:.4g} fs"  # ASE's FIRE: dt = 0.1 ASE time units
    assert f"default: {ase_dt} (exactly 0.1 in ASE time units)" in out
    assert repr(0.1 / fs) not in out
    # the built-in FIRE too (its units arrive with its docstring)
    assert main(["run", "--simulator.stages.help", "FIRE"]) == 0
    out = capsys.readouterr().out
    assert repr(0.1 / fs) not in out and f"≈{0.1 / fs:.4g}" in out


@pytest.mark.parametrize(
    ("description", "unit"),
    [
        ("initial time step (fs); ASE's 0.1", "fs"),
        ("converged below this force (eV/Å)", "eV/Å"),
        ("friction coefficient in 1/fs", "1/fs"),
        ("largest displacement in one step, in Å.", "Å"),
        ("target temperature [K]", "K"),
        ("step budget of the stage", None),
        ("mixing factor in each step", None),
        (None, None),
    ],
)
def test_unit_of_a_parameter_description(description: str | None, unit: str | None) -> None:
    from alchemi_lit.cli.help_format import unit_of

    assert unit_of(description) == unit


def test_documented_plugins_document_every_parameter() -> None:
    """A registered class whose docstring has an Args section lists each of its
    parameters there (the help shows nothing for one left out)."""
    import inspect

    from docstring_parser import parse

    from alchemi_lit.core import registry

    gaps = {}
    for entry in registry.all_entries():
        if entry.is_preset:
            continue
        init = entry.cls.__dict__.get("__init__")  # (its own docs: a third-party
        own = (entry.cls.__doc__, getattr(init, "__doc__", None))  # class owes nothing)
        documented = {p.arg_name for doc in own if doc for p in parse(doc).params}
        if not documented:
            continue
        params = [
            p.name
            for p in inspect.signature(entry.cls).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        missing = [p for p in params if p not in documented]
        if missing:
            gaps[entry.name] = missing
    assert gaps == {}


def test_saved_config_writes_where_the_first_run_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relative output paths (store, trajectory, checkpoints, defaults included) are
    saved absolute, so the saved config re-run from elsewhere writes to the same place."""
    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    first.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(first)
    argv = [
        "run",
        "--config",
        str(QUICKSTART),
        *tiny(Path("out/q.zarr")),
        "--simulator.callbacks+=TrajectoryWriter",
        "--simulator.callbacks.init_args.path",
        "traj.zarr",
        "--simulator.callbacks.init_args.overwrite",
        "true",
        "--simulator.callbacks+=Checkpoint",
    ]
    assert main(argv) == 0
    saved = first / "out" / "q.config.yaml"
    config = yaml.safe_load(saved.read_text())
    sim = config["simulator"]
    assert sim["sinks"][0]["init_args"]["store"] == str(first / "out" / "q.zarr")
    paths = {c["class_path"].rsplit(".", 1)[-1]: c["init_args"] for c in sim["callbacks"]}
    assert paths["TrajectoryWriter"]["path"] == str(first / "traj.zarr")
    assert paths["Checkpoint"]["dirpath"] == str(first / "checkpoints")  # the default
    before = energies(first / "out" / "q.zarr")
    monkeypatch.chdir(elsewhere)
    assert main(["run", "--config", str(saved)]) == 0
    assert list(elsewhere.iterdir()) == []  # nothing written here
    np.testing.assert_array_equal(energies(first / "out" / "q.zarr"), before)  # rewritten
    assert len(read_results(first / "out" / "q.zarr").energy) == 2


# ---------------------------------------------------------------------- errors
def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


BAD_OVERRIDES = {
    "unknown plugin": (
        ["--simulator.stages.0.class_path", "FIRES"],
        "simulator.stages.0.class_path",
        "Did you mean FIRE",
    ),
    "wrong type": (
        ["--simulator.stages.0.init_args.fmax", "abc"],
        "simulator.stages.0.init_args.fmax",
        "expected float",
    ),
    "negative dt": (
        ["--simulator.stages.1.init_args.dt", "-1"],
        "simulator.stages.1.init_args.dt",
        "> 0",
    ),
    "fmax zero": (
        ["--simulator.stages.0.init_args.fmax", "0"],
        "simulator.stages.0.init_args.fmax",
        "> 0",
    ),
    "missing model": (["--simulator.model", "null"], "simulator.model", "missing"),
    "unsupported element": (
        ["--simulator.model", "EMT"],
        "data.structures",
        "EMT cannot evaluate element Ar",
    ),
    "model given an integrator": (
        ["--simulator.model", "FIRE"],
        "simulator.model.class_path",
        "not a model",
    ),
    "unknown parameter": (
        ["--simulator.stages.0.init_args.fmx", "1"],
        "simulator.stages.0.init_args.fmx",
        "Did you mean fmax",
    ),
    "unknown builtin set": (
        ["--data.structures", "builtin:argn"],
        "data.structures",
        "builtin:argon",
    ),
    "list index": (
        ["--simulator.stages.5.init_args.dt", "1"],
        "simulator.stages.5",
        "out of range",
    ),
}


# every case through validate; run shares its checks, so a few cases suffice there
BAD_CASES = [(c, "validate") for c in sorted(BAD_OVERRIDES)] + [
    (c, "run") for c in ("unknown plugin", "negative dt", "unsupported element")
]


@pytest.mark.parametrize(("case", "command"), BAD_CASES)
def test_bad_override_one_clear_error(
    case: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra, key, text = BAD_OVERRIDES[case]
    store = tmp_path / "q.zarr"
    assert main([command, "--config", str(QUICKSTART), *tiny(store), *extra]) == 2
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {key}:"), lines[0]
    assert text in lines[0]
    assert "Traceback" not in err
    assert not store.exists() and list(tmp_path.iterdir()) == []  # nothing ran


def test_bad_config_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        "simulator:\n  model: [unclosed\n": ("--config", "invalid YAML at line"),
        "simulator:\n  model: {class_path: lj-argon}\n  stages: [{class_path: FIRE}]\n"
        "data:\n  structures: no/such/file.extxyz\n": ("data.structures", "does not exist"),
        "simulater: {}\n": ("simulater", "Did you mean simulator"),
        "simulator:\n  model: {class_path: lj-argon}\n  stages: [{class_path: FIRE}]\n"
        "data:\n  structures: builtin:argon\n  sampler: {max_atoms: -5}\n": (
            "data.sampler.max_atoms",
            ">= 1",
        ),
        "simulator:\n  model: {class_path: lj-argon}\n  stages: [{class_path: FIRE}]\n"
        "  sync_every: 0\ndata:\n  structures: builtin:argon\n": ("simulator.sync_every", ">= 1"),
    }
    for text, (key, message) in cases.items():
        path = _write(tmp_path, text)
        assert main(["validate", "--config", str(path)]) == 2, text
        err = capsys.readouterr().err
        lines = error_lines(err)
        assert len(lines) == 1 and "Traceback" not in err, err
        assert lines[0].startswith(f"error: {key}"), lines[0]
        assert message in lines[0], lines[0]
    assert main(["validate", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_existing_store_is_refused_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "q.zarr"
    store.mkdir()
    argv = [
        "run",
        "--config",
        str(QUICKSTART),
        *tiny(store),
        "--simulator.sinks.0.init_args.mode",
        "w-",
    ]
    assert main(argv) == 2
    line = error_lines(capsys.readouterr().err)[0]
    assert line.startswith("error: simulator.sinks.0.init_args.store:") and "already exists" in line


@pytest.mark.parametrize("sampler", [False, True])
def test_appending_runs_numbered_past_the_stored_ids(
    tmp_path: Path, base_run: Path, sampler: bool
) -> None:
    """A second run appended to a store that holds ids 0 and 1 is refused with the
    fix; data.first_id numbers its structures past them (with or without a sampler)."""
    store = tmp_path / "q.zarr"
    shutil.copytree(base_run, store)
    argv = ["run", "--config", str(QUICKSTART), *tiny(store)]
    argv += ["--simulator.sinks.0.init_args.mode", "a"]
    if sampler:
        argv += ["--data.sampler", "{max_atoms: 40}"]
    assert main(argv) == 2
    assert main([*argv, "--data.first_id", "10"]) == 0
    assert read_results(store).system_id.tolist() == [0, 1, 10, 11]
    assert read_results(store, run=-1).system_id.tolist() == [10, 11]


def test_debug_shows_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["validate", "--config", str(QUICKSTART), *tiny(tmp_path / "q.zarr")]
    assert main([*argv, "--simulator.stages.1.init_args.dt", "-1", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert error_lines(err)[-1].startswith("error: simulator.stages.1.init_args.dt:")


def test_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rnu"]) == 2
    assert "Did you mean run" in capsys.readouterr().err


# ---------------------------------------------------------------------- plugins / report
def test_plugins_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if len(cells) == 5 and cells[1]:
            rows[cells[1]] = cells
    for name, kind in [
        ("FIRE", "integrator"),
        ("fire-ase", "integrator"),
        ("LennardJones", "model"),
        ("EMT", "model"),
        ("ZarrSink", "sink"),
    ]:
        assert name in rows, f"{name} missing from `alchemi-lit plugins`"
        assert rows[name][0] == kind and rows[name][2] == "alchemi_lit"
    assert rows["fire-ase"][3] == "FIRE(mode='ase')"
    assert main(["plugins", "--kind", "sink"]) == 0
    out = capsys.readouterr().out
    assert "ZarrSink" in out and "LennardJones" not in out


def test_report_and_plots(
    tmp_path: Path, base_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    capsys.readouterr()
    assert main(["report", str(base_run), "--plots", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert "0:FIRE" in out and "1:Langevin" in out and "converged" in out and "atom-steps/s" in out
    for png in ("steps_per_stage.png", "energy_per_atom.png"):
        assert (tmp_path / "plots" / png).stat().st_size > 1000
    assert main(["report", str(tmp_path / "nope.zarr")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_report_without_matplotlib(
    tmp_path: Path,
    base_run: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main(["report", str(base_run), "--plots", str(tmp_path / "p")]) == 2
    line = error_lines(capsys.readouterr().err)[0]
    assert "matplotlib" in line and "pip install" in line


# ------------------------------------------ config keys reach the objects built in Python
TINY_ARGV = [
    "--simulator.model", "{class_path: lj-argon}",
    "--simulator.stages", "[{class_path: FIRE, init_args: {max_steps: 3}}]",
    "--simulator.accelerator", "cpu",
    "--data.structures", "builtin:argon",
    "--data.builtin_args", "{n_systems: 2, repeat: 1}",
]  # fmt: skip


def resolved_config(argv: list[str]) -> dict:
    """The resolved config of ``validate`` + ``argv``, in-process."""
    from alchemi_lit.cli import CLI
    from alchemi_lit.cli.argv import split_argv

    return CLI().parse("validate", split_argv([*TINY_ARGV, *argv]))


def test_sampler_budgets_in_a_config_reach_the_sampler() -> None:
    """Every key of ``data.sampler`` reaches the SizeAwareSampler the CLI builds, as
    ``SizeAwareSampler(atoms, **budgets)`` in Python has it; and the documented
    defaults (SamplerConfig, only checked against, never passed on) are the sampler's.
    A budget dropped on the way (``max_systems`` not passed on) ran unnoticed: the
    tests ran samplers from configs but never compared one with the Python API's."""
    import dataclasses
    import inspect

    from alchemi_lit.cli.build import build
    from alchemi_lit.cli.sections import SamplerConfig
    from alchemi_lit.data import SizeAwareSampler

    budgets = {"max_atoms": 64, "max_systems": 3, "max_edges": 999, "skip_invalid": True,
               "memory_fraction": 0.5}  # fmt: skip
    built = build(resolved_config(["--data.sampler", json.dumps(budgets)]))
    expected = SizeAwareSampler(built.structures, **budgets)
    assert isinstance(built.source, SizeAwareSampler)
    for name in budgets:
        assert getattr(built.source, name) == getattr(expected, name), name
    signature = inspect.signature(SizeAwareSampler).parameters
    documented = {f.name: f.default for f in dataclasses.fields(SamplerConfig)}
    assert documented == {
        name: dataclasses.MISSING if signature[name].default is inspect.Parameter.empty
        else signature[name].default
        for name in documented
    }  # fmt: skip


def test_init_args_win_over_a_presets_arguments() -> None:
    """A preset's arguments are defaults: ``lj-argon`` (cutoff 8.5) with ``cutoff: 6``
    builds LennardJones(cutoff=6), both written in its init_args and kept through a
    later ``--simulator.model.class_path lj-argon``.  With the preset's arguments
    merged last, the user's value was silently replaced; no test gave a preset an
    argument it sets."""
    from alchemi_lit.cli.build import build_simulator
    from alchemi_lit.models import LennardJones

    expected = LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0)
    for argv in (
        ["--simulator.model.init_args.cutoff", "6.0"],
        ["--simulator.model", "{class_path: LennardJones, init_args: {cutoff: 6.0}}",
         "--simulator.model.class_path", "lj-argon"],
    ):  # fmt: skip
        resolved = resolved_config(argv)
        assert resolved["simulator"]["model"]["init_args"]["cutoff"] == 6.0, argv
        model = build_simulator(resolved).model
        assert (model.cutoff, model.epsilon, model.sigma) == (
            expected.cutoff, expected.epsilon, expected.sigma,
        ), argv  # fmt: skip


@pytest.mark.parametrize("sampler", [False, True])
def test_an_unsupported_element_names_the_systems_id(
    sampler: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """Structures numbered from data.first_id: the model's refusal of an element names
    the system by the id the run (and its store) gives it, not its position: the
    check ran on a one-structure Batch numbered 0, so 'system 0' of a run numbered
    from 10 pointed at the wrong structure; no test set first_id with an unsupported
    element."""
    argv = ["validate", "--simulator.model", "EMT", "--simulator.stages", "[FIRE]",
            "--simulator.accelerator", "cpu", "--data.structures", "builtin:mixed_argon",
            "--data.builtin_args", "{n_systems: 2}", "--data.first_id", "10"]  # fmt: skip
    if sampler:
        argv += ["--data.sampler", "{max_atoms: 1000}"]
    assert main(argv) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith("error: data.structures: EMT cannot evaluate element Ar"), line
    assert re.search(r"systems 10, 11;", line), line  # (both structures, by their ids: #42)
