"""The engines of bench_mlip_relax.py: alchemi_lit and ASE here, TorchSim in its venv.

Each ``relax(...)`` returns the same dictionary (the TorchSim worker's ``relax`` too):
``wall`` (s), ``model_s`` (s inside the engine's model call), ``forward_calls``,
``atoms_through``, ``edges_through`` and ``atoms_per_call`` (counted on SevenNet's
network, :mod:`mlip_counting`), per system ``steps`` (steps taken), ``first_met`` (the
step at which the criterion was first met, -1 never), ``converged``, ``energy`` (eV),
``cells`` (rows, Å) and ``positions``.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import numpy as np
from mlip_counting import CallTimer, counted_run, sevennet_probe


def cell_relax_stage(fmax: float, max_steps: int) -> tuple[Any, str]:
    """alchemi_lit's FIRE with the Frechet cell filter where this alchemi_lit has
    ``FIRE(cell=...)``, else LBFGS with it; and a label saying which."""
    from alchemi_lit.integrators import FIRE, LBFGS

    if "cell" in inspect.signature(FIRE.__init__).parameters:
        return FIRE(fmax=fmax, max_steps=max_steps, cell="frechet"), "FIRE + Frechet cell filter"
    return (
        LBFGS(fmax=fmax, max_steps=max_steps, cell="frechet"),
        "LBFGS + Frechet cell filter (this alchemi_lit has no FIRE(cell=) yet)",
    )


def positions_stage(fmax: float, max_steps: int) -> tuple[Any, str]:
    from alchemi_lit.integrators import FIRE

    return FIRE(fmax=fmax, max_steps=max_steps), "FIRE (ASE's)"


class AlchemiEngine:
    """alchemi_lit: SevenNet-0 through its plugin, every system in flight in one forward,
    in-flight refills from a ``SizeAwareSampler`` within ``max_atoms``, float32."""

    name = "alchemi_lit"

    def __init__(self, atoms: list[Any]) -> None:
        from alchemi_lit_sevenn import SevenNet

        self.atoms = atoms
        self.model = SevenNet("sevennet-0")
        self.probe = sevennet_probe()
        self.timer = CallTimer(type(self.model), "forward")

    def evaluate(self) -> dict[str, Any]:
        import alchemi_lit as al

        batch = al.Batch.from_atoms(self.atoms, dtype=_float32())
        out = self.model(batch, compute_stress=True)
        return {k: v.double().tolist() for k, v in out.items()}

    def relax(
        self, cell: bool, fmax: float, max_steps: int, max_atoms: int, systems: int | None = None
    ) -> dict[str, Any]:
        import alchemi_lit as al
        from alchemi_lit.data import SizeAwareSampler

        atoms = self.atoms[:systems]
        stage, _ = (cell_relax_stage if cell else positions_stage)(fmax, max_steps)
        sim = al.Simulator(
            model=self.model, stages=stage, precision="32", accelerator="cpu", seed=0
        )
        self.probe.reset()
        self.timer.reset()
        with self.probe, self.timer:
            t0 = time.perf_counter()
            res = sim.run(SizeAwareSampler(atoms, max_atoms=max_atoms))
            wall = time.perf_counter() - t0
        b = res.batch
        steps = res.steps.tolist()
        converged = res.converged.tolist()
        return {
            **counted_run(wall, self.probe, self.timer),
            "loop_forward_calls": int(res.stats.get("forward_calls", -1)),
            "steps": steps,
            "first_met": [s if c else -1 for s, c in zip(steps, converged)],
            "converged": converged,
            "energy": res.energy.double().tolist(),
            "cells": b.cell.double().tolist(),
            "positions": b.positions.double().tolist(),
        }


class AseEngine:
    """ASE: sevenn's own ``SevenNetCalculator`` and ``ase.optimize.FIRE`` (with
    ``FrechetCellFilter`` for cells), one structure after the other."""

    name = "ASE (serial)"

    def __init__(self, atoms: list[Any]) -> None:
        from sevenn.calculator import SevenNetCalculator

        self.atoms = atoms
        self.calc = SevenNetCalculator("7net-0", device="cpu")
        self.probe = sevennet_probe()
        self.timer = CallTimer(SevenNetCalculator, "calculate")

    def evaluate(self) -> dict[str, Any]:
        energy, forces, stress = [], [], []
        for a0 in self.atoms:
            a = a0.copy()
            a.calc = self.calc
            energy.append(a.get_potential_energy())
            forces.append(a.get_forces())
            stress.append(a.get_stress(voigt=False))
        return {
            "energy": energy,
            "forces": np.concatenate(forces).tolist(),
            "stress": np.stack(stress).tolist(),
        }

    def relax(
        self, cell: bool, fmax: float, max_steps: int, max_atoms: int, systems: int | None = None
    ) -> dict[str, Any]:
        """In a fresh process, as an ASE user runs it: a run of alchemi_lit leaves this
        process's glibc heap settings changed (alchemi_lit.core.heap), and ASE must not
        inherit them.  The child evaluates the set once untimed (imports, first calls)."""
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        receive, send = context.Pipe(duplex=False)
        kwargs = {"cell": cell, "fmax": fmax, "max_steps": max_steps, "systems": systems}
        child = context.Process(target=_relax_in_fresh_process, args=(self.atoms, kwargs, send))
        child.start()
        send.close()
        try:
            out = receive.recv()
        finally:
            child.join()
        if isinstance(out, BaseException):
            raise out
        return out

    def relax_here(
        self, cell: bool, fmax: float, max_steps: int, systems: int | None = None
    ) -> dict[str, Any]:
        from ase.filters import FrechetCellFilter
        from ase.optimize import FIRE

        out: dict[str, list[Any]] = {k: [] for k in ("steps", "converged", "energy", "cells")}
        positions = []
        self.probe.reset()
        self.timer.reset()
        with self.probe, self.timer:
            t0 = time.perf_counter()
            for a0 in self.atoms[:systems]:
                a = a0.copy()
                a.calc = self.calc
                opt = FIRE(FrechetCellFilter(a) if cell else a, logfile=None)
                ok = opt.run(fmax=fmax, steps=max_steps)
                out["steps"].append(int(opt.nsteps))
                out["converged"].append(bool(ok))
                out["energy"].append(float(a.get_potential_energy()))
                out["cells"].append(a.cell.array.tolist())
                positions.append(a.positions)
            wall = time.perf_counter() - t0
        return {
            **counted_run(wall, self.probe, self.timer),
            "first_met": [s if c else -1 for s, c in zip(out["steps"], out["converged"])],
            "positions": np.concatenate(positions).tolist(),
            **out,
        }


def _relax_in_fresh_process(atoms: list[Any], kwargs: dict[str, Any], send: Any) -> None:
    try:
        engine = AseEngine(atoms)
        engine.evaluate()  # warm-up, untimed
        send.send(engine.relax_here(**kwargs))
    except BaseException as exc:  # handed to the parent, which raises it
        send.send(exc)
    finally:
        send.close()


class TorchSimEngine:
    """TorchSim 0.6.x: sevenn's TorchSim wrapper, ``ts.optimize`` with its in-flight
    autobatcher within ``max_atoms`` (``memory_scales_with="n_atoms"``), ASE-flavoured
    FIRE (its default), the Frechet cell filter for cells; in its own venv."""

    name = "TorchSim"

    def __init__(self, atoms: list[Any], threads: int) -> None:
        from torchsim_peer import TorchSimPeer

        self.peer = TorchSimPeer(atoms, threads)
        self.info = self.peer.call("setup", model="sevennet", threads=threads, dtype="float32")
        self.name = f"TorchSim {self.info['versions']['torch-sim-atomistic']}"

    def evaluate(self) -> dict[str, Any]:
        return self.peer.call("evaluate")

    def relax(
        self, cell: bool, fmax: float, max_steps: int, max_atoms: int, systems: int | None = None
    ) -> dict[str, Any]:
        return self.peer.call(
            "relax", cell=cell, fmax=fmax, max_steps=max_steps, max_atoms=max_atoms,
            systems=systems,
        )  # fmt: skip

    def close(self) -> None:
        self.peer.close()


def _float32() -> Any:
    import torch

    return torch.float32
