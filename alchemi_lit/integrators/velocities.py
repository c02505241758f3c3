"""Velocity initialisation: ASE's Maxwell-Boltzmann draw with keyed normals, so a
system's starting velocities do not depend on the batch it enters (the step ops are in
:mod:`.ops`)."""

from __future__ import annotations

import torch

from ..core import random as rng
from ..core.state import Batch
from ..core.tensor_ops import host_reads_free
from ..core.units import kB
from .ops import atom_mask, per_system, system_sum
from .params import Param


def maxwell_boltzmann(batch: Batch, mask: torch.Tensor, temperature: Param, seed: int) -> None:
    """Velocities at ``temperature`` (K) for ``mask``'s systems, zero total momentum, fixed
    atoms at rest: ASE's ``MaxwellBoltzmannDistribution`` then ``Stationary`` (no rescaling
    to the exact temperature), with keyed normals (``PURPOSE_VELOCITY_INIT``)."""
    am = atom_mask(batch, mask)
    t = per_system(batch, temperature)
    t_atom = t.index_select(0, batch.system_idx) if isinstance(t, torch.Tensor) else t
    z = _velocity_normals(batch, mask, seed)
    # (a number stays a number: a tensor made of it would be copied from the host, which
    # a CUDA graph cannot capture)
    sigma = torch.sqrt(kB * t_atom / batch.masses)
    v = z * sigma.unsqueeze(-1)
    v = torch.where(am.unsqueeze(-1), v, torch.zeros_like(v))
    m = batch.masses.unsqueeze(-1) * am.unsqueeze(-1)
    p_tot = system_sum(batch, m * v)
    m_tot = system_sum(batch, m[:, 0]).clamp_min(1e-30)
    v = torch.where(
        am.unsqueeze(-1), v - (p_tot / m_tot.unsqueeze(-1)).index_select(0, batch.system_idx), v
    )
    batch.velocities = torch.where(batch.atom_mask(mask).unsqueeze(-1), v, batch.velocities)


def _velocity_normals(batch: Batch, mask: torch.Tensor, seed: int) -> torch.Tensor:
    """The keyed normals of velocity initialisation ``[N, 3]``, meaningful for the atoms
    of ``mask``'s systems.  On CPU only those atoms are drawn (the same numbers: each is
    a function of its key): with many small systems a few enter an MD stage at almost
    every step, and drawing for the whole batch each time was a tenth of the run."""
    idx, local = batch.system_idx, batch.segments.local_index
    rows = mask.nonzero().flatten() if host_reads_free(mask) else None
    atoms = None
    if rows is not None and len(rows) < batch.num_systems:
        atoms = batch.atom_index(rows)
        idx, local = idx.index_select(0, atoms), local.index_select(0, atoms)
    purpose = rng.PURPOSE_VELOCITY_INIT
    z = rng.atom_normals(seed, batch.system_id, batch.total_steps, idx, local, purpose, batch.dtype)
    if atoms is None:
        return z
    return z.new_zeros((batch.num_atoms, 3)).index_copy_(0, atoms, z)
