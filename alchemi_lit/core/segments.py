"""Per-system reductions and broadcasts over a batch's atoms, built once per layout.

Why a class: every integrator step sums per-atom values into their systems (FIRE's
power and norms, kinetic energies, centre-of-mass momenta) and spreads per-system
coefficients back onto atoms.  Done with generic kernels, these small operations cost
more than the arithmetic around them on CPU:

* sums into systems must not depend on the systems around them (a screening result
  may not depend on its batch mates), so on CPU they are run sums (:func:`run_sums`:
  ``segment_reduce``, or the numba kernel that adds in the same order and is faster),
  which add each system's values one after another from zero: a system's bits are those
  of its own values, whatever the processor.  (A sparse product with a matrix of ones was
  faster, but MKL's AVX-512 kernels group its terms by their position in the whole
  array: docs/design/45-batch-independence-by-construction.md.)  ``index_add_`` on CPU
  adds in index order too and is slower; on GPU it is as fast as anything and needs no
  set-up, so it is kept there (atomic additions: see that section for what holds).
* multiplying ``[N, 3]`` by a broadcast ``[N, 1]`` coefficient takes a slow
  broadcasting path on CPU, unlike an elementwise product of two ``[N, 3]`` tensors,
  so coefficients are gathered straight to ``[N, 3]`` (:meth:`to_xyz`): on CPU by
  NumPy's ``repeat``, which copies whole runs instead of gathering value by value,
  elsewhere by a gather with a per-component system index.

(Figures in docs/design/06-per-system-sums-and-broadcasts-in-the.md.)

The helpers are exact sums (no cumulative-sum tricks), in the same order as
``index_add_`` on CPU, so both agree bit for bit.  A
:class:`~alchemi_lit.core.state.Batch` keeps one instance per atom layout
(``batch.segments``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np
import torch

from .backends import primitive
from .tensor_ops import host_reads_free, kept, numpy_viewable


class Segments:
    """Sums over, and broadcasts onto, the atoms of each system of one batch layout."""

    def __init__(self, system_idx: torch.Tensor, n_atoms: torch.Tensor) -> None:
        self.system_idx = system_idx
        self.num_systems = int(n_atoms.shape[0])
        self.num_atoms = int(system_idx.shape[0])
        self.on_cpu = host_reads_free(system_idx)  # (the CPU's shortcuts read values)
        self._n_atoms = n_atoms
        self._xyz_idx: torch.Tensor | None = None
        self._xyz_counts: np.ndarray | None = None
        self._xyz_lengths: torch.Tensor | None = None
        self._xyz_of: tuple[torch.Tensor, int, torch.Tensor] | None = None
        self._derived: dict[Hashable, torch.Tensor] = {}
        self._local: torch.Tensor | None = None
        self._starts: torch.Tensor | None = None
        self._bounds: tuple[np.ndarray, np.ndarray] | None = None

    # ----------------------------------------------------------------- sums
    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Per-atom ``[N]`` or ``[N, k]`` values summed into systems ``[B]`` / ``[B, k]``."""
        if self.on_cpu and values.is_floating_point() and self.num_atoms:
            return run_sums(values, self._n_atoms)
        out = values.new_zeros((self.num_systems, *values.shape[1:]))
        return out.index_add_(0, self.system_idx, values)

    def sum_xyz(self, values: torch.Tensor) -> torch.Tensor:
        """All components of per-atom ``[N, 3]`` values summed into systems ``[B]``.

        ``sum_xyz(v * f)`` is the per-system dot product of two ``[N, 3]`` fields,
        without the row sum in between.
        """
        if self.on_cpu and values.is_floating_point() and self.num_atoms:
            return run_sums(values.reshape(-1), self.xyz_lengths)
        flat = values.reshape(-1)
        return flat.new_zeros(self.num_systems).index_add_(0, self.xyz_index, flat)

    # ----------------------------------------------------------- broadcasts
    def to_atoms(self, per_system: torch.Tensor) -> torch.Tensor:
        """``[B, ...]`` per-system values gathered onto atoms ``[N, ...]``."""
        return per_system.index_select(0, self.system_idx)

    def to_xyz(self, *per_system: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``[B]`` per-system values, each as a contiguous ``[N, 3]`` tensor, for
        elementwise products with positions, velocities or forces."""
        n = self.num_atoms
        if self.on_cpu and _same_plain_dtype(per_system):
            # NumPy's repeat copies runs (cheaper than a gather here; one call for all)
            rows = np.stack([c.numpy() for c in per_system])
            spread = np.repeat(rows, self.xyz_counts, axis=1)
            return tuple(torch.from_numpy(r).view(n, 3) for r in spread)
        idx = self.xyz_index  # (one 1-D gather each: a gather along a 2-D tensor's dim 1 is slow)
        return tuple(c.index_select(0, idx).view(n, 3) for c in per_system)

    def atom_xyz(self, per_atom: torch.Tensor) -> torch.Tensor:
        """A per-atom ``[N]`` field (masses) as a contiguous ``[N, 3]`` tensor.

        Kept for the last field asked for, until that tensor is replaced or written
        to, so an MD step divides forces by masses without a broadcast.
        """
        memo = kept(self._xyz_of, per_atom, lambda t: t.unsqueeze(-1).expand(-1, 3).contiguous())
        if memo is not self._xyz_of:  # a new spread: what was derived from the old goes
            self._xyz_of, self._derived = memo, {}
        return memo[2]

    def derived_xyz(
        self, per_atom: torch.Tensor, key: Hashable, make: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """``make(atom_xyz(per_atom))``, kept under ``key`` as long as :meth:`atom_xyz`
        keeps its spread: an MD step's ``dt / 2m`` or ``sigma / sqrt(m)`` are then one
        tensor for the whole run instead of one or two passes over the atoms a step."""
        spread = self.atom_xyz(per_atom)
        value = self._derived.get(key)
        if value is None:
            if len(self._derived) >= _MAX_DERIVED:  # e.g. a time step that changes each call
                self._derived.clear()
            value = self._derived[key] = make(spread)
        return value

    @property
    def starts(self) -> torch.Tensor:
        """Index of each system's first atom, ``[B]``."""
        if self._starts is None:
            self._starts = torch.cumsum(self._n_atoms, 0) - self._n_atoms
        return self._starts

    @property
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Each system's first atom and atom count as NumPy int64 arrays ``[B]`` (CPU
        runs only): the loop bounds of the compiled CPU kernels (:mod:`~alchemi_lit.kernels`)."""
        if self._bounds is None:
            counts = self._n_atoms.to(torch.int64).numpy()
            self._bounds = (np.cumsum(counts) - counts, counts)
        return self._bounds

    @property
    def local_index(self) -> torch.Tensor:
        """Index of each atom inside its own system, ``[N]`` (keys its random draws)."""
        if self._local is None:
            n = self.num_atoms
            self._local = torch.arange(n, device=self.system_idx.device) - self.to_atoms(
                self.starts
            )
        return self._local

    @property
    def xyz_counts(self) -> np.ndarray:
        """Components per system (``3 n_atoms``) as a NumPy array (CPU runs only)."""
        if self._xyz_counts is None:
            self._xyz_counts = (self._n_atoms * 3).numpy()
        return self._xyz_counts

    @property
    def xyz_index(self) -> torch.Tensor:
        """System row of each component of a flattened ``[N, 3]`` field, ``[3 N]``."""
        if self._xyz_idx is None:
            self._xyz_idx = self.system_idx.repeat_interleave(3)
        return self._xyz_idx

    @property
    def xyz_lengths(self) -> torch.Tensor:
        """Components per system (``3 n_atoms``) as a tensor: the runs of a flattened
        ``[N, 3]`` field."""
        if self._xyz_lengths is None:
            self._xyz_lengths = self._n_atoms * 3
        return self._xyz_lengths


#: derived ``[N, 3]`` tensors kept per layout at most (a few per integrator in practice)
_MAX_DERIVED = 8


@primitive
def run_sums(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Sums of consecutive runs of ``values`` ``[P, ...]`` along dim 0, ``lengths[r]``
    rows each, ``[R, ...]``: each run's values added one after another from zero, so a
    run's sum is a function of its own values alone, whatever runs surround it (the
    module docstring; the numba backend adds in the same order, to the same bits)."""
    if values.shape[0] == 0:
        return values.new_zeros((lengths.shape[0], *values.shape[1:]))
    return torch.segment_reduce(values, "sum", lengths=lengths, axis=0)


def _same_plain_dtype(tensors: tuple[torch.Tensor, ...]) -> bool:
    """True when the tensors share one dtype and NumPy can view each of them."""
    dtype = tensors[0].dtype
    return all(t.dtype == dtype and numpy_viewable(t) for t in tensors)


__all__ = ["Segments", "run_sums"]
