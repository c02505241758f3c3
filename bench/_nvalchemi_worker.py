"""nvalchemi-toolkit side of ``bench_dynamics.py``: runs in its own virtual environment.

Not meant to be run by hand: ``bench_dynamics.py`` writes the workload (positions,
cells, atomic numbers, initial MD velocities) to an ``.npz`` file and calls::

    <venv>/bin/python bench/_nvalchemi_worker.py WORKLOAD.npz PARAMS.json

with the python of the environment made by ``bench/setup_peers.sh``.  The last
line of stdout is one JSON object with the timings (or ``{"error": ...}``).

What is timed (wall clock, median of ``repeats`` after one short warm-up run that
pays Warp's kernel compilation and the torch.compile of the neighbour-list hook):

* ``fire``: nvalchemi's ``FIRE`` on the whole batch with a ``NeighborListHook``
  (skin as given) and ``ConvergenceHook.from_fmax(fmax)``, stepped exactly as its
  ``run()`` does -- until every system meets the criterion at the same step, or
  ``max_steps``.  Forces are computed once before the first step (its ``run()``
  does not; without it the first step uses zero forces).  The step at which each
  system first met the criterion is recorded.
* ``nvt``: ``NVTLangevin`` (dt in fs, temperature in K, friction in 1/fs) for
  ``steps`` steps from the given velocities, forces computed before step 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback


def main() -> None:
    workload_path, params_path = sys.argv[1], sys.argv[2]
    with open(params_path) as f:
        params = json.load(f)
    import numpy as np
    import torch

    torch.set_num_threads(int(params["threads"]))
    t_import = time.perf_counter()
    from nvalchemi.data import AtomicData, Batch
    from nvalchemi.dynamics import FIRE, ConvergenceHook, DynamicsStage, NVTLangevin
    from nvalchemi.hooks import NeighborListHook
    from nvalchemi.models.lj import LennardJonesModelWrapper

    t_import = time.perf_counter() - t_import
    w = np.load(workload_path)
    ptr = w["ptr"]
    n_sys = len(ptr) - 1
    dtype = torch.float64

    def make_batch(velocities: np.ndarray | None) -> Batch:
        from ase import Atoms

        data = []
        for k in range(n_sys):
            lo, hi = int(ptr[k]), int(ptr[k + 1])
            atoms = Atoms(
                numbers=w["numbers"][lo:hi],
                positions=w["positions"][lo:hi],
                cell=w["cells"][k],
                pbc=bool(w["pbc"][k]),
            )
            data.append(AtomicData.from_atoms(atoms, dtype=dtype))
        b = Batch.from_data_list(data)
        n = b.num_nodes
        b["forces"] = torch.zeros(n, 3, dtype=dtype)
        v = (
            torch.zeros(n, 3, dtype=dtype)
            if velocities is None
            else torch.from_numpy(velocities).to(dtype)
        )
        b["velocities"] = v.clone()
        b["energy"] = torch.zeros(b.num_graphs, 1, dtype=dtype)
        return b

    lj = params["lj"]
    model = LennardJonesModelWrapper(epsilon=lj["epsilon"], sigma=lj["sigma"], cutoff=lj["cutoff"])

    def nl_hook() -> NeighborListHook:
        return NeighborListHook(
            model.model_config.neighbor_config,
            skin=float(params["skin"]),
            stage=DynamicsStage.BEFORE_COMPUTE,
        )

    def initial_forces(dyn, b) -> None:
        dyn._call_hooks(DynamicsStage.BEFORE_COMPUTE, b)
        dyn.compute(b)

    fire_p = params["fire"]

    def run_fire(max_steps: int) -> tuple[float, list[int], int]:
        b = make_batch(None)
        opt = FIRE(
            model,
            dt=fire_p["dt"],
            dt_max=fire_p["dtmax"],
            maxstep=fire_p["maxstep"],
            n_steps=max_steps,
            hooks=[nl_hook()],
            convergence_hook=ConvergenceHook.from_fmax(fire_p["fmax"]),
        )
        first = torch.full((n_sys,), -1, dtype=torch.long)
        t0 = time.perf_counter()
        initial_forces(opt, b)
        steps = 0
        for _ in range(max_steps):
            b, conv = opt.step(b)
            steps += 1
            if conv is not None:
                idx = conv.long()
                newly = idx[first[idx] < 0]
                first[newly] = steps
                if conv.numel() == b.num_graphs:  # run()'s stopping rule
                    break
        wall = time.perf_counter() - t0
        first[first < 0] = steps
        return wall, first.tolist(), steps

    nvt_p = params["nvt"]

    def run_nvt(steps: int) -> float:
        b = make_batch(w["velocities"])
        dyn = NVTLangevin(
            model,
            dt=nvt_p["dt"],
            temperature=nvt_p["temperature"],
            friction=nvt_p["friction"],
            random_seed=0,
            n_steps=steps,
            hooks=[nl_hook()],
        )
        t0 = time.perf_counter()
        initial_forces(dyn, b)
        dyn.run(b, n_steps=steps)
        wall = time.perf_counter() - t0
        if not torch.isfinite(b.positions).all():
            raise RuntimeError("nvalchemi NVT produced non-finite positions")
        return wall

    out: dict = {"import_s": t_import, "versions": {}}
    import importlib.metadata as md

    for dist in ("nvalchemi-toolkit", "nvalchemi-toolkit-ops", "warp-lang", "numpy", "torch"):
        with contextlib.suppress(md.PackageNotFoundError):
            out["versions"][dist] = md.version(dist)
    t0 = time.perf_counter()
    run_fire(5)  # warm-up: Warp kernels, torch.compile of the neighbour-list hook
    run_nvt(5)
    out["warmup_s"] = time.perf_counter() - t0
    repeats = int(params["repeats"])
    if "fire" in params["modes"]:
        walls, first, steps = [], None, None
        for _ in range(repeats):
            wall, first, steps = run_fire(int(fire_p["max_steps"]))
            walls.append(wall)
        out["fire"] = {"walls": walls, "first_converged_step": first, "steps": steps}
    if "nvt" in params["modes"]:
        out["nvt"] = {
            "walls": [run_nvt(int(nvt_p["steps"])) for _ in range(repeats)],
            "steps": int(nvt_p["steps"]),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # report, do not crash the harness
        traceback.print_exc()
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        sys.stdout.flush()
        os._exit(0)
