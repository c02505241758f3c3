"""The workloads of bench_gpu.py, each as ``run(n)``: a whole run of ``n`` steps.

alchemi_lit through its public ``Simulator``; TorchSim 0.6 in this process through its
own runners (``ts.integrate``, ``ts.optimize``), as a TorchSim user runs it, on the same
structures, device and dtype.  Both sides start from the same ``ase.Atoms``.
"""

from __future__ import annotations

import importlib.metadata
import logging
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from common import ARGON_LJ, argon_set
from crystals import crystal_set, quick_set

import alchemi_lit as al
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones

SKIN = 1.0  # Å, alchemi_lit's Verlet skin (TorchSim keeps no list: it rebuilds every call)
#: Langevin of argon (bench_dynamics.py's) and of the real crystals: dt fs, K, 1/fs
LJ_MD = {"dt": 2.0, "temperature": 60.0, "friction": 0.01}
MLIP_MD = {"dt": 1.0, "temperature": 300.0, "friction": 0.01}
NEVER = 1e-9  # eV/Å: an fmax no system meets, so a timed FIRE batch stays whole


def argon(n_systems: int) -> list[Any]:
    """``n_systems`` perturbed 108-atom fcc argon crystals (common.argon_set)."""
    return argon_set(n_systems, repeat=3, noise=0.1, seed=0)


def real_crystals(copies: int, quick: bool) -> list[Any]:
    """``copies`` independently strained and rattled copies of crystals.py's 24 real
    crystals (12 materials, primitive cells and 2x2x2 supercells; 16 copies: 384
    crystals, 3,744 atoms); ``quick``: its 4-structure smoke set."""
    if quick:
        return quick_set()
    return [a for k in range(copies) for a in crystal_set(seed=17 + k)]


def lj_model() -> LennardJones:
    return LennardJones(**ARGON_LJ, skin=SKIN, compute_stress=False)


def sevennet_model() -> Any:
    from alchemi_lit_sevenn import SevenNet

    return SevenNet("sevennet-0")


# --------------------------------------------------------------------------- alchemi_lit
class AlchemiCase:
    """One model, one batch on the device, one stage per run length."""

    def __init__(
        self,
        model: Any,
        atoms: list[Any],
        stage: Callable[[int], Any],
        device: torch.device,
        precision: str,
    ) -> None:
        self.model, self.stage, self.device, self.precision = model, stage, device, precision
        self.model.to(device)  # a run moves it; the bare call may come first
        self.batch = self.simulator(1, []).prepare(atoms)  # on the device, once
        self.n_atoms = int(self.batch.num_atoms)
        self.n_systems = int(self.batch.num_systems)

    def simulator(self, n: int, callbacks: list[Any]) -> al.Simulator:
        return al.Simulator(
            model=self.model,
            stages=self.stage(n),
            callbacks=callbacks,
            accelerator=self.device.type,
            precision=self.precision,  # type: ignore[arg-type]
            seed=0,
        )

    def run(self, n: int, callbacks: list[Any] | None = None) -> Any:
        return self.simulator(n, callbacks or []).run(self.batch)

    def fresh_neighbour_list(self) -> None:
        """A new, empty list for the model: on a CPU, a list built under
        ``accelerator_path()`` keeps the device path's state, which a later host-path run
        of the same model then fails to remap at its first graduation (IndexError in
        ``_remap_device_path``; a GPU takes one path only)."""
        from alchemi_lit.models.neighbors import NeighborList

        old = self.model.neighbors
        self.model.neighbors = NeighborList(old.cutoff, old.skin)

    def bare(self) -> dict[str, torch.Tensor]:
        """The model call a step makes, alone, on the same batch."""
        return self.model(self.batch, compute_stress=False)


def langevin(md: dict[str, float]) -> Callable[[int], Any]:
    return lambda n: Langevin(steps=n, **md)


def fire_steps(n: int) -> Any:
    return FIRE(fmax=NEVER, max_steps=n)


def relax(
    model: Any, atoms: list[Any], device: torch.device, fmax: float, max_steps: int
) -> Callable[[], dict[str, Any]]:
    """A whole FIRE relaxation (ASE's parameters), every system in flight at once."""

    def run() -> dict[str, Any]:
        res = al.Simulator(
            model=model,
            stages=FIRE(fmax=fmax, max_steps=max_steps),
            accelerator=device.type,
            precision="32",
            seed=0,
        ).run(atoms)
        steps = res.steps.tolist()
        return {
            "steps_mean": sum(steps) / len(steps),
            "steps_max": max(steps),
            "converged": int(res.converged.sum()),
        }

    return run


# --------------------------------------------------------------------------- TorchSim
def torchsim_status() -> tuple[Any, str]:
    """``(torch_sim, version)`` where TorchSim 0.6 runs here, else ``(None, why not)``."""
    try:
        import torch_sim as ts
    except Exception as exc:  # not installed, or broken on this interpreter
        return None, f"TorchSim not importable ({type(exc).__name__}: {exc})"
    version = importlib.metadata.version("torch-sim-atomistic")
    if not (hasattr(ts, "Integrator") and hasattr(ts, "Optimizer")):
        return None, f"TorchSim {version} is importable, but the rows need its 0.6 API"
    from torch_sim.neighbors import ALCHEMIOPS_AVAILABLE, VESIN_TORCHSCRIPT_AVAILABLE

    # its runners log "all systems reached the maximum steps" at every timed FIRE run
    logging.getLogger("torch_sim").setLevel(logging.ERROR)

    nl = (
        "nvalchemi-toolkit-ops (Warp)"
        if ALCHEMIOPS_AVAILABLE
        else "vesin-torch, one call per system"
        if VESIN_TORCHSCRIPT_AVAILABLE
        else "its pure-torch linked cell list"
    )
    return ts, f"TorchSim {version}, neighbour lists by {nl}, rebuilt every call"


class TorchSimCase:
    """TorchSim's side of a workload: its model on a SimState of the same atoms."""

    def __init__(self, ts: Any, model: Any, atoms: list[Any], device: torch.device) -> None:
        self.ts, self.model, self.device = ts, model, device
        self.state = ts.io.atoms_to_state(list(atoms), device, model.dtype)
        self.steps_taken = 0

    def langevin(self, md: dict[str, float]) -> Callable[[int], Any]:
        """``ts.integrate`` with its Langevin (BAOAB), all systems in one batch."""
        ts = self.ts

        def run(n: int) -> Any:
            return ts.integrate(
                system=self.state,
                model=self.model,
                integrator=ts.Integrator.nvt_langevin,
                n_steps=n,
                temperature=md["temperature"],
                timestep=md["dt"] * 1e-3,  # ps
                autobatcher=False,
                gamma=md["friction"] * 1e3,  # 1/fs -> 1/ps
            )

        return run

    def fire(self, fmax: float, max_steps: int | None = None) -> Callable[[int], Any]:
        """``ts.optimize`` with its ASE-flavoured FIRE and force criterion; converged
        systems leave every 5 steps.  ``run(n)``: at most ``n`` steps (``max_steps``
        when given); :attr:`steps_taken` counts the steps of the last run."""
        ts = self.ts
        from torch_sim.optimizers import fire_init, fire_step
        from torch_sim.runners import generate_force_convergence_fn

        criterion = generate_force_convergence_fn(force_tol=fmax, include_cell_forces=False)

        def counted_step(state: Any, model: Any, **kwargs: Any) -> Any:
            self.steps_taken += 1
            return fire_step(state=state, model=model, **kwargs)

        def run(n: int) -> Any:
            self.steps_taken = 0
            with warnings.catch_warnings():  # "all systems reached the maximum steps"
                warnings.simplefilter("ignore")
                return ts.optimize(
                    system=self.state,
                    model=self.model,
                    optimizer=(fire_init, counted_step),
                    convergence_fn=criterion,
                    max_steps=max_steps or n,
                    autobatcher=False,
                )

        return run

    def relax(self, fmax: float, max_steps: int) -> Callable[[], dict[str, Any]]:
        """A whole ``ts.optimize`` relaxation; how many systems meet the criterion at
        its end and how many steps its batch loop took."""
        from torch_sim.runners import generate_force_convergence_fn

        criterion = generate_force_convergence_fn(force_tol=fmax, include_cell_forces=False)
        fire = self.fire(fmax, max_steps)

        def run() -> dict[str, Any]:
            final = fire(max_steps)
            return {"loop_steps": self.steps_taken, "converged": int(criterion(final).sum())}

        return run

    def forces(self) -> torch.Tensor:
        return self.model(self.state)["forces"]


def torchsim_lj(ts: Any, device: torch.device, dtype: torch.dtype) -> Any:
    from torch_sim.models.lennard_jones import LennardJonesModel

    return LennardJonesModel(
        sigma=ARGON_LJ["sigma"],
        epsilon=ARGON_LJ["epsilon"],
        cutoff=ARGON_LJ["cutoff"],
        device=device,
        dtype=dtype,
        compute_stress=False,
    )


def torchsim_sevennet(ts: Any, device: torch.device) -> Any:
    """sevenn's own TorchSim wrapper of SevenNet-0 (what ``torch_sim.models.sevennet``
    re-exports), float32 like alchemi_lit's."""
    from torch_sim.models.sevennet import SevenNetModel

    return SevenNetModel("7net-0", device=device, dtype=torch.float32)


def agreement(ours: AlchemiCase, theirs: TorchSimCase, energy: bool) -> tuple[float, str]:
    """Largest |dF| (eV/Å) -- or |dE| per atom (eV), for models whose forces differ in
    float32 round-off more than their energies -- between the engines before any step."""
    if energy:
        a = ours.bare()["energy"].double().cpu().numpy()
        b = theirs.model(theirs.state)["energy"].double().detach().cpu().numpy()
        sizes = ours.batch.n_atoms.cpu().numpy()
        err = float((np.abs(a - b) / sizes).max())
        return err, f"max |dE| {err:.1e} eV/atom"
    a = ours.bare()["forces"].double().cpu()
    b = theirs.forces().double().detach().cpu()
    err = float((a - b).abs().max())
    return err, f"max |dF| {err:.1e} eV/Å"
