"""Workloads and helpers shared by the benchmarks in this folder.

Import from a benchmark script run as ``python bench/<name>.py`` (the script's folder
is on ``sys.path``): ``from common import argon_set, ARGON_LJ, time_call``.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import records

#: Argon fcc lattice constant (Å) and the Lennard-Jones parameters used throughout.
ARGON_A = 5.26
ARGON_LJ: dict[str, float] = {"epsilon": 0.0104, "sigma": 3.40, "cutoff": 8.5}


def argon_set(n_systems: int = 64, repeat: int = 3, noise: float = 0.1, seed: int = 0) -> list[Any]:
    """``n_systems`` perturbed fcc argon crystals (cubic cell, ``4 * repeat**3`` atoms).

    Gaussian noise of ``noise`` Å on every coordinate, from one seeded generator, so
    the set is identical on every machine.  Default: 64 systems of 108 atoms.
    """
    from ase.build import bulk

    rng = np.random.default_rng(seed)
    base = bulk("Ar", "fcc", a=ARGON_A, cubic=True).repeat(repeat)
    out = []
    for _ in range(n_systems):
        atoms = base.copy()
        atoms.positions += rng.normal(scale=noise, size=atoms.positions.shape)
        out.append(atoms)
    return out


def setup_threads(n: int = 2) -> None:
    """Pin torch's intra-op threads (and BLAS/OpenMP threads of later imports)."""
    import torch

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, str(n))
    torch.set_num_threads(n)


def time_call(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def timed_into(fn: Callable[..., Any], totals: dict[str, Any], device: str = "cpu") -> Callable:
    """``fn`` wrapped so that the wall time of each call adds to ``totals["s"]`` (on a GPU
    the device is synchronised around each call, so its kernels count): how the
    benchmarks time the hooks of constraints and observables inside a run."""
    import functools

    import torch

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if device == "cuda":
                torch.cuda.synchronize()
            totals["s"] += time.perf_counter() - start

    return run


def median(times: Sequence[float]) -> float:
    return statistics.median(times)


def package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment_line() -> str:
    """One line naming the machine and the library versions a result depends on."""
    import torch

    parts = [
        f"python {platform.python_version()}",
        f"torch {torch.__version__} ({torch.get_num_threads()} threads)",
        f"numpy {np.__version__}",
    ]
    for dist in ("ase", "vesin", "torch-sim-atomistic"):
        v = package_version(dist)
        if v:
            parts.append(f"{dist} {v}")
    return f"{platform.machine()} {platform.processor() or ''}".strip() + " | " + ", ".join(parts)


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None
) -> str:
    """Plain fixed-width table (left-aligned text, right-aligned numbers), also kept as a
    JSON record for the documentation (``records``: written when the script ends)."""
    records.add(headers, rows, title)
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[k]) for r in cells) for k in range(len(headers))]
    numeric = [all(_is_number(r[k]) for r in cells[1:]) for k in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric)
        ).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", "").rstrip("x"))
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- workloads
def mixed_noise_argon(
    n_systems: int = 96,
    repeat: int = 3,
    noises: Sequence[float] = (0.02, 0.1, 0.3, 0.5, 0.7),
    seed: int = 0,
) -> list[Any]:
    """fcc argon crystals whose perturbation (and so relaxation length) varies widely.

    System ``k`` gets Gaussian noise of ``noises[k % len(noises)]`` Å (cycled, so every
    chunk of consecutive systems mixes easy and hard relaxations).  Default: 96
    crystals of 108 atoms.
    """
    from ase.build import bulk

    rng = np.random.default_rng(seed)
    base = bulk("Ar", "fcc", a=ARGON_A, cubic=True).repeat(repeat)
    out = []
    for k in range(n_systems):
        atoms = base.copy()
        atoms.positions += rng.normal(scale=noises[k % len(noises)], size=atoms.positions.shape)
        out.append(atoms)
    return out


def small_argon(
    n_systems: int = 20_000, min_atoms: int = 8, max_atoms: int = 32, seed: int = 0
) -> list[Any]:
    """Many small argon systems (clusters and small periodic crystals) for the soak test:
    :func:`alchemi_lit.data.mixed_argon` with sizes between ``min_atoms`` and ``max_atoms``."""
    from alchemi_lit.data import mixed_argon

    return mixed_argon(n_systems=n_systems, min_atoms=min_atoms, max_atoms=max_atoms, seed=seed)


# --------------------------------------------------------------------------- measuring
def median_of(values: Sequence[float]) -> float:
    return statistics.median(values)


def _proc_jiffies() -> tuple[int, int]:
    """(busy jiffies of the whole machine, jiffies of this process and its children)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    busy = sum(fields[:8]) - idle
    with open("/proc/self/stat") as f:
        st = f.read().rsplit(")", 1)[1].split()
    mine = sum(int(x) for x in st[11:15])  # utime stime cutime cstime
    return busy, mine


def external_cpu_load(window: float = 3.0) -> float | None:
    """Cores kept busy by *other* processes over ``window`` seconds (None off Linux)."""
    try:
        b0, m0 = _proc_jiffies()
        time.sleep(window)
        b1, m1 = _proc_jiffies()
    except (OSError, ValueError, IndexError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    return max(0.0, ((b1 - b0) - (m1 - m0)) / hz / window)


class LoadGate:
    """Wait for a quiet machine before each measurement (the machine is shared).

    ``wait()`` polls every ``poll`` s until the 1-minute load average is below
    ``max_load`` *and* other processes use less than 0.5 core over a 3 s window, or --
    since our own previous measurement keeps the 1-minute average up for a minute after
    it ends -- until other processes use less than 0.3 core.  All waits of one process
    share a budget of ``max_wait`` s; once it is spent, measurements go ahead at once
    and :attr:`under_load` marks the results.
    """

    def __init__(
        self,
        max_load: float = 1.5,
        poll: float = 10.0,
        max_wait: float = 600.0,
        enabled: bool = True,
    ) -> None:
        self.max_load, self.poll, self.budget, self.enabled = max_load, poll, max_wait, enabled
        self.under_load = False
        self.loads: list[float] = []  # 1-min load average at each measurement

    def wait(self, label: str = "") -> float:
        """Block until quiet (or the budget is spent); return and record the 1-min load."""
        t0 = time.perf_counter()
        quiet = not self.enabled
        while not quiet:
            load = os.getloadavg()[0]
            ext = external_cpu_load(3.0)
            # loadavg alone is not enough: one busy neighbour (1 core) keeps it near 1.0 yet
            # slows 2-thread torch ops several-fold (measured); loadavg alone is too strict
            # right after our own previous measurement.  So: below max_load with others
            # using < 0.5 core, or others using < 0.3 core whatever the average says.
            if ext is None:
                if load < self.max_load:
                    quiet = True
                    break
            elif (load < self.max_load and ext < 0.5) or ext < 0.3:
                quiet = True
                break
            if time.perf_counter() - t0 + self.poll > self.budget:
                break
            print(
                f"  [waiting for a quiet machine{': ' + label if label else ''}: load "
                f"{load:.2f}, others use {ext if ext is not None else float('nan'):.2f} cores]",
                flush=True,
            )
            time.sleep(self.poll)
        self.budget = max(0.0, self.budget - (time.perf_counter() - t0))
        if self.enabled and not quiet:
            self.under_load = True
        load = os.getloadavg()[0]
        self.loads.append(load)
        return load

    def status_line(self) -> str:
        loads = ", ".join(f"{x:.2f}" for x in self.loads) or "n/a"
        mark = "MEASURED UNDER LOAD -- " if self.under_load else ""
        return f"{mark}1-min load average at each measurement: {loads}"


def gate_arguments(parser: Any) -> None:
    """Add the shared --max-load / --max-wait / --no-wait options to an argparse parser."""
    parser.add_argument(
        "--max-load",
        type=float,
        default=1.5,
        help="wait until the 1-min load average is below this (default 1.5)",
    )
    parser.add_argument(
        "--max-wait",
        type=float,
        default=600.0,
        help="seconds of waiting for a quiet machine, all measurements together",
    )
    parser.add_argument("--no-wait", action="store_true", help="measure at once, whatever the load")


def gate_from(args: Any) -> LoadGate:
    return LoadGate(args.max_load, 10.0, args.max_wait, enabled=not args.no_wait)


def rss_mb() -> float:
    """Current resident set size of this process in MiB (psutil if installed, else /proc)."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far in MiB (VmHWM)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class HostSyncCounter:
    """Count calls that read a tensor value on the host (a device sync on GPU).

    While active, ``torch.Tensor.item``, ``tolist``, ``__bool__``, ``__int__``,
    ``__float__``, ``__index__`` and ``numpy`` are wrapped; :attr:`calls` counts them
    and :attr:`sites` names the first frame outside torch that made each call
    (file:line).  Python-level calls only: which is exactly where framework code
    could hide a sync.
    """

    NAMES = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")

    def __init__(self) -> None:
        self.calls = 0
        self.sites: dict[str, int] = {}
        self._saved: dict[str, Any] = {}
        self.active = False

    def __enter__(self) -> HostSyncCounter:
        import torch

        for name in self.NAMES:
            orig = getattr(torch.Tensor, name)
            self._saved[name] = orig
            setattr(torch.Tensor, name, self._wrap(name, orig))
        self.active = True
        return self

    def _wrap(self, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        import sys

        counter = self

        def wrapper(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if counter.active:
                counter.calls += 1
                frame = sys._getframe(1)
                while frame is not None and "/torch/" in frame.f_code.co_filename:
                    frame = frame.f_back
                where = (
                    "?"
                    if frame is None
                    else (f"{os.path.relpath(frame.f_code.co_filename)}:{frame.f_lineno} ({name})")
                )
                counter.sites[where] = counter.sites.get(where, 0) + 1
            return orig(tensor, *args, **kwargs)

        return wrapper

    def pause(self) -> None:
        self.active = False

    def resume(self) -> None:
        self.active = True

    def __exit__(self, *exc: Any) -> None:
        import torch

        for name, orig in self._saved.items():
            setattr(torch.Tensor, name, orig)
        self.active = False


def load_line() -> str:
    la = os.getloadavg()
    return f"load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}"


# --------------------------------------------------------------------------- TorchSim
def torchsim_lj(dtype: Any, halved: bool = True) -> Any:
    """TorchSim's ``LennardJonesModel`` with :data:`ARGON_LJ`, its forces halved (0.3.x
    returns them exactly 2x too large: a full neighbour list counted twice) -- check with
    :func:`torchsim_force_error` before timing.  ``type(model).evals`` counts the atoms
    passed through it.  ``halved=False``: the model as TorchSim ships it."""
    import torch
    from torch_sim.models.lennard_jones import LennardJonesModel

    class HalvedLJ(LennardJonesModel):
        evals = 0

        def forward(self, state: Any) -> Any:
            out = super().forward(state)
            out["forces"] = 0.5 * out["forces"]
            HalvedLJ.evals += int(state.n_atoms)
            return out

    return (HalvedLJ if halved else LennardJonesModel)(
        sigma=ARGON_LJ["sigma"],
        epsilon=ARGON_LJ["epsilon"],
        cutoff=ARGON_LJ["cutoff"],
        device=torch.device("cpu"),
        dtype=dtype,
        compute_stress=False,
    )


def torchsim_force_error(model: Any, atoms: Sequence[Any], dtype: Any) -> float:
    """Largest |F - F_ASE| (eV/Å) of a TorchSim model on ``atoms``, against ASE's LJ."""
    import torch
    import torch_sim as ts
    from ase.calculators.lj import LennardJones as AseLJ

    forces = model(ts.io.atoms_to_state(list(atoms), torch.device("cpu"), dtype))["forces"]
    ref = []
    for a in atoms:
        c = a.copy()
        c.calc = AseLJ(epsilon=ARGON_LJ["epsilon"], sigma=ARGON_LJ["sigma"], rc=ARGON_LJ["cutoff"])
        ref.append(c.get_forces())
    return float(np.abs(forces.numpy() - np.concatenate(ref)).max())


def torchsim_fire(atoms: Sequence[Any], model: Any, dtype: Any, fmax: float, max_steps: int) -> Any:
    """``ts.optimize`` with TorchSim's FIRE in ASE's flavour and parameters (dt 0.1, dtmax
    1.0, maxstep 0.2) and a force criterion; all systems in one state."""
    import torch
    import torch_sim as ts
    from torch_sim.runners import generate_force_convergence_fn

    return ts.optimize(
        ts.io.atoms_to_state(list(atoms), torch.device("cpu"), dtype),
        model,
        optimizer=ts.optimizers.fire,
        convergence_fn=generate_force_convergence_fn(force_tol=fmax, include_cell_forces=False),
        max_steps=max_steps,
        md_flavor="ase_fire",
        dt_start=0.1,
        dt_max=1.0,
        max_step=0.2,
    )
