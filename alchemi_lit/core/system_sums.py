"""Per-system quantities read in many steps: kinetic energy, kinetic temperature and
cell volume, as primitives (:mod:`.backends`).

Why primitives: observables (BlockAverages, the thermo logger) and barostats read them
right after the model's forward, where each of the torch reference's small operations
runs cold -- the temperature is about ten of them, the volume a batched LAPACK call --
so on CPU one compiled pass each (``alchemi_lit.kernels.reductions``) costs a fraction.
The kernels add in the references' order to the same bits (kinetic energy and
temperature) or evaluate the same cofactor expansion (volume), so a system's value does
not depend on which path computed it.

Why the volume by cofactors and not ``torch.linalg.det``: each system's value is then a
fixed expression of its own nine numbers on every device, with no LAPACK kernel chosen
by the batch's shape (docs/design/45-batch-independence-by-construction.md).
"""

from __future__ import annotations

import torch

from .backends import primitive
from .segments import Segments
from .units import kB


@primitive
def kinetic_energy(
    velocities: torch.Tensor, masses: torch.Tensor, segments: Segments,
    atoms: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """*Primitive.*  ``[B]`` kinetic energy in eV of each system's atoms (those of the
    ``[N]`` or ``[N, 1]`` mask ``atoms``; all by default): ``0.5 sum m v^2``, the
    components of each atom added in order x, y, z."""
    mv2 = velocities * velocities * segments.atom_xyz(masses)
    if atoms is not None:
        mv2 = torch.where(atoms.view(-1, 1), mv2, 0.0)
    return 0.5 * segments.sum_xyz(mv2)


def degrees_of_freedom(
    segments: Segments, n_atoms: torch.Tensor, fixed: torch.Tensor | None,
    removed: torch.Tensor | None, dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """``[B]`` ASE's ``3 N - sum(get_removed_dof())``: 3 per atom not ``fixed`` (None:
    no atom is), less what the other constraints remove (``removed``, or None)."""
    if fixed is not None:
        dof = 3.0 * segments.sum((~fixed).to(dtype))
    else:
        dof = 3.0 * n_atoms.to(dtype)
    return dof if removed is None else dof - removed


@primitive
def temperature(
    velocities: torch.Tensor, masses: torch.Tensor, segments: Segments, n_atoms: torch.Tensor,
    fixed: torch.Tensor | None, removed: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    """*Primitive.*  ``[B]`` instantaneous kinetic temperature in K over
    :func:`degrees_of_freedom` (at least 1), as ASE's ``Atoms.get_temperature``."""
    dof = degrees_of_freedom(segments, n_atoms, fixed, removed, velocities.dtype)
    ke = kinetic_energy(velocities, masses, segments)
    return 2.0 * ke / (dof.clamp_min(1.0) * kB)


@primitive
def cell_volume(cell: torch.Tensor) -> torch.Tensor:
    """*Primitive.*  ``[B]`` ``|det(cell)|`` of ``[B, 3, 3]`` cells, by cofactors along
    the first row (0 for a cell without three independent vectors)."""
    a, b, c = cell.unbind(-2)
    minor0 = b[:, 1] * c[:, 2] - b[:, 2] * c[:, 1]
    minor1 = b[:, 0] * c[:, 2] - b[:, 2] * c[:, 0]
    minor2 = b[:, 0] * c[:, 1] - b[:, 1] * c[:, 0]
    return (a[:, 0] * minor0 - a[:, 1] * minor1 + a[:, 2] * minor2).abs()


__all__ = ["cell_volume", "degrees_of_freedom", "kinetic_energy", "temperature"]
