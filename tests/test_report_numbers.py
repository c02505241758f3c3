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
import torch
import zarr
from rich.console import Console

import alchemi_lit as al
from alchemi_lit.data import argon_crystals
from alchemi_lit.integrators import VelocityVerlet
from alchemi_lit.io.results_store import SCHEMA
from alchemi_lit.models import LennardJones
from alchemi_lit.report import report, summary_table
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
        group.create_array("systems/info", data=np.array(info, dtype=object).astype(str))
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
def test_a_system_the_model_failed_on_counts_as_quarantined(tmp_path: Path) -> None:
    """A model error quarantines a system as non-finite values do (``failed_exit``): the
    report counts both.  It counted only ``non_finite`` exits, so a store whose model
    raised on a structure read ``quarantined 0`` next to ``model_error=1``."""
    store = tmp_path / "e.zarr"
    sim = al.Simulator(model=RaisesOnSystem1(), stages=VelocityVerlet(dt=1.0, steps=4),
                       sinks=[ZarrSink(store)])  # fmt: skip
    assert sim.run(argon_crystals(n_systems=3, repeat=1, seed=1)).exit_reasons == [
        "completed", "model_error", "completed"]  # fmt: skip
    summary, text = run_report(store)
    assert summary["quarantined"] == 1 and summary["exit_reasons"]["model_error"] == 1
    assert re.search(r"quarantined\W+1\W", text)


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
