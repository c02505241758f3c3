"""Workload (a): FIRE relaxation and Langevin NVT of 64 argon crystals, against the peers.

Run (from the repository root; ~4-6 minutes on 2 CPU cores with every peer)::

    python bench/bench_dynamics.py                 # all frameworks
    python bench/bench_dynamics.py --no-peers      # alchemi_lit only (+ overhead, sync count)
    bash bench/setup_peers.sh                      # once: nvalchemi-toolkit's own venv

Workload: 64 fcc argon crystals of 108 atoms (a = 5.26 Å, 3x3x3 cubic cells, Gaussian
noise σ = 0.1 Å, seed 0), Lennard-Jones ε = 0.0104 eV, σ = 3.40 Å, rc = 8.5 Å,
float64, neighbour-list skin 1 Å where the framework has one, 2 torch threads.

* **FIRE**: fmax = 0.05 eV/Å, at most 500 steps, ASE's parameters (dt 0.1, dtmax 1.0
  ASE time units, maxstep 0.2 Å, Nmin 5, finc 1.1, fdec 0.5, astart 0.1, fa 0.99).
  alchemi_lit ``FIRE(mode="ase")``; TorchSim ``ts.optimize`` with its
  ``fire(md_flavor="ase_fire")`` and a force criterion (it drops converged systems
  every 5 steps); ASE ``FIRE`` one system at a time; nvalchemi ``FIRE`` (its own
  variant: mass-weighted, dt_min) with ``ConvergenceHook.from_fmax``, stepped as its
  ``run()`` does, i.e. the whole batch until every system meets the criterion.
* **NVT**: 200 Langevin steps, dt 2 fs, 60 K, friction 0.01/fs, from the same
  Maxwell-Boltzmann velocities (TorchSim draws its own at 60 K).  alchemi_lit and
  TorchSim use BAOAB, ASE its ``Langevin`` (Vanden-Eijnden-Ciccotti), nvalchemi its
  ``NVTLangevin``.

TorchSim 0.3.0's ``LennardJonesModel`` returns forces exactly 2x too large (full
neighbour list counted twice); the benchmark wraps it and **halves its forces**
(checked against ASE before timing).  nvalchemi-toolkit runs in its own virtual
environment (``bench/setup_peers.sh``; it needs numpy < 2.4) as a subprocess; if it
is absent the row says why.  ASE is timed on a subset of the systems (one system at a
time, so its cost is linear in the number of systems) and scaled to 64; the table
says so.

Columns: wall time for all 64 systems (median of repeats after a warm-up; ASE:
scaled), steps per system (mean/max), **atom-steps/s** = Σ_systems atoms x steps that
system needed (for TorchSim, whose optimizer does not report per-system counts, the
ASE-algorithm counts of alchemi_lit, the same algorithm step for step) / wall time,
**engine atom-evals/s** = atoms passed through the model, all calls, / wall time
(includes converged systems a framework keeps stepping), systems/s, and ratios to
alchemi_lit.

Also measured for alchemi_lit: the per-step framework overhead, the mean over timed
steps of (step time − the model call inside that step) / the mean model call (means,
over whole multiples of the 8-step noise draws, so work done every few steps counts), on
the same 64-system batch (driving ``FusedLoop`` directly, default callbacks), the same
with the model's outputs replayed (the framework's operations alone), and host syncs in the step
loop (``torch.Tensor.item/tolist/__bool__/__int__/__float__/__index__/numpy``
calls inside ``FusedLoop.step`` during a real ``Simulator.run``; bookkeeping every
``sync_every`` steps excluded), with the code sites that made them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean

import numpy as np
import torch
from _nvalchemi_worker import nvalchemi_python
from common import (
    ARGON_LJ,
    HostSyncCounter,
    argon_set,
    environment_line,
    format_table,
    gate_arguments,
    gate_from,
    median,
    package_version,
    setup_threads,
    torchsim_fire,
    torchsim_force_error,
    torchsim_lj,
)

import alchemi_lit as al
from alchemi_lit import Batch
from alchemi_lit.integrators import (
    FIRE,
    FIRE2,
    Bussi,
    Langevin,
    NoseHooverChain,
    VelocityVerlet,
)
from alchemi_lit.models import LennardJones

DT = torch.float64
FMAX, MAX_STEPS = 0.05, 500
MD_STEPS, MD_DT_FS, MD_T, MD_FRICTION = 200, 2.0, 60.0, 0.01
SKIN = 1.0
HERE = Path(__file__).resolve().parent


def with_velocities(atoms_list, temperature: float, seed: int = 1):
    """Copies of the systems with Maxwell-Boltzmann velocities (zero total momentum)."""
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary

    rng = np.random.default_rng(seed)
    out = []
    for a in atoms_list:
        b = a.copy()
        MaxwellBoltzmannDistribution(b, temperature_K=temperature, rng=rng)
        Stationary(b)
        out.append(b)
    return out


class Row:
    def __init__(
        self,
        framework: str,
        task: str,
        wall: float,
        steps: list[float],
        useful: float,
        evals: float,
        n_systems: int,
        note: str = "",
    ) -> None:
        self.framework, self.task, self.wall, self.steps = framework, task, wall, steps
        self.useful, self.evals, self.n, self.note = useful, evals, n_systems, note


# --------------------------------------------------------------------------- alchemi_lit
def lj_model() -> LennardJones:
    return LennardJones(**ARGON_LJ, skin=SKIN, compute_stress=False)


def count_evals(model: torch.nn.Module) -> list[int]:
    """Attach a forward pre-hook adding the atoms of every model call to a counter."""
    acc = [0]

    def hook(_m, args, kwargs):
        acc[0] += int(args[0].num_atoms)

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return acc


def bench_alchemi(
    atoms, md_atoms, repeats: int, gate, threads: int, label: str = "alchemi_lit"
) -> tuple[list[Row], dict]:
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _bench_alchemi(atoms, md_atoms, repeats, gate, label)
    finally:
        torch.set_num_threads(saved)


def _bench_alchemi(atoms, md_atoms, repeats: int, gate, label: str) -> tuple[list[Row], dict]:
    n_atoms = sum(len(a) for a in atoms)
    model = lj_model()
    evals = count_evals(model)
    rows, info = [], {}
    relax = Batch.from_atoms(atoms, dtype=DT)
    md_batch = Batch.from_atoms(md_atoms, dtype=DT)

    def fire_run():
        sim = al.Simulator(
            model=model,
            stages=FIRE(fmax=FMAX, max_steps=MAX_STEPS),
            accelerator="cpu",
            precision="64",
            seed=0,
        )
        return sim.run(relax)

    def nvt_run():
        sim = al.Simulator(
            model=model,
            stages=Langevin(dt=MD_DT_FS, temperature=MD_T, friction=MD_FRICTION, steps=MD_STEPS),
            accelerator="cpu",
            precision="64",
            seed=0,
        )
        return sim.run(md_batch)

    for task, fn in (("FIRE relax", fire_run), ("Langevin NVT", nvt_run)):
        fn() if task == "FIRE relax" else _short_nvt(model, md_batch)  # warm-up
        gate.wait(f"{label} {task}")
        walls, res = [], None
        for _ in range(repeats):
            evals[0] = 0
            t0 = time.perf_counter()
            res = fn()
            walls.append(time.perf_counter() - t0)
        steps = res.steps.to(torch.float64)
        sizes = res.batch.n_atoms.to(torch.float64)
        if task == "FIRE relax":
            info["fire_steps"] = res.steps.tolist()  # in system_id order
            info["fire_converged"] = int(res.converged.sum())
        rows.append(
            Row(
                label,
                task,
                median(walls),
                steps.tolist(),
                float((steps * sizes).sum()),
                evals[0],
                len(atoms),
            )
        )
    assert n_atoms == int(relax.num_atoms)
    return rows, info


def _short_nvt(model, md_batch) -> None:
    al.Simulator(
        model=model,
        stages=Langevin(dt=MD_DT_FS, temperature=MD_T, friction=MD_FRICTION, steps=10),
        accelerator="cpu",
        seed=0,
    ).run(md_batch)


def sevennet_case():
    """(model, label, systems) for the overhead of a real MLIP, or None without the plugin.

    4 perturbed 32-atom fcc Cu cells (128 atoms, float32, SevenNet's own precision):
    SevenNet-0 costs ~5000x more per atom than LJ on this CPU (~9 ms/atom), so this
    shows the overhead a user of a real model sees.
    """
    try:
        from alchemi_lit_sevenn import SevenNet
    except ImportError:
        return None
    from ase.build import bulk

    rng = np.random.default_rng(3)
    systems = []
    for _ in range(4):
        a = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
        a.positions += rng.normal(0, 0.05, a.positions.shape)
        systems.append(a)
    return SevenNet("sevennet-0"), "4 x 32 Cu", with_velocities(systems, 300.0), "32"


def _timed_steps(loop, b, ctx, call_model, n: int) -> tuple[list[float], list[float]]:
    """``n`` timed ``loop.step`` calls and the time of the model call inside each."""
    in_step: list[float] = []

    def timed_forward(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return call_model(*args, **kwargs)
        finally:
            in_step.append(time.perf_counter() - t0)

    loop.forward = timed_forward
    steps = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            loop.step(b, ctx)
            steps.append(time.perf_counter() - t0)
    finally:
        loop.forward = loop.model
    return steps, in_step


def _replay(outputs: dict, pause: float = 0.0):
    """A stand-in model returning fresh copies of ``outputs`` (so per-forces caches are
    recomputed as after a real call), after busy-waiting ``pause`` seconds."""

    def forward(*args, **kwargs):
        end = time.perf_counter() + pause
        while time.perf_counter() < end:
            pass
        return {k: v.clone() for k, v in outputs.items()}

    return forward


def overhead_and_syncs(atoms, md_atoms, repeats: int, gate) -> tuple[list[tuple], list[str]]:
    """Per-step framework overhead vs the model call, and host syncs in the step loop.

    Per plan, three timings of the same steps: (1) in a real run, each step minus the
    model call inside it; (2) the model replaced by a replay of its outputs, so the
    framework's operations run back to back; (3) the replay after a busy-wait as long
    as the model call, which shows what this machine charges the same code for running
    after that long (on a shared VM, much: caches and predictors are cold again).
    """
    from alchemi_lit.strategies.fused import FusedLoop

    from alchemi_lit.engine.hooks import HookDispatcher, StepContext

    out, notes = [], []
    lj = lj_model()

    def nvt(compiled: bool = False) -> Langevin:
        stage = Langevin(dt=MD_DT_FS, temperature=MD_T, friction=MD_FRICTION, steps=10**6)
        if compiled:
            stage.compile()
        return stage

    md = {"dt": MD_DT_FS, "steps": 10**6}
    plans = [
        ("LJ FIRE", lj, al.Fused([FIRE(fmax=1e-9, max_steps=10**6)]), atoms, "64"),
        ("LJ FIRE2", lj, al.Fused([FIRE2(fmax=1e-9, max_steps=10**6)]), atoms, "64"),
        ("LJ Langevin", lj, al.Fused([nvt()]), md_atoms, "64"),
        ("LJ Langevin, compiled noise", lj, al.Fused([nvt(compiled=True)]), md_atoms, "64"),
        ("LJ VelocityVerlet", lj, al.Fused([VelocityVerlet(**md)]), md_atoms, "64"),
        ("LJ Bussi", lj, al.Fused([Bussi(temperature=MD_T, **md)]), md_atoms, "64"),
        ("LJ NoseHooverChain", lj, al.Fused([NoseHooverChain(temperature=MD_T, **md)]),
         md_atoms, "64"),
    ]  # fmax 1e-9: nobody converges while timed  # fmt: skip
    # whole multiples of NormalsAhead's 8-step draws, averaged: a median would hide
    # work done every few steps
    n_timed = 8 * max(6, 2 * repeats)
    sevenn = sevennet_case()
    if sevenn is not None:
        plans += [
            (f"SevenNet-0 FIRE ({sevenn[1]})", sevenn[0], al.Fused([FIRE(fmax=1e-9)]), *sevenn[2:]),
            (f"SevenNet-0 Langevin ({sevenn[1]})", sevenn[0], al.Fused([nvt()]), *sevenn[2:]),
        ]
    for name, model, plan, systems, precision in plans:
        sim = al.Simulator(
            model=model, stages=FIRE(), accelerator="cpu", precision=precision, seed=0
        )
        b = sim.prepare(systems)
        loop = FusedLoop(model, plan, HookDispatcher(sim.callbacks), seed=0)
        loop.declare(b)
        ctx = StepContext(batch=b, stages=plan.stages)
        ctx.state.update(has_fixed=False, exit_code=plan.exit)
        loop.compute(b, ctx)
        loop.start(b, torch.ones(len(b), dtype=torch.bool), ctx)
        for _ in range(5 if model is lj else 2):  # (the first compiles, where compiled)
            loop.step(b, ctx)
        gate.wait(f"overhead {name}")
        n = n_timed if model is lj else 8

        # (1) Each timed step also times the model call inside it, so the overhead is
        # that step's own non-model time (partial neighbour-list rebuilds count as model
        # time, as in a bare call that needs them); a bare forward for reference.
        builds0 = model.neighbors.num_builds
        steps, in_step = _timed_steps(loop, b, ctx, model, n)
        rebuilt = model.neighbors.num_builds - builds0
        bare = []
        for _ in range(3):
            t0 = time.perf_counter()
            model(b, compute_stress=False)
            bare.append(time.perf_counter() - t0)
        own = [s_ - m for s_, m in zip(steps, in_step)]
        # (2) and (3): the model's outputs replayed, at once and after a pause
        outputs = {k: v for k, v in ctx.outputs.items() if isinstance(v, torch.Tensor)}
        replayed = []
        for pause in (0.0, mean(in_step)):
            rs, rm = _timed_steps(loop, b, ctx, _replay(outputs, pause), n)
            replayed.append(mean([s_ - m for s_, m in zip(rs, rm)]))
        out.append(
            (
                name,
                mean(steps),
                mean(in_step),
                mean(own),
                median(bare),
                b.num_atoms,
                rebuilt,
                n,
                *replayed,
            )
        )

    # host syncs inside FusedLoop.step during real runs (bookkeeping excluded)
    counter = HostSyncCounter()
    orig_step = FusedLoop.step
    n_steps = [0]

    def counted_step(self, batch, ctx):
        n_steps[0] += 1
        counter.resume()
        try:
            return orig_step(self, batch, ctx)
        finally:
            counter.pause()

    relax = Batch.from_atoms(atoms, dtype=DT)
    md_batch = Batch.from_atoms(md_atoms, dtype=DT)
    FusedLoop.step = counted_step
    try:
        with counter:
            counter.pause()
            al.Simulator(
                model=lj_model(),
                stages=FIRE(fmax=FMAX, max_steps=MAX_STEPS),
                accelerator="cpu",
                seed=0,
            ).run(relax)
            al.Simulator(
                model=lj_model(),
                stages=Langevin(
                    dt=MD_DT_FS, temperature=MD_T, friction=MD_FRICTION, steps=MD_STEPS
                ),
                accelerator="cpu",
                seed=0,
            ).run(md_batch)
    finally:
        FusedLoop.step = orig_step
    notes.append(
        f"host syncs inside FusedLoop.step over {n_steps[0]} steps of real runs (FIRE + NVT, "
        f"bookkeeping excluded): {counter.calls} "
        f"({counter.calls / max(n_steps[0], 1):.2f} per step)"
    )
    for site, n in sorted(counter.sites.items(), key=lambda kv: -kv[1]):
        notes.append(f"    {n:6d}  {site}")
    return out, notes


# --------------------------------------------------------------------------- TorchSim
def bench_torchsim(atoms, md_atoms, repeats: int, gate, alchemi_steps) -> tuple[list[Row], str]:
    import torch_sim as ts
    from torch_sim.units import MetalUnits

    device = torch.device("cpu")
    model = torchsim_lj(DT)
    HalvedLJ = type(model)
    err = torchsim_force_error(model, atoms[:2], DT)
    assert err < 1e-8, f"halved TorchSim forces differ from ASE by {err}"
    note = (
        f"TorchSim {package_version('torch-sim-atomistic')}: LennardJonesModel forces halved "
        "in a wrapper (its 0.3.x forces are 2x too large); "
        f"halved forces match ASE to {err:.0e} eV/Å"
    )

    n_atoms = sum(len(a) for a in atoms)

    def fire_run(max_steps=MAX_STEPS):
        return torchsim_fire(atoms, model, DT, FMAX, max_steps)

    dt_int = MD_DT_FS * 1e-3 * float(MetalUnits.time)  # fs -> ps -> internal time
    gamma = MD_FRICTION * 1e3 / float(MetalUnits.time)  # 1/fs -> 1/internal time
    kT = MD_T * float(MetalUnits.temperature)

    def nvt_run(steps=MD_STEPS):
        init_fn, update_fn = ts.integrators.nvt_langevin(
            model=model,
            dt=torch.tensor(dt_int, dtype=DT),
            kT=torch.tensor(kT, dtype=DT),
            gamma=torch.tensor(gamma, dtype=DT),
            seed=0,
        )
        s = init_fn(ts.io.atoms_to_state(md_atoms, device, DT))
        for _ in range(steps):
            s = update_fn(s)
        return s

    rows = []
    steps_ref = torch.tensor(alchemi_steps, dtype=torch.float64) if alchemi_steps else None
    sizes = torch.tensor([len(a) for a in atoms], dtype=torch.float64)
    for task, fn, warm in (
        ("FIRE relax", fire_run, lambda: fire_run(10)),
        ("Langevin NVT", nvt_run, lambda: nvt_run(5)),
    ):
        warm()
        gate.wait(f"TorchSim {task}")
        walls = []
        for _ in range(repeats):
            HalvedLJ.evals = 0
            t0 = time.perf_counter()
            final = fn()
            walls.append(time.perf_counter() - t0)
        if task == "FIRE relax":
            fmax = ts.quantities.systemwise_max_force(final) if hasattr(ts, "quantities") else None
            if fmax is not None:
                assert bool((fmax < FMAX).all()), "TorchSim FIRE did not converge every system"
            steps = steps_ref.tolist() if steps_ref is not None else [float("nan")] * len(atoms)
            useful = float((steps_ref * sizes).sum()) if steps_ref is not None else float("nan")
        else:
            steps = [float(MD_STEPS)] * len(atoms)
            useful = float(n_atoms * MD_STEPS)
        rows.append(
            Row(
                f"TorchSim {package_version('torch-sim-atomistic')}",
                task,
                median(walls),
                steps,
                useful,
                HalvedLJ.evals,
                len(atoms),
                "steps = alchemi_lit's (same ASE algorithm)" if task == "FIRE relax" else "",
            )
        )
    return rows, note


# --------------------------------------------------------------------------- ASE
def bench_ase(atoms, md_atoms, n_fire: int, n_md: int, gate) -> tuple[list[Row], list[int]]:
    from ase import units
    from ase.calculators.lj import LennardJones as AseLJ
    from ase.md.langevin import Langevin as AseLangevin
    from ase.optimize import FIRE as AseFIRE

    def calc():
        return AseLJ(epsilon=ARGON_LJ["epsilon"], sigma=ARGON_LJ["sigma"], rc=ARGON_LJ["cutoff"])

    n_total = len(atoms)
    rows = []
    # warm-up (imports, first calls)
    a = atoms[0].copy()
    a.calc = calc()
    AseFIRE(a, logfile=None).run(fmax=FMAX, steps=3)
    gate.wait("ASE FIRE")
    steps, wall, atom_steps = [], 0.0, 0
    for a0 in atoms[:n_fire]:
        a = a0.copy()
        a.calc = calc()
        t0 = time.perf_counter()
        opt = AseFIRE(a, logfile=None)  # ASE defaults = the parameters of the other frameworks
        opt.run(fmax=FMAX, steps=MAX_STEPS)
        wall += time.perf_counter() - t0
        steps.append(opt.nsteps)
        atom_steps += len(a) * opt.nsteps
    scale = n_total / n_fire
    evals = sum(len(a) * (s + 1) for a, s in zip(atoms, steps))
    rows.append(
        Row(
            "ASE (serial)",
            "FIRE relax",
            wall * scale,
            [float(s) for s in steps],
            atom_steps * scale,
            evals * scale,
            n_total,
            f"timed on {n_fire} of {n_total} systems, scaled",
        )
    )
    gate.wait("ASE NVT")
    wall = 0.0
    for a0 in md_atoms[:n_md]:
        a = a0.copy()
        a.calc = calc()
        t0 = time.perf_counter()
        dyn = AseLangevin(
            a,
            timestep=MD_DT_FS * units.fs,
            temperature_K=MD_T,
            friction=MD_FRICTION / units.fs,
            rng=np.random.default_rng(0),
        )
        dyn.run(MD_STEPS)
        wall += time.perf_counter() - t0
    scale = n_total / n_md
    n_md_atoms = sum(len(a) for a in md_atoms[:n_md])
    rows.append(
        Row(
            "ASE (serial)",
            "Langevin NVT",
            wall * scale,
            [float(MD_STEPS)] * n_md,
            n_md_atoms * MD_STEPS * scale,
            n_md_atoms * (MD_STEPS + 1) * scale,
            n_total,
            f"timed on {n_md} of {n_total} systems, scaled",
        )
    )
    return rows, steps


# --------------------------------------------------------------------------- nvalchemi
def bench_nvalchemi(atoms, md_atoms, repeats: int, threads: int, gate) -> tuple[list[Row], str]:
    py = nvalchemi_python()
    if not py.exists():
        return [], (
            f"nvalchemi-toolkit: skipped -- no environment at {py} "
            f"(run `bash bench/setup_peers.sh`, or set ALCHEMI_BENCH_NVALCHEMI_PYTHON)"
        )
    with tempfile.TemporaryDirectory(prefix="alchemi_bench_") as tmp:
        ptr = np.cumsum([0] + [len(a) for a in atoms])
        np.savez(
            Path(tmp) / "w.npz",
            ptr=ptr,
            numbers=np.concatenate([a.numbers for a in atoms]),
            positions=np.concatenate([a.positions for a in atoms]),
            cells=np.stack([a.cell.array for a in atoms]),
            pbc=np.array([bool(a.pbc.all()) for a in atoms]),
            velocities=np.concatenate([a.get_velocities() for a in md_atoms]),
        )
        params = {
            "threads": threads,
            "lj": ARGON_LJ,
            "skin": SKIN,
            "repeats": repeats,
            "modes": ["fire", "nvt"],
            "fire": {"dt": 0.1, "dtmax": 1.0, "maxstep": 0.2, "fmax": FMAX, "max_steps": MAX_STEPS},
            "nvt": {
                "dt": MD_DT_FS,
                "temperature": MD_T,
                "friction": MD_FRICTION,
                "steps": MD_STEPS,
            },
        }
        (Path(tmp) / "p.json").write_text(json.dumps(params))
        gate.wait("nvalchemi (FIRE then NVT, in a subprocess)")
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        try:
            proc = subprocess.run(
                [
                    str(py),
                    str(HERE / "_nvalchemi_worker.py"),
                    str(Path(tmp) / "w.npz"),
                    str(Path(tmp) / "p.json"),
                ],
                capture_output=True,
                text=True,
                timeout=1800,
                env=env,
                cwd=tmp,
            )
        except subprocess.TimeoutExpired:
            return [], "nvalchemi-toolkit: skipped -- its run took more than 30 minutes"
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return [], f"nvalchemi-toolkit: failed (exit {proc.returncode}): {' | '.join(tail)}"
    res = json.loads(lines[-1])
    if "error" in res:
        return [], f"nvalchemi-toolkit: failed: {res['error']}"
    v = res["versions"]
    name = f"nvalchemi {v.get('nvalchemi-toolkit', '?')}"
    sizes = np.array([len(a) for a in atoms], dtype=float)
    n_atoms = float(sizes.sum())
    rows = []
    f = res["fire"]
    first = np.array(f["first_converged_step"], dtype=float)
    rows.append(
        Row(
            name,
            "FIRE relax",
            median(f["walls"]),
            first.tolist(),
            float((first * sizes).sum()),
            n_atoms * (f["steps"] + 1),
            len(atoms),
            f"whole batch stepped to step {f['steps']} (its run() rule)",
        )
    )
    m = res["nvt"]
    rows.append(
        Row(
            name,
            "Langevin NVT",
            median(m["walls"]),
            [float(m["steps"])] * len(atoms),
            n_atoms * m["steps"],
            n_atoms * (m["steps"] + 1),
            len(atoms),
        )
    )
    note = (
        f"nvalchemi-toolkit {v.get('nvalchemi-toolkit')} (ops {v.get('nvalchemi-toolkit-ops')}, "
        f"warp {v.get('warp-lang')}, numpy {v.get('numpy')}, torch {v.get('torch')}) "
        f"in {py.parent.parent}; "
        f"import {res['import_s']:.0f} s, "
        f"first-use compile/warm-up {res['warmup_s']:.0f} s (not timed)"
    )
    return rows, note


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (alchemi_lit, nvalchemi)")
    p.add_argument("--peer-repeats", type=int, default=2, help="timed repeats for TorchSim")
    p.add_argument("--ase-fire-subset", type=int, default=16)
    p.add_argument("--ase-md-subset", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--alchemi-threads",
        type=int,
        nargs="*",
        default=[1],
        help="also time alchemi_lit with these thread counts (default: 1, per core)",
    )
    p.add_argument("--no-peers", action="store_true", help="time alchemi_lit only")
    p.add_argument("--skip", nargs="*", default=[], choices=["ase", "torchsim", "nvalchemi"])
    gate_arguments(p)
    args = p.parse_args(argv)

    setup_threads(args.threads)
    gate = gate_from(args)
    atoms = argon_set(args.systems)
    md_atoms = with_velocities(atoms, MD_T)
    n_atoms = sum(len(a) for a in atoms)
    print(
        f"# (a) FIRE relax (fmax {FMAX} eV/Å, <= {MAX_STEPS} steps) and {MD_STEPS}-step Langevin "
        f"NVT (dt {MD_DT_FS} fs, {MD_T:g} K, friction {MD_FRICTION}/fs)"
    )
    print(
        f"# {args.systems} argon crystals x {len(atoms[0])} atoms = {n_atoms} atoms, LJ rc "
        f"{ARGON_LJ['cutoff']} Å, skin {SKIN} Å, float64 | {environment_line()}",
        flush=True,
    )

    rows, notes = [], []
    a_rows, info = bench_alchemi(atoms, md_atoms, args.repeats, gate, args.threads)
    rows += a_rows
    for t in args.alchemi_threads:
        if t != args.threads:
            rows += bench_alchemi(
                atoms,
                md_atoms,
                args.repeats,
                gate,
                t,
                f"alchemi_lit ({t} thread{'s' if t > 1 else ''})",
            )[0]
    notes.append(f"alchemi_lit FIRE: {info['fire_converged']}/{len(atoms)} systems converged")
    peers = not args.no_peers
    if peers and "ase" not in args.skip:
        ase_rows, ase_steps = bench_ase(
            atoms,
            md_atoms,
            min(args.ase_fire_subset, len(atoms)),
            min(args.ase_md_subset, len(atoms)),
            gate,
        )
        rows += ase_rows
        same = sum(int(a == b) for a, b in zip(ase_steps, info["fire_steps"]))
        notes.append(
            f"FIRE steps per system, ASE vs alchemi_lit (ASE mode) on the {len(ase_steps)} "
            f"ASE systems: identical for {same}/{len(ase_steps)}"
        )
    if peers and "torchsim" not in args.skip:
        try:
            ts_rows, note = bench_torchsim(
                atoms, md_atoms, args.peer_repeats, gate, info["fire_steps"]
            )
            rows += ts_rows
            notes.append(note)
        except ImportError as err:
            notes.append(f"TorchSim skipped: {err} (pip install torch-sim-atomistic)")
    if peers and "nvalchemi" not in args.skip:
        nv_rows, note = bench_nvalchemi(atoms, md_atoms, args.repeats, args.threads, gate)
        rows += nv_rows
        notes.append(note)

    ref = {r.task: r for r in rows if r.framework == "alchemi_lit"}
    table = []
    for r in rows:
        base = ref[r.task]
        sps = r.n / r.wall
        steps = np.array(r.steps, dtype=float)
        table.append(
            (
                r.framework,
                r.task,
                f"{r.wall:.2f}",
                f"{steps.mean():.1f}/{steps.max():.0f}",
                f"{r.useful / r.wall:,.0f}",
                f"{r.evals / r.wall:,.0f}",
                f"{sps:.2f}",
                f"{sps / (base.n / base.wall):.2f}x",
                r.note,
            )
        )
    print()
    print(
        format_table(
            [
                "framework",
                "task",
                "wall s",
                "steps mean/max",
                "atom-steps/s",
                "engine atom-evals/s",
                "systems/s",
                "vs alchemi_lit",
                "note",
            ],
            table,
        )
    )

    over, sync_notes = overhead_and_syncs(atoms, md_atoms, args.repeats, gate)
    print()
    print(
        "alchemi_lit per-step framework overhead (FusedLoop.step minus the model call inside "
        "that step, means over the timed steps; a bare forward on the same batch for "
        "reference; then the framework's time with the model's outputs replayed at once, "
        "and after a busy-wait as long as the model call):"
    )
    print(
        format_table(
            [
                "plan",
                "step ms",
                "model in step ms",
                "framework ms",
                "overhead",
                "bare forward ms",
                "replayed ms",
                "replayed after wait ms",
                "step atom-steps/s",
                "NL rebuilds in steps",
            ],
            [
                (
                    n,
                    f"{ts_ * 1e3:.2f}",
                    f"{tm * 1e3:.2f}",
                    f"{to * 1e3:.2f}",
                    f"{to / tm * 100:+.1f}%",
                    f"{tf * 1e3:.2f}",
                    f"{r0 * 1e3:.2f} ({r0 / tm * 100:+.1f}%)",
                    f"{rw * 1e3:.2f} ({rw / tm * 100:+.1f}%)",
                    f"{na / ts_:,.0f}",
                    f"{rb} systems / {nt} steps",
                )
                for n, ts_, tm, to, tf, na, rb, nt, r0, rw in over
            ],
        )
    )
    print()
    for note in notes + sync_notes:
        print(f"* {note}" if not note.startswith("    ") else note)
    print(f"* {gate.status_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
