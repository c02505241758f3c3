"""Building the pairs of a batch's neighbour lists (what :class:`~.neighbors.NeighborList`
rebuilds): vesin on CPU, an all-pairs test for small molecules and for periodic cells
narrower than twice the radius, and on an accelerator (wherever reading a value on the
host is not free) one batched cell list for all systems (:mod:`.cell_list`), in one
canonical edge order.

How and why these paths were chosen (and measured) is in the module docstring of
:mod:`.neighbors` and in BENCHMARKS.md.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from ..core.geometry import all_pairs_candidates, all_pairs_suit, count_pairs, molecule_pairs
from ..core.state import Batch
from ..core.tensor_ops import host_reads_free, rows_times
from .cell_list import batched_pairs
from .edges import canonical_order
from .small_cells import canonical_system, small_cell_plan, small_cell_system

#: glibc's largest dynamic mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX), less
#: a margin for the chunk header and alignment
_MMAP_THRESHOLD_MAX = 31 * 2**20
_heap_primed = 0


def keep_edge_temporaries_on_heap(num_edges: int) -> None:
    """Free one untouched block of ``72 * num_edges`` bytes (32 MiB at most), once per size.

    A model call allocates per-edge temporaries of a few MB (the edge vectors alone are
    24 bytes an edge).  glibc serves blocks above its mmap threshold with fresh ``mmap``
    pages, and trims the heap when more than twice that threshold is free at its top, so
    with the default threshold every call page-faults its temporaries in again, which
    slows a reused-list LJ call down markedly, depending on what the last rebuild left
    on the heap (figures in BENCHMARKS.md, "LJ energy + forces").
    glibc raises the threshold to the size of the largest mmapped block freed, so
    freeing one such block here (``torch.empty`` does not touch its pages, so this is
    cheap) keeps the temporaries on the heap.  The previous builder did this by accident
    (a 72-byte-an-edge gather of the cells); elsewhere than glibc it is a no-op.
    """
    global _heap_primed
    size = min(72 * num_edges, _MMAP_THRESHOLD_MAX)
    if size <= _heap_primed or size < 2**20:
        return
    torch.empty(size, dtype=torch.uint8)  # allocated and freed at once
    _heap_primed = size


def flat3(j: torch.Tensor) -> torch.Tensor:
    """Flat indices ``3 j + (0, 1, 2)`` of the xyz components of atoms ``j``."""
    return ((3 * j).unsqueeze(-1) + torch.arange(3, device=j.device)).reshape(-1)


def batch_pair_counts(batch: Batch, radius: float) -> list[int]:
    """:func:`count_pairs` for every system of a batch."""
    host = batch.to(device="cpu", dtype=torch.float64)
    ptr = host.ptr.tolist()
    return [
        count_pairs(
            host.positions[ptr[b] : ptr[b + 1]].numpy(),
            host.cell[b].numpy(),
            host.pbc[b].tolist(),
            radius,
        )
        for b in range(host.num_systems)
    ]


def build_rows(batch: Batch, rows: list[int], radius: float):
    """Pairs of the given system rows: (i, j, cartesian shift, system row, integer shift).

    Edges come in canonical order -- systems ascending, then (i, j, shift) -- the
    order :func:`canonical_order` gives.  On CPU a system is built either by vesin
    (then sorted on its own: a few thousand pairs, in cache) or, for a small
    periodic cell, by :func:`small_cell_system`, which yields vesin's pairs in
    canonical order; the result is the same to the bit whichever path and however
    many threads (see the module doc).  Where host reads are not free (an accelerator,
    or CPU under ``tensor_ops.CPU_READS_FREE = False``) every row is built in one batched
    pass, :func:`~.cell_list.batched_pairs`: the same edges, to the bit.
    """
    device, dtype = batch.device, batch.dtype
    if not host_reads_free(batch.positions):
        mask = torch.zeros(batch.num_systems, dtype=torch.bool, device=device)
        mask[torch.as_tensor(rows, dtype=torch.long, device=device)] = True
        return batched_pairs(batch, radius, mask)
    ptr = batch.ptr.tolist()
    cells = batch.cell.detach()
    pbcs = batch.pbc.tolist()
    pos_np = batch.positions.detach().to(torch.float64).numpy()
    cell_np = cells.to(torch.float64).numpy()
    rows = sorted(rows)
    plan = small_cell_plan(pos_np, cell_np, batch.pbc.numpy(), ptr, rows, radius)
    small = [(b, nmax) for b, nmax in zip(rows, plan) if nmax is not None and nmax != ()]
    tiny = [b for b, nmax in small if all_pairs_candidates(ptr[b + 1] - ptr[b], nmax) <= _TINY]
    parts: list = []
    if len(tiny) >= _TINY_MIN_SYSTEMS:  # one batched pass, not a set-up per system
        parts += _batched_parts(batch, tiny, radius)
        batched = set(tiny)
        small = [(b, nmax) for b, nmax in small if b not in batched]
    finite = [b for b, nmax in zip(rows, plan) if nmax is None]  # () = not finite: skipped
    molecules = [b for b in finite if all_pairs_suit(ptr[b + 1] - ptr[b], pbcs[b])]
    by_vesin = [b for b in finite if not all_pairs_suit(ptr[b + 1] - ptr[b], pbcs[b])]
    sizes = [ptr[b + 1] - ptr[b] for b in by_vesin]

    def vesin_part(chunk: list[int], n_threads: int = 1) -> list:
        return _vesin_rows(chunk, ptr, pos_np, cell_np, cells, pbcs, radius, n_threads)

    worker = None
    if small or molecules:
        if by_vesin:  # vesin's systems in a thread while this one does the others
            worker = _Worker(vesin_part, by_vesin)
            worker.start()
        for b, nmax in small:
            lo, hi = ptr[b], ptr[b + 1]
            built = small_cell_system(pos_np[lo:hi], cell_np[b], radius, nmax, lo, cells[b])
            parts.append((b, built))
        for b in molecules:
            lo, hi = ptr[b], ptr[b + 1]
            i, j, _ = molecule_pairs(pos_np[lo:hi], radius)
            zeros = np.zeros((len(i), 3), dtype=np.int64)
            parts.append((b, (i + lo, j + lo, zeros.astype(cells.numpy().dtype), zeros)))
    elif len(by_vesin) > 1 and sum(sizes) >= _THREADED_MIN_ATOMS and torch.get_num_threads() > 1:
        # two threads at most: vesin's calls serialise (see the module doc), so the
        # second thread only hides the sorting of one system behind a vesin call
        first, second = _split_rows(by_vesin, sizes, 2)
        worker = _Worker(vesin_part, second)
        worker.start()
        parts += vesin_part(first)
    elif by_vesin:
        # a single big system: vesin's own threads (below ~10k atoms they cost more
        # than they save)
        big = len(by_vesin) == 1 and sizes[0] >= _VESIN_THREADS_MIN_ATOMS
        parts += vesin_part(by_vesin, torch.get_num_threads() if big else 1)
    if worker is not None:
        parts += worker.result()
    if not parts:
        return _no_edges(device, dtype)
    parts.sort(key=lambda part: part[0])
    built = [part[1] for part in parts]
    i, j, cart, ishift = (
        torch.from_numpy(x[0] if len(x) == 1 else np.concatenate(x)) for x in zip(*built)
    )
    sizes_e = [len(x[0]) for x in built]
    system = torch.repeat_interleave(
        torch.tensor([part[0] for part in parts]), torch.tensor(sizes_e), output_size=len(i)
    )
    return i, j, cart, system, ishift


#: a small cell testing at most this many candidate pairs (pairs i <= j times images) is
#: "tiny": its per-system build is mostly fixed overhead, while the batched builder's
#: cost grows with the candidates (BENCHMARKS.md, "Neighbour lists of many tiny cells")
_TINY = 1_000
#: from this many tiny cells on, they are built in one batched pass
_TINY_MIN_SYSTEMS = 8


def _batched_parts(batch: Batch, rows: list[int], radius: float) -> list:
    """The rows' edges from :func:`~.cell_list.batched_pairs` (the same edges, to the
    bit), as one ``(row, (i, j, cart, ishift))`` numpy part per row."""
    mask = torch.zeros(batch.num_systems, dtype=torch.bool)
    mask[rows] = True
    i, j, cart, system, ishift = (x.numpy() for x in batched_pairs(batch, radius, mask))
    ends = np.searchsorted(system, rows, side="right")
    starts = np.searchsorted(system, rows, side="left")
    return [(b, (i[a:e], j[a:e], cart[a:e], ishift[a:e])) for b, a, e in zip(rows, starts, ends)]


#: below this many atoms in the systems vesin builds, one thread does it all
_THREADED_MIN_ATOMS = 2_000
#: a single system this large is built with vesin's own threads
_VESIN_THREADS_MIN_ATOMS = 10_000


class _Worker(threading.Thread):
    """A thread that runs ``fn(arg)`` and hands back its result (or raises its error)."""

    def __init__(self, fn: Any, arg: Any) -> None:
        super().__init__(daemon=True)
        self._fn, self._arg = fn, arg
        self._out: Any = None
        self._err: BaseException | None = None

    def run(self) -> None:
        try:
            self._out = self._fn(self._arg)
        except BaseException as err:  # re-raised in the calling thread
            self._err = err

    def result(self) -> Any:
        self.join()
        if self._err is not None:
            raise self._err
        return self._out


def _split_rows(rows: list[int], sizes: list[int], parts: int) -> list[list[int]]:
    """Cut ``rows`` into ``parts`` consecutive runs of about equal atoms (``parts`` <=
    ``len(rows)``)."""
    total = sum(sizes)
    out: list[list[int]] = [[]]
    acc = 0
    for k, (b, n) in enumerate(zip(rows, sizes)):
        left = len(rows) - k  # rows not placed yet, this one included
        if (
            out[-1]
            and len(out) < parts
            and (acc >= total * len(out) / parts or left == parts - len(out))
        ):
            out.append([])
        out[-1].append(b)
        acc += n
    return out


def _vesin_rows(
    rows: list[int],
    ptr: list[int],
    pos_np: np.ndarray,
    cell_np: np.ndarray,
    cells: torch.Tensor,
    pbcs: list[list[bool]],
    radius: float,
    n_threads: int = 1,
) -> list:
    """vesin half lists of ``rows`` (finite positions), each in canonical order:
    ``[(row, (i, j, cartesian shift, integer shift))]`` (numpy arrays)."""
    import vesin

    calc = vesin.NeighborList(cutoff=radius, full_list=False, n_threads=n_threads)
    parts = []
    for b in rows:
        lo, hi = ptr[b], ptr[b + 1]
        # copy=False: views of vesin's buffers, consumed before its next call
        i, j, sh = calc.compute(pos_np[lo:hi], cell_np[b], pbcs[b], "ijS", copy=False)
        parts.append((b, canonical_system(i, j, sh, hi - lo, lo, cells[b])))
    return parts


def build_rows_on_device(batch: Batch, rows: list[int], radius: float):
    """:func:`build_rows` with ``vesin-torch``, one call per system, on the batch's own
    device: the accelerator path before :mod:`.cell_list` (its launches grow with the
    systems), kept as the reference ``bench/bench_neighbors.py`` compares against.
    Edges in canonical order, as from :func:`build_rows`."""
    device, dtype = batch.device, batch.dtype
    ptr = batch.ptr.tolist()
    pos_all = batch.positions.detach()
    cells = batch.cell.detach()
    pbcs = batch.pbc.tolist()
    try:
        from vesin_torch import NeighborList as TorchNL
    except ImportError as exc:  # pragma: no cover - vesin-torch is a dependency
        raise ImportError(
            "neighbour lists on an accelerator need the vesin-torch package: "
            "pip install 'vesin-torch>=0.6'"
        ) from exc

    calc = TorchNL(cutoff=radius, full_list=False)
    finite = torch.isfinite(pos_all).all(-1).to(torch.int32)
    ok = torch.ones(len(ptr) - 1, dtype=torch.int32, device=device)
    ok = ok.scatter_reduce(0, batch.system_idx, finite, "amin").bool().tolist()
    parts_i, parts_j, parts_s, parts_sys = [], [], [], []
    for b in rows:
        if not ok[b]:
            continue  # a diverged system gets no edges; NaNGuard quarantines it
        lo, hi = ptr[b], ptr[b + 1]
        periodic = torch.tensor(pbcs[b], device=device)
        i, j, sh = calc.compute(pos_all[lo:hi], cells[b], periodic, "ijS")
        parts_i.append(i.to(torch.int64) + lo)
        parts_j.append(j.to(torch.int64) + lo)
        parts_s.append(sh.to(torch.int64))
        parts_sys.append(torch.full((len(i),), b, dtype=torch.int64, device=device))
    if not parts_i:
        return _no_edges(device, dtype)
    i, j, system, ishift = (
        torch.cat(parts_i),
        torch.cat(parts_j),
        torch.cat(parts_sys),
        torch.cat(parts_s),
    )
    order = canonical_order(i, j, ishift, len(pos_all))
    i, j, system, ishift = i[order], j[order], system[order], ishift[order]
    cart = rows_times(ishift.to(dtype), cells[system])
    return i, j, cart, system, ishift


def _no_edges(device: torch.device, dtype: torch.dtype):
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    return (
        empty,
        empty,
        torch.zeros((0, 3), dtype=dtype, device=device),
        empty,
        torch.zeros((0, 3), dtype=torch.int64, device=device),
    )
