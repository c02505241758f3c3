"""The MD observables against references: ASE's get_rdf, the Einstein-Smoluchowski
diffusion coefficient of a free Langevin gas, the frequency of an Einstein crystal, and
the same functions of the stored trajectory; resume, batch independence, systems leaving
the batch, and the accelerator path (bits where construction guarantees them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from ase.geometry.rdf import get_rdf
from ase.units import fs, kB

from alchemi_lit import Simulator
from alchemi_lit.callbacks import (
    MSD,
    RDF,
    VACF,
    BlockAverages,
    Checkpoint,
    HookStageEnum,
    LambdaCallback,
    TrajectoryWriter,
    read_trajectory,
)
from alchemi_lit.core.state import Batch
from alchemi_lit.data import SizeAwareSampler
from alchemi_lit.integrators import Langevin, VelocityVerlet
from alchemi_lit.io import trajectory_analysis as ta
from alchemi_lit.io.observables_store import read_observables
from alchemi_lit.models import LennardJones
from alchemi_lit.testing import StepProbe, accelerator_path, emulated_cuda_graphs
from alchemi_lit.testing.potentials import EinsteinCrystal, FreeParticles

ARGON = 39.948


def argon(seed: int, repeat: int = 3) -> Atoms:
    atoms = bulk("Ar", "fcc", a=5.3, cubic=True).repeat(repeat)
    atoms.rattle(0.05, seed=seed)
    return atoms


def lj() -> LennardJones:
    return LennardJones(epsilon=0.0104, sigma=3.40, cutoff=7.0)


def observables(path: Path | None = None, rmax: float = 7.5, every: int = 5) -> list:
    return [
        RDF(rmax=rmax, nbins=40, pairs=[("Ar", "Ar")], every=every, path=path),
        MSD(window=3, every=every, path=path),
        VACF(window=3, every=every, path=path),
        BlockAverages(("energy", "temperature", "volume"), every=every, path=path),
    ]


def test_lj_argon_rdf_equals_ase_and_the_stored_trajectory(tmp_path: Path) -> None:
    """RDF accumulated during a Langevin run of LJ argon equals ASE's get_rdf of the
    frames the TrajectoryWriter stored (every 5 steps, the same states) to 1e-10, and so
    do the functions of the stored trajectory for every observable; results reach the
    store and to_pandas()."""
    cbs = observables(tmp_path / "obs.zarr")
    writer = TrajectoryWriter(tmp_path / "traj.zarr", every=5)
    sim = Simulator(model=lj(), stages=Langevin(dt=5.0, temperature=80.0, steps=30),
                    callbacks=[*cbs, writer], precision="64", accelerator="cpu")  # fmt: skip
    sim.run([argon(0), argon(1)])
    rdf, msd, vacf, avg = cbs
    for sid in (0, 1):
        frames = ta.regular(read_trajectory(tmp_path / "traj.zarr", sid))
        assert len(frames) == rdf.result(sid)["samples"] == 6
        want = get_rdf(frames, 7.5, 40, no_dists=True)
        got = rdf.result(sid)
        np.testing.assert_allclose(got["g"][0], want, rtol=0, atol=1e-10)
        np.testing.assert_allclose(got["g"][1], want, rtol=0, atol=1e-10)  # Ar-Ar partial
        np.testing.assert_allclose(ta.rdf(frames, 7.5, 40)["g"][0], want, rtol=0, atol=1e-10)
        off = ta.msd(frames, window=3, timestep=5.0)
        np.testing.assert_allclose(msd.result(sid)["msd"], off["msd"], rtol=1e-10)
        assert msd.result(sid)["D"] == pytest.approx(off["D"], rel=1e-10)
        assert msd.result(sid)["D_error"] == pytest.approx(off["D_error"], rel=1e-8)
        off = ta.vacf(frames, window=3, timestep=5.0)
        np.testing.assert_allclose(vacf.result(sid)["vacf"], off["vacf"], rtol=1e-10)
        t = ta.time_average([a.info["temperature"] for a in frames])
        assert avg.result(sid)["temperature"] == pytest.approx(t.mean, rel=1e-12)
        assert avg.result(sid)["temperature_error"] == pytest.approx(t.error, rel=1e-8)
    stored = read_observables(tmp_path / "obs.zarr", "rdf")
    assert sorted(stored["system_id"].tolist()) == [0, 1] and stored["g"].shape == (2, 2, 40)
    assert stored["meta"]["rmax"] == 7.5
    table = msd.to_pandas()
    assert table["system_id"].tolist() == [0, 1] and {"D", "D_error"} <= set(table)



def test_rdf_under_a_barostat_normalises_each_frame_at_its_own_volume(tmp_path: Path) -> None:
    """Under C-rescale NPT the cell changes every step: each sample is normalised at its
    frame's volume (the run keeps the normalisation only while the cell is unchanged),
    so the RDF is the mean of ASE's get_rdf over the stored frames."""
    from alchemi_lit.integrators import CRescale

    rdf = RDF(rmax=6.0, nbins=30, every=2)
    writer = TrajectoryWriter(tmp_path / "traj.zarr", every=2)
    stage = CRescale(dt=5.0, temperature=80.0, pressure_gpa=1.0, taut=50.0, taup=200.0,
                     steps=12)  # fmt: skip
    Simulator(model=lj(), stages=stage, callbacks=[rdf, writer], precision="64",
              accelerator="cpu").run([argon(3)])  # fmt: skip
    frames = ta.regular(read_trajectory(tmp_path / "traj.zarr", 0))
    volumes = [f.get_volume() for f in frames]
    assert len(frames) == rdf.result(0)["samples"] and max(volumes) - min(volumes) > 1e-3
    want = np.mean([get_rdf(f, 6.0, 30, no_dists=True) for f in frames], axis=0)
    np.testing.assert_allclose(rdf.result(0)["g"][0], want, rtol=0, atol=1e-10)


def test_a_free_langevin_gas_diffuses_at_kt_over_m_gamma() -> None:
    """Zero forces under Langevin: D = kT/(m gamma) (Einstein-Smoluchowski) within the
    stated error (3 sigma of the mean over 8 systems of independent windows); BAOAB's
    discrete D differs by (gamma dt/2) coth(gamma dt/2) = 1 + 2e-4 here.  The error must
    be small enough for the test to mean something."""
    rng = np.random.default_rng(3)
    gas = [Atoms("Ar32", positions=rng.uniform(0, 30, (32, 3)), cell=[30] * 3, pbc=True)
           for _ in range(8)]  # fmt: skip
    friction, temperature = 0.005, 300.0
    msd = MSD(window=50, fit=(0.25, 1.0), every=8)
    stage = Langevin(dt=10.0, temperature=temperature, friction=friction, steps=3200)
    Simulator(model=FreeParticles(), stages=stage, callbacks=[msd], precision="64",
              accelerator="cpu").run(gas)  # fmt: skip
    table = msd.to_pandas()
    assert (table["windows"] == 8).all()
    d_true = kB * temperature / ARGON / friction * fs**2  # Å^2/fs
    mean = table["D"].mean()
    error = np.sqrt((table["D_error"] ** 2).sum()) / len(table)
    assert error < 0.1 * d_true
    assert abs(mean - d_true) < 3 * error, (mean, d_true, error)


def test_the_vdos_of_an_einstein_crystal_peaks_at_its_frequency() -> None:
    """Atoms on springs k in NVE: the VACF is <v^2> cos(w t) (w = sqrt(k/m); velocity
    Verlet's own frequency (2/dt) asin(w dt/2) differs by 1e-3 here) and the VDOS peaks in
    the bin of w / 2 pi."""
    period = 200.0  # fs
    omega = 2 * np.pi / period  # 1/fs
    k = ARGON * (omega / fs) ** 2  # eV/Å^2
    a = 4.0
    sites = np.array([[i, j, l] for i in range(3) for j in range(3) for l in range(3)]) * a
    crystal = Atoms("Ar27", positions=sites, cell=[3 * a] * 3, pbc=True)
    vacf = VACF(window=200, every=2)
    stage = VelocityVerlet(dt=2.0, temperature=50.0, steps=800)
    Simulator(model=EinsteinCrystal(k=k, a=a), stages=stage, callbacks=[vacf],
              precision="64", accelerator="cpu").run([crystal])  # fmt: skip
    r = vacf.result(0)
    assert r["windows"] == 2
    c = r["vacf"] / r["vacf"][0]
    np.testing.assert_allclose(c, np.cos(omega * r["t"]), atol=0.02)
    nu = omega / (2 * np.pi) * 1e3  # THz
    peak = r["frequency"][np.argmax(r["vdos"])]
    assert abs(peak - nu) <= r["frequency"][1]


def run_set(systems, ids, folder: Path | None = None, extra=(), resume=False, **kw):
    cbs = observables(rmax=5.0, every=2)
    checkpoint = [Checkpoint(folder, every=10)] if folder is not None else []
    sim = Simulator(model=lj(), stages=Langevin(dt=5.0, temperature=80.0, steps=20),
                    callbacks=[*cbs, *checkpoint, *extra], sync_every=5, precision="64",
                    accelerator="cpu", **kw)  # fmt: skip
    data = Batch.from_atoms(systems, system_ids=ids) if ids is not None else systems
    sim.run(data, resume=str(folder) if resume else None)
    return cbs


def assert_same(a: list, b: list, sid: int) -> None:
    for x, y in zip(a, b):
        rx, ry = x.result(sid), y.result(sid)
        assert rx.keys() == ry.keys()
        for key in rx:
            np.testing.assert_array_equal(rx[key], ry[key], err_msg=f"{x.name} {key}")


def test_alone_in_a_batch_inflight_and_resumed_the_bits_are_the_same(tmp_path: Path) -> None:
    """Each system's observables do not depend on its batch mates or on a crash and
    resume from a checkpoint (the sums are batch fields); with systems leaving the batch
    and others joining, each gets its results when it finishes (one joining late is
    sampled at the loop steps that are multiples of every, as TrajectoryWriter writes
    frames: other states than alone, as many samples)."""
    systems = [argon(0, 2), argon(1, 2), argon(2, 2)]
    whole = run_set(systems, None, tmp_path / "whole")
    alone = run_set([systems[1]], [1])
    assert_same(whole, alone, 1)
    inflight = run_set(SizeAwareSampler(systems, max_atoms=64), None)
    for sid in (0, 1):  # the first batch
        assert_same(whole, inflight, sid)
    late = [cb.result(2) for cb in inflight]
    assert late[0]["samples"] == whole[0].result(2)["samples"] == 10
    assert late[0]["rejected"] == 0 and np.isfinite(late[0]["g"]).all()
    assert np.isfinite(late[1]["D"]) and np.isfinite(late[3]["energy"])

    class Crash(Exception):
        pass

    def crash(ctx) -> None:
        if ctx.step == 15:
            raise Crash

    with pytest.raises(Crash):
        stop = LambdaCallback(HookStageEnum.AFTER_STEP, crash)
        run_set(systems, None, tmp_path / "crashed", [stop])
    resumed = run_set(systems, None, tmp_path / "crashed", resume=True)
    for sid in range(3):
        assert_same(whole, resumed, sid)


def accelerated(graphs: bool, probe: StepProbe | None = None, steps: int = 12) -> list:
    cbs = [RDF(rmax=4.5, nbins=10, every=1), MSD(window=4, every=1),
           VACF(window=4, every=1), BlockAverages(("energy",), every=1)]  # fmt: skip
    sim = Simulator(model=lj(), stages=Langevin(dt=5.0, temperature=80.0, steps=steps),
                    callbacks=[*cbs, *([probe] if probe else [])], sync_every=6,
                    precision="64", accelerator="cpu", cuda_graphs=graphs)  # fmt: skip
    sim.run([argon(0, 2), argon(1, 2)])
    return cbs


def test_on_the_accelerator_path_a_sample_reads_nothing_on_the_host() -> None:
    """Under accelerator_path() steps where every observable samples (every=1) read
    nothing on the host outside bookkeeping (which reads the finished systems' sums)."""
    probe = StepProbe()
    with accelerator_path(), probe:
        accelerated(False, probe, steps=6)
    assert probe.share_without_reads() >= 0.5, probe.where


def test_emulated_cuda_graphs_replay_the_observables_bit_for_bit() -> None:
    """With every=1 the observables are graph_safe: captured with the step, their
    replays give the eager bits."""
    with accelerator_path():
        eager = accelerated(False)
        with emulated_cuda_graphs() as backends:
            graphed = accelerated(True)
    assert sum(b.captures for b in backends) >= 1
    for sid in (0, 1):
        assert_same(eager, graphed, sid)


def test_each_shard_of_a_job_array_writes_its_own_observables_store() -> None:
    """--shard i/n renames an observable's store as it renames sinks and trajectories."""
    from alchemi_lit.cli.build import shard_outputs

    entry = {"class_path": "alchemi_lit.callbacks.RDF",
             "init_args": {"rmax": 5.0, "path": "out/obs.zarr"}}  # fmt: skip
    shard_outputs({"simulator": {"callbacks": [entry]}}, "1/4")
    assert entry["init_args"]["path"] == str(Path("out/obs.shard-1-of-4.zarr"))


def test_a_plan_without_md_samples_nothing_and_bad_stages_are_refused() -> None:
    """Without an MD stage (a relax rank of a pipeline) an observable samples nothing;
    stages naming no stage of the plan are refused before the run."""
    from alchemi_lit.core.errors import ConfigError
    from alchemi_lit.integrators import FIRE

    msd = MSD(window=3, every=1)
    Simulator(model=lj(), stages=FIRE(fmax=0.05, max_steps=5), callbacks=[msd],
              precision="64", accelerator="cpu").run([argon(0, 2)])  # fmt: skip
    assert msd.system_ids == []
    with pytest.raises(ConfigError, match="stages"):
        Simulator(model=lj(), stages=Langevin(dt=2.0, steps=3), precision="64",
                  callbacks=[MSD(window=3, stages=[2])]).run([argon(0, 2)])  # fmt: skip


@pytest.mark.slow
def test_a_pipeline_writes_every_systems_observables_to_the_store(tmp_path: Path) -> None:
    """relax | md on two forked ranks: the md rank samples and writes every system's
    results to the store once (the in-memory results stay in the rank's process), as
    many samples as the fused run (their loop-step phase may differ: other states)."""
    from alchemi_lit.integrators import FIRE

    def plan(pipeline: bool):
        relax, md = FIRE(fmax=0.05, max_steps=20), Langevin(dt=4.0, temperature=60.0, steps=12)
        return (relax | md) if pipeline else (relax + md)

    systems = [argon(k, 2) for k in range(4)]
    stores = {}
    for pipeline in (False, True):
        stores[pipeline] = tmp_path / f"msd-{pipeline}.zarr"
        kw = {"strategy": "pipeline", "devices": 2, "start_method": "fork"} if pipeline else {}
        msd = MSD(window=3, every=2, path=stores[pipeline])
        Simulator(model=lj(), stages=plan(pipeline), precision="64", accelerator="cpu",
                  callbacks=[msd], **kw).run(systems)  # fmt: skip
    fused, piped = (read_observables(stores[p], "msd") for p in (False, True))
    order = [np.argsort(d["system_id"]) for d in (fused, piped)]
    assert piped["system_id"][order[1]].tolist() == [0, 1, 2, 3]
    assert piped["samples"][order[1]].tolist() == fused["samples"][order[0]].tolist()
    assert (piped["windows"] >= 1).all() and np.isfinite(piped["msd"]).all()
