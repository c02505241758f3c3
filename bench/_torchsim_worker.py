"""TorchSim 0.6.x side of bench_mlip_relax.py and bench_mace_nvt.py (its own venv).

Run by the benchmarks, never by hand: ``<venv python> _torchsim_worker.py SET.npz``
(the structures, from ``crystals.pack``) then one JSON command per line on stdin; each
answer is one line ``@@RESULT {json}`` on stdout (anything else TorchSim or Warp print
is ignored).  Keeping one process alive lets the parent interleave TorchSim's timed runs
with the other engines' without paying imports and model loading each time.

Commands:

* ``{"cmd": "setup", "model": "sevennet"|"mace", "threads": 2, ...}`` -- load the model
  (SevenNet-0 from the sevenn wheel through sevenn's own TorchSim wrapper, or MACE from
  ``mace_state`` + ``mace_arch`` through TorchSim's ``MaceModel``);
* ``{"cmd": "evaluate"}`` -- energies, forces and stress of the initial set (untimed;
  the parent checks they equal its own model's);
* ``{"cmd": "forward", "repeats": 3}`` -- median seconds of one model call on the set;
* ``{"cmd": "relax", "cell": false, "fmax": 0.05, "max_steps": 500, "max_atoms": 128}``
  -- ``ts.optimize`` with its in-flight autobatcher and ASE-flavoured FIRE (with
  ``cell``: the Frechet cell filter, cell forces in the criterion);
* ``{"cmd": "nvt", "steps": 50, "dt_fs": 1.0, "temperature": 300, "friction": 0.01}``
  -- ``ts.integrate`` with ``nvt_langevin``, all systems in one batch;
* ``{"cmd": "swap_mc", "steps": 20, "temperature": 800, "seed": 0}`` -- TorchSim's
  ``swap_mc_init`` / ``swap_mc_step`` (Metropolis swaps of unlike atoms' positions), all
  systems in one state (or ``"systems": n`` of them from ``"first": i``): seconds of the
  steps and the accepted swaps;
* ``{"cmd": "quit"}``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from crystals import unpack
from mlip_counting import CallTimer, counted_run, mace_probe, sevennet_probe


def reply(obj: dict[str, Any]) -> None:
    sys.stdout.write("@@RESULT " + json.dumps(obj) + "\n")
    sys.stdout.flush()


class Worker:
    def __init__(self, set_path: str) -> None:
        import torch

        self.torch = torch
        self.atoms = unpack(np.load(set_path))
        self.sizes = np.array([len(a) for a in self.atoms])
        self.model: Any = None
        self.kind = ""

    # ------------------------------------------------------------------ setup
    def setup(self, cmd: dict[str, Any]) -> dict[str, Any]:
        import importlib.metadata as md

        torch = self.torch
        torch.set_num_threads(int(cmd.get("threads", 2)))
        dtype = getattr(torch, cmd.get("dtype", "float32"))
        self.kind = cmd["model"]
        t0 = time.perf_counter()
        if self.kind == "sevennet":
            from torch_sim.models.sevennet import SevenNetModel

            self.model = SevenNetModel("7net-0", device="cpu", dtype=dtype)
            self.probe = sevennet_probe()
        elif self.kind == "mace":
            from torch_sim.models.mace import MaceModel

            net = build_mace(cmd["mace_arch"])
            state = torch.load(cmd["mace_state"], map_location="cpu", weights_only=True)
            net.load_state_dict(state, strict=True)
            self.model = MaceModel(
                model=net, device=torch.device("cpu"), dtype=dtype, compute_stress=False
            )
            self.probe = mace_probe()
        else:
            raise ValueError(f"unknown model {self.kind!r}")
        from torch_sim.models.interface import ModelInterface

        self.timer = CallTimer(type(self.model), "forward")
        assert issubclass(type(self.model), ModelInterface)
        versions = {
            d: md.version(d)
            for d in ("torch-sim-atomistic", "torch", "numpy", "sevenn", "mace-torch", "ase")
        }
        with contextlib.suppress(md.PackageNotFoundError):
            versions["nvalchemi-toolkit-ops"] = md.version("nvalchemi-toolkit-ops")
        return {
            "versions": versions,
            "threads": torch.get_num_threads(),
            "python": sys.version.split()[0],
            "load_s": time.perf_counter() - t0,
            "model_dtype": str(self.model.dtype),
        }

    def state(self, systems: int | None = None, first: int = 0) -> Any:
        import torch_sim as ts

        atoms = self.atoms[first : None if systems is None else first + systems]
        return ts.io.atoms_to_state(atoms, self.model.device, self.model.dtype)

    # ------------------------------------------------------------------ checks
    def evaluate(self, cmd: dict[str, Any]) -> dict[str, Any]:
        out = self.model(self.state())
        res = {
            "energy": out["energy"].double().tolist(),
            "forces": out["forces"].double().tolist(),
        }
        if out.get("stress") is not None:
            res["stress"] = out["stress"].double().tolist()
        return res

    def forward(self, cmd: dict[str, Any]) -> dict[str, Any]:
        state = self.state()
        self.model(state)  # warm-up
        times = []
        for _ in range(int(cmd.get("repeats", 3))):
            t0 = time.perf_counter()
            self.model(state)
            times.append(time.perf_counter() - t0)
        return {"seconds": float(np.median(times)), "all": times}

    # ------------------------------------------------------------------ relax
    def relax(self, cmd: dict[str, Any]) -> dict[str, Any]:
        import torch_sim as ts
        from torch_sim.autobatching import InFlightAutoBatcher
        from torch_sim.optimizers import fire_init, fire_step
        from torch_sim.runners import generate_force_convergence_fn

        fmax, max_steps, cell = float(cmd["fmax"]), int(cmd["max_steps"]), bool(cmd["cell"])
        systems = cmd.get("systems")
        n = len(self.atoms[:systems])
        converged_fn = generate_force_convergence_fn(force_tol=fmax, include_cell_forces=cell)
        init_kwargs = {"cell_filter": ts.CellFilter.frechet} if cell else {}

        # systems that already meet the criterion before any step (untimed, not counted)
        initial = fire_init(self.state(systems), self.model, **init_kwargs)
        first_met = np.where(converged_fn(initial, None).cpu().numpy(), 0, -1)

        batcher = InFlightAutoBatcher(
            self.model, memory_scales_with="n_atoms", max_memory_scaler=float(cmd["max_atoms"])
        )
        steps = np.zeros(n, dtype=np.int64)

        def counted_step(state: Any, model: Any, **kwargs: Any) -> Any:
            """TorchSim's FIRE step, plus who took it and who meets the criterion now
            (a per-step force reduction TorchSim itself does every 5 steps)."""
            out = fire_step(state=state, model=model, **kwargs)
            idx = np.asarray(batcher.current_idx)
            steps[idx] += 1
            met = converged_fn(out, None).cpu().numpy()
            new = idx[met & (first_met[idx] < 0)]
            first_met[new] = steps[new]
            return out

        self.probe.reset()
        self.timer.reset()
        with self.probe, self.timer:
            t0 = time.perf_counter()
            final = ts.optimize(
                system=self.state(systems),
                model=self.model,
                optimizer=(fire_init, counted_step),
                convergence_fn=converged_fn,
                max_steps=max_steps,
                autobatcher=batcher,
                init_kwargs=init_kwargs,
            )
            wall = time.perf_counter() - t0
        done = converged_fn(final, None).cpu().numpy()
        fmax_final = ts.system_wise_max_force(final).double().cpu().numpy()
        return {
            **counted_run(wall, self.probe, self.timer),
            "steps": steps.tolist(),
            "first_met": first_met.tolist(),
            "converged": done.tolist(),
            "fmax": fmax_final.tolist(),
            "energy": final.energy.double().cpu().tolist(),
            "cells": final.row_vector_cell.double().cpu().tolist(),
            "positions": final.positions.double().cpu().tolist(),
        }

    # ------------------------------------------------------------------ NVT
    def nvt(self, cmd: dict[str, Any]) -> dict[str, Any]:
        import torch_sim as ts

        n_steps = int(cmd["steps"])
        self.probe.reset()
        self.timer.reset()
        with self.probe, self.timer:
            t0 = time.perf_counter()
            final = ts.integrate(
                system=self.state(),
                model=self.model,
                integrator=ts.Integrator.nvt_langevin,
                n_steps=n_steps,
                temperature=float(cmd["temperature"]),
                timestep=float(cmd["dt_fs"]) * 1e-3,  # ps
                autobatcher=False,
                gamma=float(cmd["friction"]) * 1e3,  # 1/fs -> 1/ps
            )
            wall = time.perf_counter() - t0
        temps = ts.quantities.calc_temperature(
            masses=final.masses, momenta=final.momenta, system_idx=final.system_idx
        )
        return {
            **counted_run(wall, self.probe, self.timer),
            "temperature": temps.double().cpu().tolist(),
            "finite": bool(self.torch.isfinite(final.positions).all()),
        }


def build_mace(arch: dict[str, Any]) -> Any:
    """A ``ScaleShiftMACE`` of the architecture the parent describes (its weights are
    then loaded from the parent's state dict)."""
    import torch
    from e3nn import o3

    with torch.serialization.safe_globals([slice]):
        from mace import modules
    return modules.ScaleShiftMACE(
        r_max=arch["r_max"],
        num_bessel=arch["num_bessel"],
        num_polynomial_cutoff=arch["num_polynomial_cutoff"],
        max_ell=arch["max_ell"],
        interaction_cls=modules.interaction_classes[arch["interaction"]],
        interaction_cls_first=modules.interaction_classes[arch["interaction_first"]],
        num_interactions=arch["num_interactions"],
        num_elements=len(arch["elements"]),
        hidden_irreps=o3.Irreps(arch["hidden_irreps"]),
        MLP_irreps=o3.Irreps(arch["MLP_irreps"]),
        atomic_energies=np.zeros(len(arch["elements"])),
        avg_num_neighbors=arch["avg_num_neighbors"],
        atomic_numbers=list(arch["elements"]),
        correlation=arch["correlation"],
        gate=modules.gate_dict[arch["gate"]],
        radial_MLP=list(arch["radial_MLP"]),
        atomic_inter_scale=1.0,
        atomic_inter_shift=0.0,
    )


def swap_mc(worker: Worker, cmd: dict[str, Any]) -> dict[str, Any]:
    """``steps`` swap Monte Carlo steps of every system (see the module docstring)."""
    import torch_sim as ts
    from ase.units import kB

    torch = worker.torch
    state = worker.state(cmd.get("systems"), int(cmd.get("first", 0)))
    kt, steps, seed = kB * float(cmd["temperature"]), int(cmd["steps"]), int(cmd.get("seed", 0))
    mc = ts.swap_mc_init(state, worker.model)  # (0.6: state first)
    rng = torch.Generator().manual_seed(seed)  # one stream for the run (0.6's advice)
    start = torch.arange(mc.n_atoms)
    accepted = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        mc = ts.swap_mc_step(mc, worker.model, kT=kt, rng=rng)
        moved = (mc.last_permutation != start).to(torch.int64)
        accepted += int((torch.zeros(mc.n_systems, dtype=torch.int64)
                         .index_add_(0, mc.system_idx, moved) > 0).sum())  # fmt: skip
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "accepted": accepted, "attempts": steps * int(mc.n_systems)}


def main() -> int:
    worker = Worker(sys.argv[1])
    handlers = {
        "setup": worker.setup,
        "evaluate": worker.evaluate,
        "forward": worker.forward,
        "relax": worker.relax,
        "nvt": worker.nvt,
        "swap_mc": lambda cmd: swap_mc(worker, cmd),
    }
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        try:
            reply({"ok": True, **handlers[cmd["cmd"]](cmd)})
        except Exception as exc:  # reported to the parent, which decides
            reply(
                {
                    "ok": False,
                    "error": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc(),
                }
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
