"""``testing.accelerator_path()``: the GPU's branches on a CPU, and ``StepProbe``.

Under the switch every integrator, the fused plan and the run loop must give the CPU
path's results (the GPU gave the CPU's trajectories to 1e-12 Å on an H100); the step
must read nothing on the host and launch as many operations for 256 systems as for 16.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import alchemi_lit as al
from alchemi_lit import kernels
from alchemi_lit.core import tensor_ops
from alchemi_lit.engine.hooks import Callback
from alchemi_lit.integrators import (
    BFGS,
    FIRE,
    FIRE2,
    LBFGS,
    MTKNPT,
    Berendsen,
    Bussi,
    CellFilter,
    CRescale,
    Langevin,
    NoseHooverChain,
    NPTLangevin,
    VelocityVerlet,
    formulas,
)
from alchemi_lit.models import LennardJones
from alchemi_lit.testing import StepProbe, accelerator_path
from conftest import AR_EPSILON, AR_SIGMA, perturbed_argon

STEPS = 15

PLANS = {
    "fire": lambda: FIRE(fmax=1e-3, max_steps=STEPS),
    "fire2": lambda: FIRE2(fmax=1e-3, max_steps=STEPS),
    "bfgs": lambda: BFGS(fmax=1e-3, max_steps=STEPS),
    "lbfgs": lambda: LBFGS(fmax=1e-3, max_steps=STEPS),
    "fire+frechet": lambda: FIRE(fmax=1e-3, max_steps=STEPS, cell=CellFilter("frechet")),
    "lbfgs+frechet": lambda: LBFGS(fmax=1e-3, max_steps=STEPS, cell=CellFilter("frechet")),
    "verlet": lambda: VelocityVerlet(dt=2.0, steps=STEPS),
    "langevin": lambda: Langevin(dt=2.0, temperature=[40.0, 80.0, 60.0], steps=STEPS),
    "nose-hoover": lambda: NoseHooverChain(dt=2.0, temperature=60.0, tdamp=40.0, steps=STEPS),
    "bussi": lambda: Bussi(dt=2.0, temperature=60.0, taut=40.0, steps=STEPS),
    "berendsen": lambda: Berendsen(dt=2.0, temperature=60.0, taut=40.0, steps=STEPS),
    "mtk": lambda: MTKNPT(dt=2.0, temperature=60.0, pressure_gpa=0.1, tdamp=40.0,
                          pdamp=200.0, steps=STEPS),
    "crescale": lambda: CRescale(dt=2.0, temperature=60.0, pressure_gpa=0.1, taut=40.0,
                                 taup=200.0, steps=STEPS),
    "npt-langevin": lambda: NPTLangevin(dt=2.0, temperature=60.0, pressure_gpa=0.1,
                                        steps=STEPS),
    "fire+langevin": lambda: FIRE(fmax=0.05, max_steps=10)
    + Langevin(dt=2.0, temperature=60.0, steps=10),
}


def systems():
    out = perturbed_argon(3, 2, 0.1, seed=31)
    out[1] = out[1][:20]  # another size
    for k, atoms in enumerate(out):
        atoms.set_momenta(torch.randn(len(atoms), 3, dtype=torch.float64,
                                      generator=torch.Generator().manual_seed(k)).numpy() * 0.1)
    return out  # fmt: skip


def run(plan) -> al.Results:
    sim = al.Simulator(
        model=LennardJones(AR_EPSILON, AR_SIGMA, 6.0), stages=plan, precision="64", seed=3,
        accelerator="cpu",  # (on a GPU machine "auto" would pick the GPU)
    )
    return sim.run(systems())


@pytest.mark.parametrize("name", list(PLANS))
def test_every_integrator_gives_the_cpu_paths_results_on_the_accelerators(name):
    """Same decisions (steps, exit reasons) exactly; positions, velocities and cells to
    1e-9 -- the two paths differ in libraries (NumPy and numba against torch) and in
    summation order, and 15 steps of MD amplify an ulp by orders of magnitude."""
    cpu = run(PLANS[name]())
    with accelerator_path():
        device = run(PLANS[name]())
    assert device.exit_reasons == cpu.exit_reasons
    assert torch.equal(device.batch.total_steps, cpu.batch.total_steps)
    for field in ("positions", "velocities", "cell"):
        torch.testing.assert_close(
            getattr(device.batch, field), getattr(cpu.batch, field), rtol=0, atol=1e-9,
            msg=field,
        )  # fmt: skip


def test_the_switch_is_one_switch_and_is_put_back():
    before = tensor_ops.CPU_READS_FREE, kernels.ENABLED
    x = torch.ones(3)
    with pytest.raises(RuntimeError), accelerator_path():
        assert not tensor_ops.host_reads_free(x) and not kernels.usable(x)
        assert not tensor_ops.numpy_viewable(x)
        raise RuntimeError("leave by an exception")
    assert before == (tensor_ops.CPU_READS_FREE, kernels.ENABLED)


def test_per_system_formulas_run_in_torch_under_the_switch():
    """The torch versions of Bussi's factor and the Nosé-Hoover chain are what a GPU
    runs: under the switch they are the ones the integrators call."""
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))

    c = torch.tensor([0.9, 0.8], dtype=torch.float64)
    with accelerator_path(), Spy():
        formulas.bussi_alpha(c, c, c * 9, c, c, c)
    assert "sqrt" in seen
    seen.clear()
    with Spy():
        formulas.bussi_alpha(c, c, c * 9, c, c, c)
    assert "sqrt" not in seen  # NumPy on the CPU's path


class Reader(Callback):
    """Reads a value on the host in every step (as a careless callback might)."""

    def after_compute(self, ctx) -> None:
        float(ctx.batch.energy.sum())


def test_the_probe_counts_host_reads_and_not_host_copies():
    probe = StepProbe()
    plan = Langevin(dt=2.0, temperature=60.0, steps=5)
    with accelerator_path(), probe:
        sim = al.Simulator(
            model=LennardJones(AR_EPSILON, AR_SIGMA, 6.0),
            stages=plan,
            callbacks=[probe, Reader()],
            sync_every="auto",  # its host copies are not reads
        )
        sim.run(systems())
    assert len(probe.reads_per_step) >= 5
    assert all(r >= 1 for r in probe.reads_per_step)
    assert any("_local_scalar_dense" in w for w in probe.where)
    assert min(probe.ops_per_step) > 50


def median(values: list[int]) -> int:
    return sorted(values)[len(values) // 2]


@pytest.mark.parametrize("plan", ["langevin", "fire"])
def test_a_steps_operations_do_not_grow_with_the_number_of_systems(plan):
    """No Python loop over systems in a step: the same operations for 256 systems as
    for 16 (a loop would multiply them sixteenfold)."""
    ops = {}
    for n in (16, 256):
        probe = StepProbe()
        stage = (Langevin(dt=2.0, temperature=60.0, steps=8) if plan == "langevin"
                 else FIRE(fmax=1e-4, max_steps=8))  # fmt: skip
        with accelerator_path(), probe:
            al.Simulator(model=LennardJones(AR_EPSILON, AR_SIGMA, 6.0), stages=stage,
                         callbacks=[probe]).run(perturbed_argon(n, 1, 0.05, seed=2))  # fmt: skip
        ops[n] = median(probe.ops_per_step)
    assert ops[256] == ops[16], ops


@pytest.mark.parametrize("plan", ["langevin", "fire+langevin"])
def test_nine_steps_in_ten_read_nothing_on_the_host(plan):
    """What a GPU would sync on: neighbour-list rebuilds (their pair count) and the step
    after a new layout; every other step reads nothing (the skin check is read one step
    late, the bookkeeping flags through host copies)."""
    probe = StepProbe()
    stage = Langevin(dt=2.0, temperature=60.0, steps=150)
    if plan != "langevin":
        stage = FIRE(fmax=0.05, max_steps=50) + stage
    with accelerator_path(), probe:
        al.Simulator(model=LennardJones(AR_EPSILON, AR_SIGMA, 6.0), stages=stage,
                     callbacks=[probe], sync_every="auto").run(
            perturbed_argon(16, 2, 0.05, seed=4))  # fmt: skip
    assert len(probe.reads_per_step) >= 150
    assert probe.share_without_reads() >= 0.9, (probe.reads_per_step, probe.where)


def test_a_cell_filter_step_reads_nothing_on_the_host():
    """The cell filters' matrix log, square root and solves skip linalg's status check
    off CPU (each checked call was a read: 132 per Frechet step before), so their
    steps read nothing but the first call's skin check."""
    probe = StepProbe()
    with accelerator_path(), probe:
        al.Simulator(model=LennardJones(AR_EPSILON, AR_SIGMA, 6.0), stages=PLANS["fire+frechet"](),
                     callbacks=[probe], precision="64").run(systems())  # fmt: skip
    assert len(probe.reads_per_step) >= STEPS
    assert probe.share_without_reads() >= 0.9, (probe.reads_per_step, probe.where)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def run_on(plan, device: str) -> al.Results:
    sim = al.Simulator(
        model=LennardJones(AR_EPSILON, AR_SIGMA, 6.0), stages=plan, precision="64", seed=3,
        accelerator=device,
    )  # fmt: skip
    return sim.run(systems())


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("name", list(PLANS))
def test_every_integrator_on_cuda_gives_the_cpus_results(name):
    """What the switch checks on CI, on a real GPU: the same steps and exits, the same
    trajectories to 1e-9 Å (the first H100 run: 8e-13)."""
    cpu = run(PLANS[name]())
    gpu = run_on(PLANS[name](), "cuda")
    assert gpu.exit_reasons == cpu.exit_reasons
    assert torch.equal(gpu.batch.total_steps.cpu(), cpu.batch.total_steps)
    for field in ("positions", "velocities", "cell"):
        torch.testing.assert_close(getattr(gpu.batch, field).cpu(), getattr(cpu.batch, field),
                                   rtol=0, atol=1e-9, msg=field)  # fmt: skip


class CudaSyncs(Callback):
    """Blocking syncs per step, from ``torch.cuda.set_sync_debug_mode("warn")``."""

    def __init__(self) -> None:
        super().__init__()
        self.per_step: list[int] = []
        self._seen: Any = None
        self._catch: Any = None

    def before_step(self, ctx) -> None:
        import warnings

        self._catch = warnings.catch_warnings(record=True)
        self._seen = self._catch.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")

    def after_step(self, ctx) -> None:
        torch.cuda.set_sync_debug_mode("default")
        self._catch.__exit__(None, None, None)
        self.per_step.append(sum("synchroniz" in str(w.message) for w in self._seen))


@pytest.mark.cuda
@needs_cuda
def test_nine_steps_in_ten_do_not_sync_on_cuda():
    syncs = CudaSyncs()
    sim = al.Simulator(model=LennardJones(AR_EPSILON, AR_SIGMA, 6.0),
                       stages=Langevin(dt=2.0, temperature=60.0, steps=150),
                       callbacks=[syncs], accelerator="cuda")  # fmt: skip
    sim.run(perturbed_argon(16, 2, 0.05, seed=4))
    quiet = sum(1 for s in syncs.per_step if s == 0) / len(syncs.per_step)
    assert quiet >= 0.9, syncs.per_step
