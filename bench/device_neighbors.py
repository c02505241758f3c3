"""The accelerator path's neighbour-list builders (issue #26): ``bench_neighbors.py --device``.

Run (from the repository root)::

    python bench/bench_neighbors.py --device cuda      # on a GPU
    python bench/bench_neighbors.py --device cpu       # the same code on CPU tensors
    python bench/bench_neighbors.py --device cpu --quick   # smoke run: timings mean nothing

Workload: 64, 1 024 and 8 192 perturbed fcc argon crystals of 108 atoms (the LJ
benchmark's, ``common.argon_set``), half list within 9.5 Å (rc 8.5 + skin 1 Å),
float64.  Builders, both on the given device:

* ``per-system (vesin-torch)``: ``pair_search.build_rows_on_device``, one vesin-torch
  call per system, then the canonical sort (the GPU path before issue #26);
* ``batched cell list``: ``cell_list.batched_pairs``, every system in one pass.

Reported per build: median wall time (the device synchronised around it), the aten
operations launched and those among them that wait for the device (counted with a
``TorchDispatchMode``, as the tests count them), and on CUDA the peak memory.  The
batched builder's edges are checked against vesin's CPU builder (bit for bit) on the
smallest batch, and its pair count against the per-system builder's on every batch,
before anything is timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from common import argon_set, environment_line, format_table, median
from torch.utils._python_dispatch import TorchDispatchMode

from alchemi_lit import Batch
from alchemi_lit.core import geometry
from alchemi_lit.models import cell_list, small_cells
from alchemi_lit.models.pair_search import build_rows, build_rows_on_device
from alchemi_lit.testing.accelerator import waits_on_device

RADIUS = 9.5
SIZES = (64, 1_024, 8_192)
QUICK_SIZES = (4, 16)


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = self.syncs = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        self.ops += 1
        self.syncs += waits_on_device(name, args, kwargs)
        return func(*args, **kwargs)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(fn: Callable[[], Any], device: torch.device, repeats: int) -> dict[str, Any]:
    """Ops and syncs of one call, then the median wall time of ``repeats`` calls."""
    fn()  # warm-up (CUDA kernels, caches)
    with _Count() as count:
        fn()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    walls = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        walls.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {"s": median(walls), "ops": count.ops, "syncs": count.syncs, "peak_mb": peak}


def _check_against_vesin(batch: Batch, got: tuple) -> None:
    """The batched builder's edges equal vesin's CPU builder's, bit for bit."""
    cpu = batch.to("cpu")
    old = small_cells._SMALL_CELL_MAX_CANDIDATES, geometry._ALL_PAIRS_MAX_ATOMS
    small_cells._SMALL_CELL_MAX_CANDIDATES, geometry._ALL_PAIRS_MAX_ATOMS = -1, 0
    try:
        want = build_rows(cpu, list(range(cpu.num_systems)), RADIUS)
    finally:
        small_cells._SMALL_CELL_MAX_CANDIDATES, geometry._ALL_PAIRS_MAX_ATOMS = old
    for k, (g, w) in enumerate(zip(got, want)):
        g = g.cpu()
        same = torch.equal(g, w) if k != 2 else torch.allclose(g, w, rtol=0, atol=1e-12)
        assert same, f"batched cell list != vesin (output {k})"


def main(args: Any) -> int:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("# --device cuda: no CUDA device here")
        return 1
    sizes = QUICK_SIZES if args.quick else SIZES
    repeats = 1 if args.quick else args.max_repeats
    print(f"# device neighbour-list builders, half list within {RADIUS} Å, float64, {device}")
    print(f"# {environment_line()}" + ("; --quick: timings mean nothing" if args.quick else ""))
    rows = []
    for n in sizes:
        batch = Batch.from_atoms(argon_set(n), dtype=torch.float64, device=device)
        every = list(range(n))
        batched = cell_list.batched_pairs(batch, RADIUS)
        if n == sizes[0]:
            _check_against_vesin(batch, batched)
        builders = {
            "per-system (vesin-torch)": lambda b=batch, r=every: build_rows_on_device(b, r, RADIUS),
            "batched cell list": lambda b=batch: cell_list.batched_pairs(b, RADIUS),
        }
        pairs = len(batched[0])
        for name, fn in builders.items():
            if name.startswith("per-system") and n > args.per_system_max:
                rows.append((n, name, "-", "-", "-", "-", "-", "skipped (--per-system-max)"))
                continue
            found = len(fn()[0])
            assert found == pairs, f"{name}: {found} pairs, batched {pairs}"
            m = _measure(fn, device, repeats)
            peak = f"{m['peak_mb']:.0f}" if m["peak_mb"] is not None else "-"
            per_atom = m["s"] / batch.num_atoms * 1e9
            rows.append(
                (n, name, f"{pairs:,}", f"{m['s'] * 1e3:.1f}", f"{per_atom:.0f}",
                 m["ops"], m["syncs"], peak)
            )  # fmt: skip
            print(f"  {n:>6} systems  {name:<26} {m['s'] * 1e3:9.1f} ms", flush=True)
        del batch, batched
    print()
    headers = ["systems", "builder", "pairs", "ms/build", "ns/atom", "aten ops", "syncs"]
    headers.append("peak MiB")
    print(format_table(headers, rows))
    print()
    print(
        f"* the batched builder's edges equal vesin's CPU builder's bit for bit on "
        f"{sizes[0]} systems (cartesian shifts to 1e-12 Å: cuBLAS may round them differently)"
    )
    print(f"* candidates per pass: {cell_list.CANDIDATE_BUDGET:,} (more go in chunks)")
    print(
        "* syncs: aten operations that wait for the device (nonzero, item, ...); the "
        "per-system builder's .tolist() reads of ptr, pbc and finiteness are not among them"
    )
    return 0
