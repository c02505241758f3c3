"""nvalchemi-toolkit side of the benchmarks: runs in its own virtual environment.

Not meant to be run by hand: a benchmark script writes the workload (positions,
cells, atomic numbers, ...) to an ``.npz`` file and calls::

    <venv>/bin/python bench/_nvalchemi_worker.py WORKLOAD.npz PARAMS.json

with the python of the environment made by ``bench/setup_peers.sh`` (scripts other
than ``bench_dynamics.py`` do that through :func:`call_worker`, at the end of this
file).  The last line of stdout is one JSON object with the timings (or
``{"error": ...}``).
``PARAMS["task"]`` picks what is run: ``"dynamics"`` (the default, for
``bench_dynamics.py``), ``"lj_forces"`` (``bench_lj_forces.py``) or
``"neighbors"`` (``bench_neighbors.py``); the last two are described at
:func:`run_lj_forces` and :func:`run_neighbors`.

``dynamics``: what is timed (wall clock, median of ``repeats`` after one short
warm-up run that pays Warp's kernel compilation and the torch.compile of the
neighbour-list hook):

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


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for dist in ("nvalchemi-toolkit", "nvalchemi-toolkit-ops", "warp-lang", "numpy", "torch"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    return out


def main() -> None:
    workload_path, params_path = sys.argv[1], sys.argv[2]
    with open(params_path) as f:
        params = json.load(f)
    import torch

    torch.set_num_threads(int(params["threads"]))
    task = params.get("task", "dynamics")
    if task == "lj_forces":
        out = run_lj_forces(workload_path, params)
    elif task == "neighbors":
        out = run_neighbors(workload_path, params)
    else:
        out = run_dynamics(workload_path, params)
    print(json.dumps(out))


def run_dynamics(workload_path: str, params: dict) -> dict:
    import numpy as np
    import torch

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

    out: dict = {"import_s": t_import, "versions": versions()}
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
    return out


def _time(fn, repeats: int) -> list[float]:
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    return walls


def run_lj_forces(workload_path: str, params: dict) -> dict:
    """Bare LJ energy + forces of a batch with ``LennardJonesModelWrapper``.

    Workload arrays: ``ptr``, ``numbers``, ``positions``, ``cells`` ``[B, 3, 3]``,
    ``pbc`` ``[B, 3]``.  Params: ``lj`` (epsilon, sigma, cutoff), ``skin``,
    ``repeats``, ``n_check`` (systems whose energies and forces are returned for the
    caller to check against ASE).  A call of each mode, timed after a warm-up
    (Warp's kernel compilation, the hook's torch.compile):

    * ``rebuild``: ``NeighborListHook`` with skin 0 (its default: the list is
      rebuilt on every call), then the model forward;
    * ``reused_hook``: ``NeighborListHook`` with the given skin, positions unchanged,
      so its Verlet check keeps the list (what a dynamics step with a skin costs),
      then the forward;
    * ``forward``: the model forward alone on the list already in the batch.

    The hook is called as nvalchemi's dynamics call it, ``hook(ctx, stage)``.
    """
    import numpy as np
    import torch
    from ase import Atoms

    t_import = time.perf_counter()
    from nvalchemi.data import AtomicData, Batch
    from nvalchemi.dynamics import DynamicsStage
    from nvalchemi.hooks import NeighborListHook
    from nvalchemi.hooks._context import HookContext
    from nvalchemi.models.lj import LennardJonesModelWrapper

    t_import = time.perf_counter() - t_import
    w = np.load(workload_path)
    ptr = w["ptr"]
    n_sys = len(ptr) - 1
    dtype = torch.float64
    data = []
    for k in range(n_sys):
        lo, hi = int(ptr[k]), int(ptr[k + 1])
        atoms = Atoms(
            numbers=w["numbers"][lo:hi],
            positions=w["positions"][lo:hi],
            cell=w["cells"][k],
            pbc=w["pbc"][k],
        )
        data.append(AtomicData.from_atoms(atoms, dtype=dtype))
    b = Batch.from_data_list(data)
    b["forces"] = torch.zeros(b.num_nodes, 3, dtype=dtype)
    b["energy"] = torch.zeros(b.num_graphs, 1, dtype=dtype)
    lj = params["lj"]
    model = LennardJonesModelWrapper(epsilon=lj["epsilon"], sigma=lj["sigma"], cutoff=lj["cutoff"])
    stage = DynamicsStage.BEFORE_COMPUTE
    ctx = HookContext(batch=b, model=model)
    hooks = {
        "rebuild": NeighborListHook(model.model_config.neighbor_config, skin=0.0, stage=stage),
        "reused_hook": NeighborListHook(
            model.model_config.neighbor_config, skin=float(params["skin"]), stage=stage
        ),
    }
    repeats = int(params["repeats"])
    out: dict = {"import_s": t_import, "versions": versions(), "walls": {}}
    t0 = time.perf_counter()
    results = {}
    for mode, hook in hooks.items():
        hook(ctx, stage)  # first call: compiles
        res = model(b)
        results[mode] = res

        def call(hook=hook) -> None:
            hook(ctx, stage)
            model(b)

        call()  # warm-up
        out["walls"][mode] = _time(call, repeats)
        if mode == "reused_hook":
            flags = hook._rebuild_flags
            out["reused_rebuilds"] = None if flags is None else int(flags.sum())
            out["method"] = hook._neighbor_list_method
            out["max_neighbors"] = int(b.neighbor_matrix.shape[1])
            out["full_pairs_in_list"] = int(b.num_neighbors.sum())
    model(b)
    out["walls"]["forward"] = _time(lambda: model(b), 3 * repeats)
    out["warmup_s"] = time.perf_counter() - t0 - sum(sum(v) for v in out["walls"].values())
    n_check = int(params["n_check"])
    check_atoms = int(ptr[n_check])
    for mode, res in results.items():
        out[f"check_{mode}"] = {
            "energy": res["energy"].reshape(-1)[:n_check].tolist(),
            "forces": res["forces"][:check_atoms].tolist(),
        }
    return out


def run_neighbors(workload_path: str, params: dict) -> dict:
    """Neighbour-list builds with ``nvalchemiops.torch.neighbors.neighbor_list``.

    Params: ``cases``, a list of ``{"name", "radius", "repeats", "max_neighbors",
    "budget_s"}``; case ``k``'s arrays are ``{k}_positions``, ``{k}_cells``
    ``[B, 3, 3]``, ``{k}_pbc`` ``[B, 3]`` and ``{k}_ptr`` in the workload.  Each
    build is a half list (``half_fill=True``) in nvalchemi's native matrix format,
    method chosen by nvalchemi (``method=None``), ``max_neighbors`` given (it sizes
    the matrix).  Reported per case: the pair count (``num_neighbors.sum()``), the
    method it picks, and the build times after one warm-up build; a case stops
    early when its builds have taken ``budget_s``.
    """
    import numpy as np
    import torch

    t_import = time.perf_counter()
    from nvalchemiops.torch.neighbors import neighbor_list

    try:
        from nvalchemiops.torch.neighbors import suggest_neighbor_list_method
    except ImportError:  # pragma: no cover - depends on the ops version
        suggest_neighbor_list_method = None
    t_import = time.perf_counter() - t_import
    w = np.load(workload_path)
    out: dict = {"import_s": t_import, "versions": versions(), "cases": []}
    for k, case in enumerate(params["cases"]):
        ptr = torch.from_numpy(w[f"{k}_ptr"]).to(torch.int32)
        pos = torch.from_numpy(w[f"{k}_positions"]).to(torch.float64)
        cell = torch.from_numpy(w[f"{k}_cells"]).to(torch.float64)
        pbc = torch.from_numpy(w[f"{k}_pbc"]).to(torch.bool)
        counts = (ptr[1:] - ptr[:-1]).to(torch.long)
        batch_idx = torch.repeat_interleave(torch.arange(len(counts)), counts).to(torch.int32)
        radius = float(case["radius"])
        kwargs = {
            "cell": cell,
            "pbc": pbc,
            "batch_ptr": ptr,
            "batch_idx": batch_idx,
            "half_fill": True,
            "max_neighbors": int(case["max_neighbors"]),
        }
        method = "auto"
        if suggest_neighbor_list_method is not None:
            with contextlib.suppress(Exception):
                method = suggest_neighbor_list_method(
                    ptr,
                    cell,
                    pbc,
                    radius,
                    batch_idx=batch_idx,
                    half_fill=True,
                    positions_dtype=pos.dtype,
                )
        res: dict = {"name": case["name"], "method": method}
        try:
            t0 = time.perf_counter()
            r = neighbor_list(pos, radius, **kwargs)  # warm-up (Warp compiles on first use)
            res["first_s"] = time.perf_counter() - t0
            res["pairs"] = int(r[1].sum())
            res["max_row"] = int(r[1].max()) if len(r[1]) else 0
            walls: list[float] = []
            while len(walls) < int(case["repeats"]) and sum(walls) < float(case["budget_s"]):
                t0 = time.perf_counter()
                neighbor_list(pos, radius, **kwargs)
                walls.append(time.perf_counter() - t0)
            res["walls"] = walls
        except Exception as exc:  # one case failing does not lose the others
            res["error"] = f"{type(exc).__name__}: {exc}"[:300]
        out["cases"].append(res)
        r = None  # free the matrix before the next case
    return out


# --------------------------------------------------------------------------- host side
# Imported by the benchmark scripts (main environment) to run this file in the venv.
def nvalchemi_python():
    """The nvalchemi venv's python: $ALCHEMI_BENCH_NVALCHEMI_PYTHON, else
    $ALCHEMI_BENCH_VENVS/nvalchemi/bin/python (default /tmp/alchemi_bench_venvs)."""
    from pathlib import Path

    explicit = os.environ.get("ALCHEMI_BENCH_NVALCHEMI_PYTHON")
    if explicit:
        return Path(explicit)
    root = Path(os.environ.get("ALCHEMI_BENCH_VENVS", "/tmp/alchemi_bench_venvs"))
    return root / "nvalchemi" / "bin" / "python"


def call_worker(arrays: dict, params: dict, timeout: float = 1800.0) -> tuple[dict | None, str]:
    """Run this worker in the nvalchemi venv on ``arrays`` (saved as the .npz
    workload) and ``params``; return (its JSON result, "") or (None, why not)."""
    import subprocess
    import tempfile
    from pathlib import Path

    import numpy as np

    py = nvalchemi_python()
    if not py.exists():
        return None, (
            f"skipped -- no environment at {py} "
            "(run `bash bench/setup_peers.sh`, or set ALCHEMI_BENCH_NVALCHEMI_PYTHON)"
        )
    with tempfile.TemporaryDirectory(prefix="alchemi_bench_") as tmp:
        np.savez(Path(tmp) / "w.npz", **arrays)
        (Path(tmp) / "p.json").write_text(json.dumps(params))
        env = {**os.environ, "OMP_NUM_THREADS": str(params.get("threads", 1))}
        try:
            proc = subprocess.run(
                [
                    str(py),
                    os.path.abspath(__file__),
                    str(Path(tmp) / "w.npz"),
                    str(Path(tmp) / "p.json"),
                ],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                cwd=tmp,
            )
        except subprocess.TimeoutExpired:
            return None, f"skipped -- its run took more than {timeout:.0f} s"
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return None, f"failed (exit {proc.returncode}): {' | '.join(tail)}"
    res = json.loads(lines[-1])
    if "error" in res:
        return None, f"failed: {res['error']}"
    return res, ""


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # report, do not crash the harness
        traceback.print_exc()
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        sys.stdout.flush()
        os._exit(0)
