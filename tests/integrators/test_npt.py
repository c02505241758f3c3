"""NPT integrators step for step against references, and through every way a system runs.

* ``MTKNPT`` against ASE's ``IsotropicMTKNPT`` / ``MTKNPT`` (deterministic: the same
  initial velocities and parameters) and ``NPTLangevin`` against ASE's ``LangevinBAOAB``
  with ``externalstress`` (fed our keyed normals through a stand-in ``rng``): positions
  and cells within 1e-8 Å after each of 50 steps (the cells move by 0.17-0.8 Å in them,
  the test asks for 0.02), float64, per-system pressures and time steps, the systems in
  the batch in reverse ``system_id`` order (a parameter gathered by row shows).
* ``CRescale`` against a NumPy transcription of the authors' reference code (SimpleMD of
  ``bussilab/crescale``, time-reversible scheme with velocity scaling) run on ASE's
  Lennard-Jones with ASE's ``Bussi`` thermostat, the same normals.
* A system's NPT path alone equals its path in a batch of 16 (noise included); a fused
  ``relax cell + NPT + relax cell`` equals the three run one after another, and a 2-rank
  pipeline ``relax cell | NPT``; kill and resume mid-NPT is bit for bit.
The ensembles are checked in ``test_npt_ensembles.py``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.linalg
import torch
from ase import units
from ase.md.bussi import Bussi as AseBussi
from ase.md.langevinbaoab import LangevinBAOAB
from ase.md.nose_hoover_chain import MTKNPT as AseMTKNPT
from ase.md.nose_hoover_chain import IsotropicMTKNPT
from test_md import SEED, BussiNoise, Recorder, moving_argon, our_atom_normals

import alchemi_lit as al
from alchemi_lit.core import random as rng
from alchemi_lit.core.errors import ConfigError, UnitWarning
from alchemi_lit.core.state import Batch
from alchemi_lit.engine.hooks import Callback
from alchemi_lit.integrators import LBFGS, MTKNPT, CellFilter, CRescale, Langevin, NPTLangevin
from alchemi_lit.integrators.ops import system_normals
from alchemi_lit.models import LennardJones
from alchemi_lit.testing import accelerator_path
from alchemi_lit.testing.integrators import argon, check_masked_systems_untouched
from conftest import AR_EPSILON, AR_SIGMA, AseLJ, perturbed_argon, strained, triclinic_argon

STEPS = 50  # 250 fs: every cell moves 0.17-0.8 Å (`it moved` asks 0.02); ASE is the cost
PRESSURES = [0.3, 0.02]  # GPa, per system_id
DTS = [5.0, 4.0]  # fs, per system_id
CUTOFF = 6.0  # Å: ASE's Lennard-Jones is most of these tests' time


def lj_model() -> LennardJones:
    return LennardJones(AR_EPSILON, AR_SIGMA, CUTOFF)


def ase_lj() -> AseLJ:
    return AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=CUTOFF)


def npt_systems(isotropic: bool) -> list:
    """Two moving 32-atom argon crystals; sheared ones for full-cell dynamics."""
    systems = moving_argon(2, temperature=60.0, seed=1)
    if not isotropic:
        systems = [strained(a, seed=5 + k, amount=0.03) for k, a in enumerate(systems)]
    return systems


def simulate(systems, stage, callbacks=(), **kwargs) -> tuple[al.Results, Recorder]:
    """Run ``systems`` (``system_id`` k for ``systems[k]``) in reverse order: row and
    ``system_id`` differ."""
    rec = Recorder(("positions", "cell"))
    ids = list(range(len(systems)))[::-1]
    systems = Batch.from_atoms([systems[k] for k in ids], system_ids=ids)
    sim = al.Simulator(
        model=kwargs.pop("model", None) or lj_model(), stages=stage, precision="64", seed=SEED,
        sync_every=1, callbacks=[rec, *callbacks], **kwargs,
    )  # fmt: skip
    return sim.run(systems), rec


def compare(systems, rec, make_dyn) -> float:
    """Run ASE's dynamics on each system and check positions and cell after every step."""
    worst = 0.0
    for k, atoms in enumerate(systems):
        atoms = atoms.copy()
        atoms.calc = ase_lj()
        dyn = make_dyn(k, atoms)
        frames = rec.data[k]
        assert sorted(frames) == list(range(1, STEPS + 1))
        for t in sorted(frames):
            dyn.run(1)
            dev = max(
                np.abs(atoms.positions - frames[t]["positions"]).max(),
                np.abs(atoms.cell.array - frames[t]["cell"]).max(),
            )
            assert dev < 1e-8, (k, t, dev)
            worst = max(worst, dev)
        assert np.abs(atoms.cell.array - systems[k].cell.array).max() > 0.02  # it moved
    return worst


def for_this_test(context, request) -> None:
    """Enter ``context`` until the test ends."""
    context.__enter__()
    request.addfinalizer(lambda: context.__exit__(None, None, None))


# ---------------------------------------------------------------------- MTK vs ASE
@pytest.mark.parametrize(
    ("isotropic", "kernels_on"), [(True, True), (False, False)], ids=["isotropic", "full-torch"]
)
def test_mtk_matches_ase(isotropic: bool, kernels_on: bool, request) -> None:
    if not kernels_on:  # the accelerators' path
        for_this_test(accelerator_path(), request)
    systems = npt_systems(isotropic)
    stage = MTKNPT(
        dt=DTS, temperature=80.0, pressure_gpa=PRESSURES, tdamp=50.0, pdamp=200.0,
        isotropic=isotropic, tchain=3, pchain=2, ploop=2, steps=STEPS,
    )  # fmt: skip
    conserved = {}

    def record(ctx) -> None:  # the extended energy, by system_id
        b = ctx.batch
        conserved[int(ctx.step)] = stage.conserved_energy(b)[b.system_id.argsort()]

    probe = al.engine.hooks.LambdaCallback(al.engine.hooks.HookStageEnum.AFTER_STEP, record)
    _, rec = simulate(systems, stage, callbacks=[probe])
    ase_class = IsotropicMTKNPT if isotropic else AseMTKNPT
    dyns = []

    def make(k, atoms):
        dyns.append(ase_class(
            atoms, DTS[k] * units.fs, 80.0, PRESSURES[k] * units.GPa, tdamp=50.0 * units.fs,
            pdamp=200.0 * units.fs, tchain=3, pchain=2, ploop=2,
        ))  # fmt: skip
        return dyns[-1]

    worst = compare(systems, rec, make)
    ours = conserved[max(conserved)]  # the extended energy, as ASE defines it
    assert np.allclose([d.get_conserved_energy() for d in dyns], ours.numpy(), atol=1e-9)
    print(f"MTK {'isotropic' if isotropic else 'full'}: worst deviation {worst:.1e} Å")


# ---------------------------------------------------------------------- Langevin vs ASE
class BarostatNoise:
    """Stands in for ASE's ``rng``: our atoms' Langevin noise and the cell's normals."""

    def __init__(self, atoms, system_id: int) -> None:
        self.batch = Batch.from_atoms([atoms], system_ids=[system_id])
        self.n, self.system_id, self.step = len(atoms), system_id, 0

    def normal(self, size=None):
        if size == (self.n, 3):
            return our_atom_normals(self.n, self.system_id, self.step, rng.PURPOSE_NOISE)
        self.batch.total_steps = torch.tensor([self.step])
        z = system_normals(self.batch, SEED, rng.PURPOSE_BAROSTAT, 9)[0].numpy()
        self.step += 1  # the cell's draw closes ASE's step
        return z[0] if size is None else z.reshape(3, 3)


def trace_on_diagonal(dyn: LangevinBAOAB):
    """The MTK drag ``(p + tr(p)/Nf I)/W``: ASE 3.29 adds ``tr(p)/Nf`` to every entry of
    the full-cell matrix (``p_eps + trace``), a slip the isotropic case does not make; we
    follow the equations of motion and hand ASE the same correction."""
    return lambda: (dyn.p_eps + np.trace(dyn.p_eps) / dyn.Ndof * np.eye(3)) / dyn.barostat_mass


@pytest.mark.parametrize("isotropic", [True, False], ids=["isotropic", "full"])
def test_npt_langevin_matches_ase_with_the_same_noise(isotropic: bool, request) -> None:
    if not isotropic:  # full cell: the accelerators' path
        for_this_test(accelerator_path(), request)
    systems = npt_systems(isotropic)
    mass = None if isotropic else [2.0e5, 4.0e5]  # eV fs² (else ASE's heuristic)
    stage = NPTLangevin(
        dt=DTS, temperature=80.0, pressure_gpa=PRESSURES, friction=0.02, pdamp=300.0,
        barostat_mass=mass, isotropic=isotropic, steps=STEPS,
    )  # fmt: skip
    _, rec = simulate(systems, stage)

    def make(k, atoms):
        dyn = LangevinBAOAB(
            atoms, DTS[k] * units.fs, temperature_K=80.0, externalstress=-PRESSURES[k] * units.GPa,
            hydrostatic=isotropic, T_tau=50.0 * units.fs, P_tau=300.0 * units.fs,
            P_mass=None if mass is None else mass[k] * units.fs**2, rng=0,
        )  # fmt: skip
        dyn.rng = BarostatNoise(atoms, k)
        if not isotropic:
            dyn._barostat_BAOAB_OU_gamma_mod = trace_on_diagonal(dyn)
        return dyn

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # ASE's note on its P_mass heuristic
        worst = compare(systems, rec, make)
    print(f"NPTLangevin {'isotropic' if isotropic else 'full'}: worst deviation {worst:.1e} Å")


# ---------------------------------------------------------------------- C-rescale
def crescale_reference(atoms, system_id: int, steps: int, isotropic: bool, **p) -> list:
    """The authors' time-reversible C-rescale (SimpleMD, ``barotype`` I or T, with
    ``baroscalev``) for one system, in NumPy, on ASE's LJ; the thermostat is ASE's Bussi
    (once per step over dt, as ours).  The Padé exponential of SimpleMD is scipy's
    ``expm`` here.  Returns positions and cell after every step."""
    dt, kt = p["dt"] * units.fs, units.kB * p["temperature"]
    p0, beta, tau = p["pressure_gpa"] * units.GPa, p["compressibility"] / units.GPa, p["taup"]
    tau *= units.fs
    thermostat = AseBussi(atoms, dt, p["temperature"], p["taut"] * units.fs,
                          rng=BussiNoise(atoms, system_id))  # fmt: skip
    noise = Batch.from_atoms([atoms], system_ids=[system_id])
    m = atoms.get_masses()[:, None]
    frames = []
    for step in range(steps):
        thermostat.scale_velocities()
        v = atoms.get_velocities() + 0.5 * dt * atoms.get_forces() / m
        noise.total_steps = torch.tensor([step])
        z = system_normals(noise, SEED, rng.PURPOSE_BAROSTAT, 11)[0].numpy()
        volume = atoms.get_volume()
        lam = np.sqrt(volume)
        pint = -atoms.get_stress(voigt=False) + (m * v).T @ v / volume
        lam_d = 0.25 * kt * beta / tau
        lam_f = -2.0 * lam * (p0 - np.trace(pint) / 3.0 - 0.5 * kt / volume)
        if isotropic:
            dlam = lam_d / kt * lam_f * dt + np.sqrt(2.0 * lam_d * dt) * z[0]
            rscaling = np.eye(3) * np.exp(2.0 * np.log1p(dlam / lam) / 3.0)
        else:
            dlam = lam_d / kt * lam_f * dt / 2.0 + np.sqrt(lam_d * dt) * z[0]
            prefac = -beta / (3.0 * tau)
            b = np.sqrt(-2.0 * prefac * kt / (lam + dlam) ** 2)
            a = prefac * (p0 * np.eye(3) - pint - kt / volume * np.eye(3))
            a2 = a - np.trace(a) / 3.0 * np.eye(3)
            xi = z[2:11].reshape(3, 3)
            xi2 = xi - np.trace(xi) / 3.0 * np.eye(3)
            rscaling = rotate_back_box(scipy.linalg.expm(a2 * dt + b * xi2 * np.sqrt(dt)))
            dlam += lam_d / kt * lam_f * dt / 2.0 + np.sqrt(lam_d * dt) * z[1]
            rscaling *= ((lam + dlam) ** 2 / volume) ** (1.0 / 3.0)
        vscaling = np.linalg.inv(rscaling)
        positions = atoms.positions @ rscaling + (v @ vscaling.T + v @ rscaling) * dt / 2.0
        atoms.set_cell(atoms.cell.array @ rscaling, scale_atoms=False)
        atoms.positions = positions
        v = v @ vscaling.T
        atoms.set_velocities(v + 0.5 * dt * atoms.get_forces() / m)
        frames.append((atoms.positions.copy(), atoms.cell.array.copy()))
    return frames


def rotate_back_box(r: np.ndarray) -> np.ndarray:
    """SimpleMD's ``rotate_back_box``: the lower-triangular box of the same shape."""
    out = np.zeros((3, 3))
    out[0, 0] = np.linalg.norm(r[0])
    out[1, 0] = r[0] @ r[1] / out[0, 0]
    out[1, 1] = np.sqrt(r[1] @ r[1] - out[1, 0] ** 2)
    out[2, 0] = r[0] @ r[2] / out[0, 0]
    out[2, 1] = (r[1] @ r[2] - out[2, 0] * out[1, 0]) / out[1, 1]
    out[2, 2] = np.sqrt(r[2] @ r[2] - out[2, 0] ** 2 - out[2, 1] ** 2)
    return out


@pytest.mark.parametrize("isotropic", [True, False], ids=["isotropic", "anisotropic"])
def test_crescale_matches_the_reference_scheme_with_the_same_noise(
    isotropic: bool, request
) -> None:
    if not isotropic:  # anisotropic: the accelerators' path
        for_this_test(accelerator_path(), request)
    systems = npt_systems(isotropic)
    params = dict(temperature=80.0, taut=40.0, taup=200.0, compressibility=2.0)
    stage = CRescale(dt=DTS, pressure_gpa=PRESSURES, isotropic=isotropic, steps=STEPS, **params)
    _, rec = simulate(systems, stage)
    for k, atoms in enumerate(systems):
        atoms = atoms.copy()
        atoms.calc = ase_lj()
        ref = crescale_reference(
            atoms, k, STEPS, isotropic, dt=DTS[k], pressure_gpa=PRESSURES[k], **params
        )
        for t, (positions, cell) in enumerate(ref, start=1):
            frame = rec.data[k][t]
            dev = max(np.abs(positions - frame["positions"]).max(),
                      np.abs(cell - frame["cell"]).max())  # fmt: skip
            assert dev < 1e-8, (k, t, dev)
        assert np.abs(cell - systems[k].cell.array).max() > 0.02


MASKED = {
    "mtk": lambda: MTKNPT(dt=2.0, temperature=60.0),
    "mtk-full": lambda: MTKNPT(dt=2.0, temperature=60.0, isotropic=False),
    "c-rescale": lambda: CRescale(dt=2.0, temperature=60.0),
    "c-rescale-full": lambda: CRescale(dt=2.0, temperature=60.0, isotropic=False),
    "langevin": lambda: NPTLangevin(dt=2.0, temperature=60.0),
    "langevin-full": lambda: NPTLangevin(dt=2.0, temperature=60.0, isotropic=False),
}


@pytest.mark.parametrize("name", list(MASKED))
def test_a_step_leaves_the_systems_outside_the_mask_untouched(name, code_path) -> None:
    """Several stages share a batch: an NPT step moves the atoms, cells and barostat
    fields of its mask's systems only, on either code path (the CPU's torch updates skip
    the atom mask when the whole batch is theirs)."""
    check_masked_systems_untouched(MASKED[name](), lj_model(), argon())


# ---------------------------------------------------------------------- batching
class Path_(Callback):
    """Positions and cell of system ``sid`` after every step it took."""

    def __init__(self, sid: int) -> None:
        super().__init__()
        self.sid, self.frames = sid, {}

    def after_step(self, ctx) -> None:
        b = ctx.batch
        rows = (b.system_id == self.sid).nonzero().flatten().tolist()
        if rows:
            t, (lo, hi) = int(b.total_steps[rows[0]]), b.ptr[rows[0] : rows[0] + 2].tolist()
            self.frames.setdefault(t, (b.positions[lo:hi].clone(), b.cell[rows[0]].clone()))

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        ts = sorted(self.frames)
        return (torch.stack([self.frames[t][0] for t in ts]),
                torch.stack([self.frames[t][1] for t in ts]))  # fmt: skip


def sixteen() -> list:
    """16 periodic argon crystals of 32 and 108 atoms, cubic and triclinic, some moving."""
    systems = perturbed_argon(10, 2, 0.08, seed=20) + perturbed_argon(3, 3, 0.08, seed=21)
    systems += [triclinic_argon(2, 0.05, 0.05, seed=22 + k) for k in range(3)]
    gen = np.random.default_rng(23)
    for k, atoms in enumerate(systems):
        if k % 3 == 1:  # arrives moving; the others get Maxwell-Boltzmann velocities
            atoms.set_momenta(gen.normal(scale=0.2, size=(len(atoms), 3)))
    return [systems[k] for k in gen.permutation(16)]


TS = [40.0 + 4.0 * k for k in range(16)]  # per system_id
PS = [0.05 * (k % 5) for k in range(16)]
BATCHED = {
    "mtk": lambda: MTKNPT(dt=5.0, temperature=TS, pressure_gpa=PS, pdamp=300.0, steps=30),
    "mtk-full": lambda: MTKNPT(
        dt=5.0, temperature=60.0, pressure_bar=1000.0, pdamp=300.0, isotropic=False, steps=30
    ),
    "c-rescale": lambda: CRescale(
        dt=5.0, temperature=TS, pressure_gpa=PS, taup=100.0, compressibility=1.0, steps=30
    ),
    "c-rescale-full": lambda: CRescale(
        dt=5.0, temperature=60.0, pressure_gpa=PS, taup=100.0, isotropic=False, steps=30
    ),
    "langevin": lambda: NPTLangevin(dt=5.0, temperature=TS, pressure_gpa=PS, pdamp=200.0, steps=30),
    "langevin-full": lambda: NPTLangevin(
        dt=5.0, temperature=60.0, pressure_gpa=0.1, pdamp=200.0, isotropic=False, steps=30
    ),
}


@pytest.mark.parametrize("name", list(BATCHED))
def test_a_system_alone_follows_its_path_in_a_batch_of_16(name: str) -> None:
    systems, target = sixteen(), 11

    def path(atoms, ids):
        rec = Path_(target)
        sim = al.Simulator(model=lj_model(), stages=BATCHED[name](), precision="64", seed=4,
                           sync_every=7, callbacks=[rec])  # fmt: skip
        sim.run(Batch.from_atoms(atoms, system_ids=ids))
        return rec.stacked()

    in_batch = path(systems, list(range(16)))
    alone = path([systems[target]], [target])
    assert len(in_batch[0]) == 30
    for a, b in zip(alone, in_batch):
        assert torch.equal(a, b)
    assert float((in_batch[1][-1] - in_batch[1][0]).abs().max()) > 1e-3  # the cell moved


# ---------------------------------------------------------------------- plans and runs
def relax(pressure: float = 0.0):
    return LBFGS(fmax=0.01, max_steps=25, cell=CellFilter("frechet", pressure_gpa=pressure))


def npt():
    return NPTLangevin(dt=5.0, temperature=60.0, pressure_gpa=0.2, pdamp=200.0,
                       isotropic=False, steps=40)  # fmt: skip


def crystals() -> list:
    return [*perturbed_argon(3, 2, 0.08, seed=30), triclinic_argon(2, 0.05, 0.05, seed=31)]


def run(plan, systems, **kwargs) -> al.Results:
    sim = al.Simulator(model=lj_model(), stages=plan, precision="64", seed=6, sync_every=4,
                       **kwargs)  # fmt: skip
    return sim.run(systems)


def assert_same_results(a: al.Results, b: al.Results) -> None:
    assert a.batch.system_id.tolist() == b.batch.system_id.tolist()
    assert a.steps.tolist() == b.steps.tolist()
    for name in ("positions", "velocities", "cell", "energy", "stress", "total_steps"):
        assert torch.equal(getattr(a.batch, name), getattr(b.batch, name)), name


def test_fused_relax_npt_relax_equals_the_stages_run_one_after_another() -> None:
    fused = run(relax() + npt() + relax(0.2), crystals())
    first = run(relax(), crystals())
    second = run(npt(), first.to_atoms())  # results carry their step counts (the noise keys)
    third = run(relax(0.2), second.to_atoms())
    assert_same_results(fused, third)
    assert [int(s) for s in fused.batch.stage_steps[:, 1]] == [40] * 4


def crescale():
    return CRescale(dt=5.0, temperature=60.0, pressure_gpa=0.2, taup=100.0, isotropic=False,
                    steps=40)  # fmt: skip


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "npt_stage",
    [crescale, npt],
    ids=["c-rescale", "langevin"],
)
def test_two_rank_pipeline_relax_then_npt_equals_the_fused_run(npt_stage) -> None:
    from alchemi_lit.strategies.buffers import BufferConfig

    fused = run(relax() + npt_stage(), crystals())
    piped = run(
        relax() | npt_stage(), crystals(), strategy="pipeline", devices=2, start_method="fork",
        timeout=60.0, buffer=BufferConfig(num_systems=4, num_atoms=200),
    )  # fmt: skip
    assert_same_results(fused, piped)


def test_kill_and_resume_mid_npt_is_bit_for_bit(tmp_path) -> None:
    from alchemi_lit.callbacks import Checkpoint
    from alchemi_lit.engine.hooks import HookStageEnum, LambdaCallback

    def plan():
        return (MTKNPT(dt=5.0, temperature=60.0, pressure_gpa=0.2, pdamp=200.0, isotropic=False,
                       steps=30)
                + CRescale(dt=5.0, temperature=60.0, pressure_gpa=0.2, taup=100.0, steps=30)
                + npt())  # fmt: skip

    reference = run(plan(), crystals())

    def crash(ctx):
        if ctx.step == 47:  # inside C-rescale, chains and cell momenta of MTK behind
            raise RuntimeError("killed")

    where = str(tmp_path / "ckpt")
    with pytest.raises(RuntimeError, match="killed"):
        killer = LambdaCallback(HookStageEnum.AFTER_STEP, crash)
        run(plan(), crystals(), callbacks=[Checkpoint(where, every=10), killer])
    sim = al.Simulator(model=lj_model(), stages=plan(), precision="64", seed=6, sync_every=4,
                       callbacks=[Checkpoint(where, every=10)])  # fmt: skip
    assert_same_results(reference, sim.run(crystals(), resume=where))


# ---------------------------------------------------------------------- input
def test_bad_parameters_are_refused_or_warned_about() -> None:
    with pytest.raises(ConfigError, match="pressure_gpa or pressure_bar, not both"):
        MTKNPT(pressure_gpa=1.0, pressure_bar=1.0)
    with pytest.raises(ConfigError, match=r"pressure_gpa=1\.0"):
        CRescale(pressure_gpa="1 GPa")
    with pytest.raises(ConfigError, match=r"temperature must be > 0 K.*proportional to kT"):
        MTKNPT(temperature=0.0)  # (NPTLangevin and CRescale quench: test_thermostats)
    with pytest.raises(ConfigError, match="isotropic"):
        MTKNPT(isotropic="yes")
    with pytest.warns(UnitWarning, match="bar"):
        MTKNPT(pressure_gpa=5000.0)  # 5 kbar meant
    with pytest.warns(UnitWarning, match="1/bar"):
        CRescale(compressibility=4.5e-5)  # water's, per bar
    assert MTKNPT(pressure_bar=10_000.0).pressure == pytest.approx(units.GPa)


def test_systems_without_a_periodic_cell_or_with_fixed_atoms_are_refused() -> None:
    from ase.constraints import FixAtoms

    from conftest import cluster_argon

    pinned = perturbed_argon(1, 2, seed=1)[0]
    pinned.set_constraint(FixAtoms(indices=[0]))
    for bad, why in ((cluster_argon(13, seed=2), "periodic"), (pinned, "fixed atoms")):
        with pytest.raises(ConfigError, match=why):
            run(CRescale(steps=2), [perturbed_argon(1, 2, seed=3)[0], bad])


# ---------------------------------------------------------------------- callbacks
def test_thermo_monitor_and_logger_report_pressure_and_volume(capsys) -> None:
    from loguru import logger

    from alchemi_lit.callbacks import Logger, ThermoMonitor

    nvt, both = ThermoMonitor(every=5), ThermoMonitor(every=5)
    run(Langevin(dt=5.0, temperature=60.0, steps=10), crystals()[:2], callbacks=[nvt])
    assert np.isnan(nvt.series(0)["P"]).all()  # no stress computed: no pressure
    assert np.isfinite(nvt.series(0)["V"]).all()
    sink = logger.add(lambda m: print(m, end=""), level="INFO")
    try:
        plan = Langevin(dt=5.0, temperature=60.0, steps=10) + npt()
        res = run(plan, crystals()[:2], callbacks=[both, Logger(every=40)])
    finally:
        logger.remove(sink)
    assert "NPT P " in capsys.readouterr().out
    series = both.series(0)  # the stress is computed for every system, NVT stage included
    assert np.isfinite(series["P"]).all() and np.isfinite(series["V"]).all()
    atoms = res.to_atoms()[0]  # the final record against ASE's pressure of the final state
    ase_p = -np.trace(atoms.get_stress(voigt=False, include_ideal_gas=True)) / 3 / units.GPa
    assert series["P"][-1] == pytest.approx(ase_p, rel=1e-10)
    assert series["V"][-1] == pytest.approx(atoms.get_volume(), rel=1e-12)
