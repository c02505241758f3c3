"""``FixSymmetry``, batched: ASE's symmetrisation of forces, stress, cell steps and
position steps (``ase.constraints.FixSymmetry``, ``ase.spacegroup.symmetrize``) as
tensor arithmetic over every constrained system of a batch at once.

A system's operations are batch fields packed on the host when it entered the run
(:mod:`alchemi_lit.core.symmetry`: rotations ``R_k`` in fractional coordinates, and for
each atom ``j`` the atom ``src_k(j)`` that operation ``k`` carries onto it).  With ``L``
the cell (rows), ASE's ``symmetrize_rank1`` is, per atom,

    f_sym[j] = (1/K) sum_k (f[src_k(j)] L^-1) R_k^T  L

and ``symmetrize_rank2`` is ``L^-1 ((1/K) sum_k R_k^T (L s L^T) R_k) L^-T``.  Every
product is elementwise (:func:`~alchemi_lit.core.tensor_ops.small_matmul`,
:func:`~alchemi_lit.core.tensor_ops.rows_times`) and the sums over operations are run
sums in operation order (:func:`~alchemi_lit.core.segments.run_sums`), so a system's bits
never depend on its batch mates (docs/design/45) and nothing is read on the host.  The
operations are padded to the fields' width with zero rotations, which add exact zeros;
blocks of :data:`BLOCK` operations bound the per-atom temporaries ``[N, BLOCK, 3, 3]``,
and on CPU blocks past every system's count are skipped.

ASE's order in a step on a cell filter is kept: the new cell is symmetrised as a
deformation of the current one (``adjust_cell``), the atoms are carried by that cell
(``set_cell(scale_atoms=True)``), then the position step towards the filter's target
is symmetrised in the new cell (``adjust_positions``).  Forces and stress are
symmetrised as the model returns them (``adjust_forces``, ``adjust_stress``), so the
convergence test and the results see them as ASE's ``atoms.get_forces()`` does.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .constraints import Constraint, Host, register_constraint
from .errors import system_name
from .linalg import inverse
from .segments import run_sums
from .symmetry import ADJUST, COUNT, MAX_OPERATIONS, ROTATIONS, SOURCE
from .tensor_ops import host_reads_free, rows_times, small_matmul

#: operations symmetrised together (the temporaries are ``[N, BLOCK, 3, 3]``)
BLOCK = 48
#: ASE's limits on a symmetrised cell step's deformation (warning, error)
WARN_DEFORMATION, MAX_DEFORMATION = 0.15, 0.25


def _blocks(batch: Any) -> range:
    """Starts of the operation blocks to add: all of them off CPU, where counts are not
    read; on CPU only up to the largest count (exact zeros are what the rest adds)."""
    count = getattr(batch, COUNT)
    top = MAX_OPERATIONS
    if host_reads_free(count) and count.numel():
        top = int(count.max())
    return range(0, top, BLOCK)


def _weights(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(constrained [B] bool, 1 / K [B])`` (1 where free, never a division by zero)."""
    count = getattr(batch, COUNT)
    on = count > 0
    k = torch.where(on, count, torch.ones_like(count)).to(batch.dtype)
    return on, torch.ones_like(k) / k


def _cells(on: torch.Tensor, *cells: torch.Tensor) -> list[torch.Tensor]:
    """The cells of constrained systems, identity elsewhere (a free system may have no
    cell, whose inverse would raise)."""
    eye = torch.eye(3, dtype=cells[0].dtype, device=cells[0].device)
    return [torch.where(on[:, None, None], c, eye) for c in cells]


def symmetrize_rank1(batch: Any, vectors: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
    """ASE's ``symmetrize_rank1`` of per-atom ``[N, 3]`` vectors in cells ``[B, 3, 3]``
    for the constrained systems (others: ``vectors`` unchanged)."""
    seg = batch.segments
    on, inv_k = _weights(batch)
    (cell,) = _cells(on, cell)
    lattice_inv = inverse(cell)
    scaled = rows_times(vectors, seg.to_atoms(lattice_inv))  # f L^-1
    source = getattr(batch, SOURCE) + seg.to_atoms(seg.starts)[:, None]  # global atoms
    rotations = getattr(batch, ROTATIONS)
    n = batch.num_atoms
    total = torch.zeros_like(vectors)
    for lo in _blocks(batch):
        hi = min(lo + BLOCK, MAX_OPERATIONS)
        width = hi - lo
        g = scaled.index_select(0, source[:, lo:hi].reshape(-1)).view(n, width, 3)
        r = seg.to_atoms(rotations[:, lo:hi])  # [N, width, 3, 3]
        t = small_matmul(g.unsqueeze(-2), r.transpose(-1, -2)).squeeze(-2)  # (R g)^T rows
        lengths = torch.full((n,), width, dtype=torch.int64, device=vectors.device)
        total = total + run_sums(t.reshape(n * width, 3), lengths)
    total = total * seg.to_atoms(inv_k)[:, None]
    out = rows_times(total, seg.to_atoms(cell))
    return torch.where(seg.to_atoms(on)[:, None], out, vectors)


def symmetrize_rank2(batch: Any, tensor: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
    """ASE's ``symmetrize_rank2`` of per-system ``[B, 3, 3]`` tensors in cells
    ``[B, 3, 3]`` for the constrained systems (others unchanged)."""
    on, inv_k = _weights(batch)
    (cell,) = _cells(on, cell)
    lattice_inv = inverse(cell)
    scaled = small_matmul(small_matmul(cell, tensor), cell.transpose(-1, -2))  # L s L^T
    rotations = getattr(batch, ROTATIONS)
    b = batch.num_systems
    total = torch.zeros_like(tensor)
    for lo in _blocks(batch):
        hi = min(lo + BLOCK, MAX_OPERATIONS)
        r = rotations[:, lo:hi]
        t = small_matmul(small_matmul(r.transpose(-1, -2), scaled.unsqueeze(1)), r)
        lengths = torch.full((b,), hi - lo, dtype=torch.int64, device=tensor.device)
        total = total + run_sums(t.reshape(b * (hi - lo), 9), lengths).view(b, 3, 3)
    total = total * inv_k[:, None, None]
    out = small_matmul(small_matmul(lattice_inv, total), lattice_inv.transpose(-1, -2))
    return torch.where(on[:, None, None], out, tensor)


class FixSymmetryKind(Constraint):
    """ASE's ``FixSymmetry`` in the constraint interface (:mod:`.constraints`): forces
    and stress symmetrised as the model returns them, the new cell as a symmetrised
    deformation of the old (``adjust_cell``), the position step symmetrised in the new
    cell from the old positions carried by it (``adjust_positions``); velocities are
    left alone, as ASE has no ``adjust_momenta`` for it.  Fixed atoms (whole orbits,
    checked by :func:`~.symmetry.pack`) end exactly where the symmetrised cell carries
    them, as ASE's ``FixAtoms`` leaves them in either order of its list: a cell filter
    carried them by the unsymmetrised cell, and the symmetrised step brings them back
    only to rounding.

    With the other kinds (a set its operations map onto itself, checked by
    :func:`~.symmetry_invariance.check_structures`) it applies after the forces that add (Hookean,
    ExternalForce) and before the projections (FixAtoms ... FixBondLengths): ASE's
    ``[FixSymmetry, <kind>]``, so a projected component or a rigid bond holds as
    exactly as the kind alone leaves it; the invariance makes the other order agree.

    Its fields are not the interface's zero-filled shared schema: ``W`` operations per
    atom would cost every run :data:`MAX_OPERATIONS` integers per atom, so they exist
    only in batches holding a constrained system (:func:`~.symmetry.pack`; a batch
    concatenated with one gets zeros: free).  ``encode`` only flags the system."""

    ase_names = ("FixSymmetry",)
    bit = 1 << 6
    order = 40  # (after the forces that add, before the projections)
    holonomic = True  # it moves positions: barostats refuse it (ASE's cell filters only)

    def encode(self, constraint: Any, host: Host) -> None:
        host.flags |= self.bit  # (the operations: core.symmetry.pack, checked there)

    def _on(self, batch: Any, active: torch.Tensor) -> torch.Tensor:
        return active & (getattr(batch, COUNT) > 0) if batch.has_field(COUNT) else active & False

    def adjust_forces(self, batch: Any, forces: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        if not batch.has_field(COUNT):
            return forces
        sym = symmetrize_rank1(batch, forces, batch.cell)
        return torch.where(batch.atom_mask(self._on(batch, active))[:, None], sym, forces)

    def adjust_stress(self, batch: Any, stress: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        if not batch.has_field(COUNT):
            return stress
        sym = symmetrize_rank2(batch, 0.5 * (stress + stress.transpose(-1, -2)), batch.cell)
        return torch.where(self._on(batch, active)[:, None, None], sym, stress)  # (ASE: Voigt)

    def adjust_cell(
        self, batch: Any, old: torch.Tensor, new: torch.Tensor, active: torch.Tensor
    ) -> torch.Tensor:
        if not batch.has_field(COUNT):
            return new
        on = self._on(batch, active) & getattr(batch, ADJUST)[:, 1]
        on = on & (new != old).flatten(1).any(-1)
        eye = torch.eye(3, dtype=new.dtype, device=new.device)
        old_cell, new_cell = _cells(on, old, new)
        deform = small_matmul(inverse(old_cell), new_cell).transpose(-1, -2) - eye
        _check_deformation(batch, deform, on)  # ASE: (L^-1 cell)^T - I, symmetrised in L
        sym = symmetrize_rank2(batch, deform, old_cell)
        return torch.where(on[:, None, None], small_matmul(old_cell, (sym + eye).mT), new)

    def adjust_positions(
        self, batch: Any, old: torch.Tensor, new: torch.Tensor, active: torch.Tensor
    ) -> torch.Tensor:
        if not batch.has_field(COUNT):
            return new
        on = self._on(batch, active) & getattr(batch, ADJUST)[:, 0]
        moved = old + symmetrize_rank1(batch, new - old, batch.cell)
        moved = torch.where(batch.fixed[:, None], old, moved)  # ASE's FixAtoms after it
        return torch.where(batch.atom_mask(on)[:, None], moved, new)


def _check_deformation(batch: Any, deform: torch.Tensor, mask: torch.Tensor) -> None:
    """ASE's warning for a cell step the symmetrisation may handle badly (where host
    reads are free; on an accelerator nothing is read)."""
    if not host_reads_free(deform):
        return
    big = deform.abs().flatten(1).amax(-1)
    for r in (mask & (big > WARN_DEFORMATION)).nonzero().flatten().tolist():
        worse = float(big[r]) > MAX_DEFORMATION
        warnings.warn(
            f"{system_name(r, int(batch.system_id[r]))}: FixSymmetry symmetrises a cell step "
            f"with deformation {float(big[r]):.3g} > "
            f"{MAX_DEFORMATION if worse else WARN_DEFORMATION} (ASE "
            f"{'refuses' if worse else 'warns about'} it: the symmetrisation is taken about "
            f"the current cell); lower the optimizer's maxstep",
            stacklevel=3,
        )


register_constraint(FixSymmetryKind())

__all__ = ["BLOCK", "FixSymmetryKind", "symmetrize_rank1", "symmetrize_rank2"]
