"""The numbers ``alchemi-lit report`` prints, against the stored arrays they come from.

Most stores here are written by hand (the layout of :mod:`alchemi_lit.io.results_store`),
so every per-system value is known; the reference is NumPy on those arrays (population
statistics over the systems that left a stage, ASE's ``GPa``), and the printed table is
parsed back.  ``test_report.py`` runs the report on stores real runs wrote.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr
from ase.units import GPa
from rich.console import Console

import alchemi_lit as al
from alchemi_lit.data import argon_crystals
from alchemi_lit.integrators import VelocityVerlet
from alchemi_lit.io.results_store import SCHEMA
from alchemi_lit.models import LennardJones
from alchemi_lit.report import report, summarize, summary_table
from alchemi_lit.report.runs import summarize_runs
from alchemi_lit.sinks import ZarrSink

NAN = float("nan")


def write_store(
    path: Path,
    systems: dict[str, Any],
    runs: list[dict[str, Any]],
    committed: int | None = None,
    info: list[str] | None = None,
) -> Path:
    """A results store holding ``systems`` (per-system arrays) and ``runs``; rows past
    ``committed`` are written but not committed (an interrupted write)."""
    group = zarr.open_group(str(path), mode="w")
    n = len(systems["energy"])
    for name, values in systems.items():
        group.create_array(f"systems/{name}", data=np.asarray(values))
    if info is not None:
        texts = group.create_array("systems/info", shape=(len(info),), dtype=str)  # as ZarrSink
        texts[:] = np.array(info, dtype=object)
    group.attrs.update(schema=SCHEMA, n_systems=n if committed is None else committed,
                       n_atoms=int(np.sum(systems["n_atoms"])), runs=runs)  # fmt: skip
    return path


def printed(summary: dict[str, Any]) -> str:
    out = io.StringIO()
    Console(file=out, width=250).print(summary_table(summary))
    return out.getvalue()


def run_report(store: Path) -> tuple[dict[str, Any], str]:
    out = io.StringIO()
    summary = report(store, console=Console(file=out, width=250))
    return summary, out.getvalue()


class RaisesOnSystem1(LennardJones):
    """Argon LJ that cannot evaluate any batch holding system 1 (a model error)."""

    def __init__(self) -> None:
        super().__init__(epsilon=0.0104, sigma=3.40, cutoff=6.0)

    def forward(self, batch: al.Batch, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        if bool((batch.system_id == 1).any()):
            raise RuntimeError("descriptor undefined for this structure")
        return super().forward(batch, *args, **kwargs)


# ---------------------------------------------------------------------- quarantine
def test_a_system_the_model_failed_on_counts_as_quarantined(tmp_path: Path, log_messages) -> None:
    """A model error quarantines a system as non-finite values do (``failed_exit``): the
    report and the Logger's run summary count both.  They counted only ``non_finite``
    exits, so a run whose model raised on a structure read ``quarantined 0`` next to
    ``model_error=1``."""
    from alchemi_lit.callbacks import Logger

    store = tmp_path / "e.zarr"
    sim = al.Simulator(model=RaisesOnSystem1(), stages=VelocityVerlet(dt=1.0, steps=4),
                       sinks=[ZarrSink(store)], callbacks=[Logger(every=100)])  # fmt: skip
    assert sim.run(argon_crystals(n_systems=3, repeat=1, seed=1)).exit_reasons == [
        "completed", "model_error", "completed"]  # fmt: skip
    summary, text = run_report(store)
    assert summary["quarantined"] == 1 and summary["exit_reasons"]["model_error"] == 1
    assert re.search(r"quarantined\W+1\W", text)
    logged = [m for _, m in log_messages if m.startswith("run end")][-1]
    assert "1 quarantined" in logged and "model_error=1" in logged


# ---------------------------------------------------------------------- stage labels
def test_a_column_two_runs_filled_with_different_stages_names_both(tmp_path: Path) -> None:
    """A FIRE run, then a Langevin run appended to its store: the one history column
    holds FIRE exits in run 0's rows and Langevin exits in run 1's.  The report and
    ``read_results(store).to_pandas()`` name it ``0:FIRE|0:Langevin`` alike, and each
    run read alone keeps its own label.  (The report took the last run's label and the
    table the first's: each mislabelled the other run's rows, and they disagreed.)"""
    from alchemi_lit.data import SizeAwareSampler
    from alchemi_lit.integrators import FIRE, Langevin
    from alchemi_lit.sinks import read_results

    data = argon_crystals(n_systems=2, repeat=1, seed=1)
    lj = LennardJones(0.0104, 3.40, 6.0)
    store = tmp_path / "two.zarr"
    al.Simulator(model=lj, stages=FIRE(fmax=0.05, max_steps=5), sinks=[ZarrSink(store)]).run(
        data[:1]
    )
    al.Simulator(
        model=lj, stages=Langevin(dt=2.0, temperature=50.0, friction=0.02, steps=3),
        sinks=[ZarrSink(store, mode="a")],
    ).run(SizeAwareSampler(data[1:], max_atoms=40, system_ids=[1]))  # fmt: skip
    summary, text = run_report(store)
    assert [s["name"] for s in summary["stages"]] == ["0:FIRE|0:Langevin"]
    assert "steps 0:FIRE|0:Langevin" in text and "last: stages 0:Langevin" in text
    whole = read_results(store).to_pandas()
    assert whole["exit_reason[0:FIRE|0:Langevin]"].tolist()[1] == "completed"
    assert read_results(store, run=0).to_pandas()["exit_reason[0:FIRE]"].tolist() != []
    assert read_results(store, run=1).to_pandas()["exit_reason[0:Langevin]"].tolist() == [
        "completed"
    ]


# ---------------------------------------------------------------------- per-stage numbers
#: five systems through FIRE then Langevin: 0 and 1 periodic crystals, 2 a cluster (no
#: volume), 3 quarantined (non-finite, inf energy) in FIRE, 4 converged in FIRE and
#: was quarantined in Langevin (a finite value in that column is not its exit energy:
#: the report must skip it, as every system that did not leave a stage); the stress was
#: computed in FIRE only (NaN in Langevin)
HISTORY = {
    "system_id": np.arange(5),
    "n_atoms": np.array([4, 8, 2, 6, 3]),
    "energy": np.array([-1.0, -3.2, -0.5, np.inf, -0.9]),
    "converged": np.array([True, True, False, False, False]),
    "exit_code": np.array([3, 3, 3, 4, 4]),
    "total_steps": np.array([30, 25, 48, 10, 7]),
    "stage_steps": np.array([[22, 8], [17, 8], [40, 8], [10, 0], [5, 2]]),
    "stage_exit": np.array([[1, 3], [1, 3], [2, 3], [0, 0], [1, 0]]),
    "stage_energy": np.array([[-1.1, -1.0], [-3.3, -3.2], [-0.6, -0.5], [NAN, NAN], [-0.8, -0.7]]),
    "stage_volume": np.array([[40.0, 41.0], [90.0, 92.0], [NAN, NAN], [NAN, NAN], [NAN, NAN]]),
    "stage_pressure": np.array([[1e-3, NAN], [-2e-3, NAN], [NAN, NAN], [NAN, NAN], [NAN, NAN]]),
}
NAMES = ["0:FIRE", "1:Langevin"]


def spread(values: np.ndarray) -> dict[str, Any]:
    """Population statistics of the finite values (the reference)."""
    v = values[np.isfinite(values)]
    return {"n": len(v), "mean": v.mean(), "std": v.std(ddof=0), "min": v.min(), "max": v.max()}


def expected_stages() -> list[dict[str, Any]]:
    """Per stage, by hand from HISTORY: the systems that left it (exit != running), their
    energy and volume per atom, their pressure in GPa (ASE's unit), and the steps."""
    h, out = HISTORY, []
    for j in range(2):
        left = h["stage_exit"][:, j] != 0
        steps = h["stage_steps"][:, j]
        out.append({
            "steps": (steps.mean(), steps.max(), steps.sum()),
            "energy_per_atom": spread(h["stage_energy"][left, j] / h["n_atoms"][left]),
            "volume_per_atom": spread(h["stage_volume"][left, j] / h["n_atoms"][left]),
            "pressure_gpa": h["stage_pressure"][left, j] / GPa,
        })  # fmt: skip
    return out


def test_stage_statistics_are_numpy_statistics_of_the_stored_history() -> None:
    """Mean, population std, min and max over the systems that left each stage, per atom
    for energy and volume, in GPa for the pressure; steps per column; the final energy
    per atom over the finite ones; converged from ``converged`` (a FIRE + Langevin run
    exits ``completed``), quarantined and completed from the exit codes."""
    summary = summarize(HISTORY, NAMES)
    assert (summary["systems"], summary["atoms"]) == (5, 23)
    assert (summary["converged"], summary["completed"], summary["quarantined"]) == (2, 3, 2)
    assert summary["exit_reasons"] == {"completed": 3, "non_finite": 2}
    epa = HISTORY["energy"][[0, 1, 2, 4]] / HISTORY["n_atoms"][[0, 1, 2, 4]]
    assert summary["energy_per_atom"] == pytest.approx(
        {"mean": epa.mean(), "min": epa.min(), "max": epa.max()}, rel=1e-12
    )
    assert summary["atom_steps"] == int((HISTORY["n_atoms"] * HISTORY["total_steps"]).sum())
    for got, want, name in zip(summary["stages"], expected_stages(), NAMES):
        assert got["name"] == name
        assert (got["steps_mean"], got["steps_max"], got["steps_total"]) == want["steps"]
        for key in ("energy_per_atom", "volume_per_atom"):
            assert got[key] == pytest.approx(want[key], rel=1e-12), (name, key)
    fire, langevin = summary["stages"]
    assert fire["exits"] == {"converged": 3, "max_steps": 1, "running": 1}
    assert fire["pressure_gpa"] == pytest.approx(spread(expected_stages()[0]["pressure_gpa"]))
    # by hand: 1 eV/Å^3 = 1.6021766e-19 J / 1e-30 m^3 = 160.21766 GPa (ASE: CODATA 2014)
    assert fire["pressure_gpa"]["max"] == pytest.approx(1e-3 * 160.21766, rel=1e-7)
    assert langevin["pressure_gpa"]["n"] == 0  # no stress computed in Langevin


def parse_spread(text: str, label: str, unit: str) -> dict[str, float]:
    m = re.search(
        rf"{re.escape(label)}\W+mean (\S+) {re.escape(unit)}, std (\S+) \(min (\S+), "
        rf"max (\S+); (\d+) systems\)",
        text,
    )
    assert m, f"no {label!r} row"
    return dict(zip(("mean", "std", "min", "max", "n"), map(float, m.groups())))


def test_the_printed_table_reads_back_as_the_stored_history() -> None:
    """The table, parsed back, gives the NumPy statistics to its printed decimals (min
    and max in their places); a stage without a computed stress says so."""
    text = printed(summarize(HISTORY, NAMES))
    assert re.search(r"converged\W+2 / 5\W", text) and re.search(r"quarantined\W+2\W", text)
    for want, name in zip(expected_stages(), NAMES):
        for key, label, unit, digits in (
            ("energy_per_atom", "E/atom at exit", "eV", 6),
            ("volume_per_atom", "V/atom at exit", "Å^3", 4),
        ):
            got = parse_spread(text, f"{label} {name}", unit)
            for stat in ("mean", "std", "min", "max", "n"):
                assert got[stat] == pytest.approx(want[key][stat], abs=0.51 * 10**-digits)
    pressure = parse_spread(text, "P at exit 0:FIRE", "GPa")
    assert (pressure["min"], pressure["max"]) == (round(-2e-3 / GPa, 4), round(1e-3 / GPa, 4))
    assert re.search(r"P at exit 1:Langevin\W+stress not computed", text)


def test_an_optimizer_stage_is_one_a_system_left_by_its_criterion_or_its_budget() -> None:
    """A FIRE stage none of whose systems converged (all ran out of steps, one was
    quarantined) is still an optimizer: the table says ``converged 0 / 3``, not
    ``completed`` as for MD alone; so does a store without a stage history."""
    systems = {
        "energy": np.array([-1.0, -2.0, NAN]), "n_atoms": np.array([2, 4, 3]),
        "converged": np.zeros(3, bool), "exit_code": np.array([2, 2, 4]),
        "stage_steps": np.array([[9], [9], [3]]), "stage_exit": np.array([[2], [2], [0]]),
    }  # fmt: skip
    summary = summarize(systems, ["0:FIRE"])
    assert summary["has_optimizer"] is True
    assert re.search(r"converged\W+0 / 3\W", printed(summary))
    md = {**systems, "exit_code": np.array([3, 3, 4]), "stage_exit": np.array([[3], [3], [0]])}
    assert re.search(r"completed\W+2 / 3\W", printed(summarize(md, ["0:Langevin"])))
    # no stage history (an older store): which stages optimized is unknown, converged shown
    older = {k: v for k, v in systems.items() if not k.startswith("stage_")}
    assert summarize(older)["has_optimizer"] is True
    assert re.search(r"converged\W+0 / 3\W", printed(summarize(older)))


# ---------------------------------------------------------------------- runs and totals
def test_throughput_of_a_run_from_its_stats() -> None:
    """The run's table (``alchemi-lit run``): atom-steps per second = sum of n_atoms *
    total_steps over the wall time, systems per second = systems / wall time."""
    stats = {"wall_time_s": 2.5, "steps": 48, "forward_calls": 50}
    summary = summarize(HISTORY, NAMES, stats)
    # 4*30 + 8*25 + 2*48 + 6*10 + 3*7 = 497 atom-steps
    assert int((HISTORY["n_atoms"] * HISTORY["total_steps"]).sum()) == 497
    assert summary["atom_steps_per_s"] == pytest.approx(497 / 2.5, rel=1e-15)
    assert summary["systems_per_s"] == pytest.approx(5 / 2.5, rel=1e-15)
    text = printed(summary)
    assert re.search(r"throughput\W+199 atom-steps/s, 2 systems/s", text)
    assert re.search(r"loop steps\W+48 \(50 forward calls\)", text)


@pytest.mark.parametrize("n", [5, 7])
def test_skipped_structures_name_five_then_count_the_rest(n: int) -> None:
    """Five skipped structures are all named; of seven, five are named and '2 more'."""
    skipped = [{"system_id": k, "reason": "no atoms"} for k in range(n)]
    text = printed(summarize(HISTORY, NAMES, {"wall_time_s": 1.0, "skipped": skipped}))
    row = re.search(r"skipped\W+(\d+) \(skip_invalid: (.*?)\)\s*│", text)
    assert row and int(row.group(1)) == n
    assert row.group(2).count("no atoms") == 5
    assert ("2 more" in row.group(2)) == (n == 7) and "0 more" not in text


#: three runs appended to one store (rows 0-1, 2-4, 5): run 1 resumed after an
#: interruption (its time covers only the part after the restart), run 2 recorded no
#: time; run 0's stats count systems its in-memory sink kept too (the store holds 2)
RUNS = [
    {"first_row": 0, "stage_names": NAMES, "stats": {"wall_time_s": 2.0, "systems": 7}},
    {"first_row": 2, "stage_names": NAMES, "stats": {"wall_time_s": 3.0, "resumed": True}},
    {"first_row": 5, "stage_names": NAMES, "model": "EMT", "plan": "Fused([0:FIRE])"},
]


def test_each_run_has_its_rows_and_the_totals_leave_out_untimed_time() -> None:
    """Rows from ``first_row`` to the next run's; a run's systems are its rows; its
    atom-steps the sum over them.  The throughput totals only runs with a time and not
    resumed (run 0 here: 4*30 + 8*25 atom-steps in 2 s), the wall time all recorded
    ones (5 s), with a note for the run without one."""
    per_atom_step = HISTORY["n_atoms"] * HISTORY["total_steps"]
    runs = summarize_runs(RUNS, HISTORY)
    got = runs["runs"]
    assert [r["rows"] for r in got] == [[0, 2], [2, 5], [5, 5]]
    assert [r["systems"] for r in got] == [2, 3, 0]
    assert [r["atom_steps"] for r in got] == [320, int(per_atom_step[2:5].sum()), 0]
    assert got[0]["atom_steps_per_s"] == pytest.approx(320 / 2.0)
    assert "atom_steps_per_s" not in got[1]  # resumed: part of its work is untimed
    assert runs["wall_time_s"] == pytest.approx(5.0)
    assert runs["atom_steps_per_s"] == pytest.approx(320 / 2.0)
    assert runs["systems_per_s"] == pytest.approx(2 / 2.0)
    assert runs["wall_time_note"] == "1 run(s) without a recorded time"


def test_a_store_reports_its_committed_rows_and_its_last_run(tmp_path: Path) -> None:
    """Rows written past the commit marker (an interrupted write) are not results; the
    output line names the last run's stages and model."""
    garbage = {k: np.concatenate([v, v[:2]]) for k, v in HISTORY.items()}
    garbage["energy"][5:] = -1e3
    runs = [{**RUNS[0], "model": "LennardJones"}, {**RUNS[1], "model": "EMT",
            "stage_names": ["0:FIRE", "1:VelocityVerlet"]}]  # fmt: skip
    store = write_store(tmp_path / "s.zarr", garbage, runs, committed=5)
    summary, text = run_report(store)
    assert summary["systems"] == 5 and summary["atoms"] == 23
    assert summary["energy_per_atom"]["min"] == pytest.approx(-3.2 / 8)
    assert summary["runs"][-1]["rows"] == [2, 5]
    assert "last: stages 0:FIRE / 1:VelocityVerlet, model EMT" in text
    assert [s["name"] for s in summary["stages"]] == ["0:FIRE", "1:Langevin|1:VelocityVerlet"]


def test_labels_that_do_not_fit_the_columns_fall_back_to_the_plan(tmp_path: Path) -> None:
    """A run whose recorded ``stage_names`` do not fit the history's width (an older or
    hand-edited store) is labelled from its plan, as a store without them."""
    run = {"first_row": 0, "stage_names": ["0:FIRE"],
           "plan": "Fused([0:FIRE, 1:Langevin], entry=0, exit=2)"}  # fmt: skip
    summary, _ = run_report(write_store(tmp_path / "s.zarr", HISTORY, [run]))
    assert [s["name"] for s in summary["stages"]] == ["0:FIRE", "1:Langevin"]


def test_the_printed_run_lines_and_totals(tmp_path: Path) -> None:
    """One line per run: its systems (rows), wall time, throughput where it has one,
    'resumed', its stages; then the total time with the untimed run noted and the
    throughput of the rated run (320 atom-steps and 2 systems in 2 s)."""
    _, text = run_report(write_store(tmp_path / "s.zarr", HISTORY, RUNS))
    stages = "0:FIRE / 1:Langevin"
    assert re.search(rf"run 0\W+2 systems, 2.00 s, 160 atom-steps/s \| {stages}", text)
    assert re.search(rf"run 1\W+3 systems, 3.00 s, resumed \| {stages}", text)
    assert re.search(rf"run 2\W+0 systems, wall time not recorded \| {stages}", text)
    assert re.search(r"wall time\W+5.00 s in total \(1 run\(s\) without a recorded time\)", text)
    assert re.search(r"throughput\W+160 atom-steps/s, 1 systems/s", text)
