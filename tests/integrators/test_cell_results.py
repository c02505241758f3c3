"""Relaxed cells everywhere results go: stage history, sinks, report, pipelines, resume.

* Each stage's exit records volume and pressure with the energy (``stage_volume``,
  ``stage_pressure``): at the last stage's exit they are the final cell's volume and
  ``-trace(stress)/3``; a FIRE cell relaxation at 1 GPa leaves at 1 GPa to within what
  its ``fmax`` on the cell forces allows; NaN for a molecule, and for the pressure where
  no stage needed the stress.  ``report`` and the CLI summary show them per stage.
* Graduates keep no stage-private state (a BFGS Hessian is ``(3n + 9)(3 max_atoms + 9)``
  numbers a system): in memory, as in the zarr store, results hold the core fields and
  the history; ``to_atoms``/``to_pandas`` read the same from both.
* ``FIRE(cell=...) | Langevin`` on two ranks equals the fused run bit for bit, and a run
  killed mid cell relaxation resumes from its checkpoint bit for bit (cell, reference
  cell and cell velocities travel in the batch).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from ase.units import GPa
from rich.console import Console
from test_cell_filter import crystals

import alchemi_lit as al
from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback
from alchemi_lit.core.state import ATOM_FIELDS, SYSTEM_FIELDS
from alchemi_lit.data import SizeAwareSampler
from alchemi_lit.integrators import BFGS, FIRE, CellFilter, Langevin
from alchemi_lit.integrators.convergence import EnergyChange, ForceMax
from alchemi_lit.integrators.stage_fields import stage_private_fields, stages_of
from alchemi_lit.models import LennardJones
from alchemi_lit.report import report, summarize, summary_table
from alchemi_lit.sinks import HostMemory, ZarrSink, read_results
from alchemi_lit.strategies.buffers import BufferConfig
from conftest import AR_EPSILON, AR_SIGMA, cluster_argon


def lj() -> LennardJones:
    return LennardJones(AR_EPSILON, AR_SIGMA, 6.0)


def md() -> Langevin:
    return Langevin(dt=2.0, temperature=30.0, friction=0.02, steps=6)


TARGET_GPA = [0.0, 1.0, 0.5, 0.0, 1.0, 0.0]


def cell_relax(fmax: float = 2e-3, max_steps: int = 300) -> FIRE:
    """Per system_id, the target pressures above, repeated."""
    cell = CellFilter(pressure_gpa=TARGET_GPA * 2)
    return FIRE(fmax=fmax, max_steps=max_steps, cell=cell)


# ------------------------------------------------------------------ stage history
def test_volume_and_pressure_are_recorded_when_each_stage_is_left(tmp_path: Path) -> None:
    store = tmp_path / "r.zarr"
    systems = crystals()
    sim = al.Simulator(
        model=lj(), stages=cell_relax() + md(), sinks=[ZarrSink(store)], precision="64"
    )
    res = sim.run(systems)
    b = res.batch
    assert all(res.converged.tolist())
    # leaving the last stage is leaving the plan: the final cell's volume and stress
    assert torch.equal(b.stage_volume[:, 1], b.volume)
    assert torch.equal(b.stage_pressure[:, 1], -b.stress.diagonal(0, -2, -1).sum(-1) / 3.0)
    # leaving the cell relaxation: at the target pressure, as far as fmax allows (the
    # cell forces are the virial V (sigma + p) over n atoms, below fmax per row)
    n, volume = b.n_atoms.double(), b.stage_volume[:, 0]
    target = torch.tensor(TARGET_GPA, dtype=torch.float64) * GPa
    off = (b.stage_pressure[:, 0] - target).abs()
    assert (off < 2e-3 * n / volume).all(), off / GPa
    initial = torch.tensor([a.get_volume() for a in systems], dtype=torch.float64)
    assert (volume - initial).abs().min() > 1.0  # every cell relaxed
    # carried into the store and back
    stored = read_results(store).batch
    for name in ("stage_volume", "stage_pressure", "stage_energy"):
        assert torch.equal(getattr(stored, name), getattr(b, name)), name
    summary, text = run_report(store)
    first = summary["stages"][0]
    assert first["pressure_gpa"]["n"] == len(systems)
    assert abs(first["pressure_gpa"]["mean"] - float(np.mean(TARGET_GPA))) < 0.05
    v = (volume / n).numpy()
    assert first["volume_per_atom"]["min"] == pytest.approx(float(v.min()), rel=1e-12)
    assert "V/atom at exit 0:FIRE" in text and "P at exit 0:FIRE" in text and "GPa" in text


def test_no_volume_for_molecules_and_no_pressure_without_stress() -> None:
    molecule = cluster_argon(5.0, seed=2)
    res = al.Simulator(model=lj(), stages=FIRE(fmax=0.05, max_steps=30) + md()).run(
        [crystals()[0], molecule]
    )
    b = res.batch
    assert torch.isfinite(b.stage_volume[0]).all() and torch.isnan(b.stage_volume[1]).all()
    assert torch.isnan(b.stage_pressure).all()  # no stage needed the stress
    arrays = {k: v.numpy() for k, v in b.system.items()}
    table = io.StringIO()
    Console(file=table, width=200).print(summary_table(summarize(arrays, ["0:FIRE", "1:MD"])))
    assert "stress not computed (Simulator(stress=True) records it)" in table.getvalue()
    asked = al.Simulator(model=lj(), stages=FIRE(fmax=0.05, max_steps=30), stress=True).run(
        [crystals()[0], molecule]
    )
    pressure = asked.batch.stage_pressure[:, 0]
    assert torch.isfinite(pressure[0]) and torch.isnan(pressure[1])


def run_report(store: Path) -> tuple[dict, str]:
    out = io.StringIO()
    summary = report(store, console=Console(file=out, width=200))
    return summary, out.getvalue()


# ------------------------------------------------------------------ what results keep
def test_results_keep_no_stage_private_state(tmp_path: Path) -> None:
    """In memory as in the store: the core fields and the history, no Hessian, no
    reference cell, no FIRE or criterion state; the two read back alike."""
    criterion = ForceMax(0.02) & EnergyChange(1e-6)
    plan = BFGS(fmax=0.05, max_steps=20, cell="frechet", max_atoms=40) + FIRE(
        fmax=0.02, max_steps=20, cell="unit", criterion=criterion
    )
    runs = {}
    for sink in (HostMemory(), ZarrSink(tmp_path / "r.zarr")):
        sim = al.Simulator(model=lj(), stages=plan, sinks=[sink], precision="64")
        runs[type(sink).__name__] = sim.run(crystals()[:3])
    memory, stored = runs["HostMemory"], runs["ZarrSink"]
    private = stage_private_fields(stages_of(plan))
    assert {"bfgs_hessian", "bfgs_hessian_cell", "cell_ref", "fire_cell_velocities"} <= private
    assert {"fire_dt", "stage1_1_prev_energy"} <= private  # (the criterion's, as bound)
    kept = set(memory.batch.atom) | set(memory.batch.system)
    assert not kept & private
    history = {"stage_steps", "stage_exit", "stage_energy", "stage_volume", "stage_pressure"}
    symmetry = {"spacegroup_initial", "spacegroup_final"}  # every relaxation's (#43)
    assert kept == set(ATOM_FIELDS) | set(SYSTEM_FIELDS) | history | {"nan_flags"} | symmetry
    for name in ("positions", "forces", "cell", "stress", "energy", "stage_pressure"):
        assert torch.equal(getattr(memory.batch, name), getattr(stored.batch, name)), name
    a, b = memory.to_pandas(), stored.to_pandas()
    assert a.drop(columns="source_file").equals(b.drop(columns="source_file"))
    for x, y in zip(memory.to_atoms(), stored.to_atoms()):
        assert np.array_equal(x.cell.array, y.cell.array) and x.info == y.info


# ------------------------------------------------------------------ pipeline, resume
@pytest.mark.slow  # (cells through a two-rank pipeline stay fast in test_npt's
# relax | NPT pipelines, which equal their fused runs too)
@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_pipeline_fire_cell_then_langevin_equals_fused_run() -> None:
    systems = crystals()  # 4 of 32 atoms, 2 of 8: refills on both ranks
    plan = (cell_relax(fmax=0.01, max_steps=40), md())

    def sampler() -> SizeAwareSampler:
        return SizeAwareSampler(systems, max_atoms=72)

    fused = al.Simulator(model=lj(), stages=plan[0] + plan[1], sync_every=5).run(sampler())
    piped = al.Simulator(
        model=lj(), stages=plan[0] | plan[1], strategy="pipeline", devices=2,
        start_method="fork", sync_every=5, timeout=60.0,
        buffer=BufferConfig(num_systems=4, num_atoms=72),
    ).run(sampler())  # fmt: skip
    got, ref = piped.batch, fused.batch
    assert got.system_id.tolist() == ref.system_id.tolist() == list(range(len(systems)))
    for name in ("positions", "velocities", "forces"):
        assert torch.equal(got.atom[name], ref.atom[name]), name
    for name in ("cell", "energy", "stage_steps", "stage_exit", "stage_energy", "stage_volume"):
        assert torch.equal(got.system[name], ref.system[name]), name
    assert torch.equal(got.stage_pressure[:, 0], ref.stage_pressure[:, 0])
    assert (got.cell != torch.tensor(np.array([a.cell for a in systems]))).any(-1).any(-1).all()


def test_resume_mid_cell_relaxation_is_bit_identical(tmp_path: Path) -> None:
    """Killed while cells relax (FIRE's cell velocities and the reference cells are in
    the batch), resumed from the checkpoint: the results equal the uninterrupted run's."""

    def make(where, extra=()):
        return al.Simulator(
            model=lj(), stages=cell_relax(fmax=1e-3, max_steps=40) + md(),
            callbacks=[Checkpoint(where, every=6), *extra], precision="64",
        )  # fmt: skip

    def sampler():
        return SizeAwareSampler(crystals(), max_atoms=80)

    ref = make(tmp_path / "a").run(sampler())
    seen = []

    def crash(ctx):
        seen.append(bool((ctx.batch.status == 0).any()))
        if ctx.step == 21:
            raise RuntimeError("crash")

    with pytest.raises(RuntimeError, match="crash"):
        make(tmp_path / "b", [LambdaCallback(HookStageEnum.AFTER_STEP, crash)]).run(sampler())
    assert seen[-1]  # cells were relaxing when it died
    resumed = make(tmp_path / "b").run(sampler(), resume=str(tmp_path / "b"))
    assert ref.steps.tolist() == resumed.steps.tolist()
    for name in ("positions", "velocities", "cell", "energy", "stress", "stage_volume"):
        assert torch.equal(getattr(ref.batch, name), getattr(resumed.batch, name)), name
