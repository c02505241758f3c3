"""BFGS structure optimizer, batched: ``ase.optimize.BFGS`` step for step.

Each system keeps its own Hessian (initially ``alpha I``), updated with ASE's formula
``H += y y^T / (s.y) - (H s)(H s)^T / (s.H s)`` (skipped when no coordinate moved by
1e-7), and steps ``-V |w|^-1 V^T g`` from its eigendecomposition, scaled down as a
whole when its longest row exceeds ``maxstep``.  With ``cell=`` it optimizes ASE's
filter coordinates (see :mod:`.cell`) and converges on their forces, cell included.
With ``band=NEB(...)`` one Hessian spans a band's interior images (ASE's BFGS on ``NEB``;
``max_atoms`` then counts a band's interior atoms).

Memory: the Hessian has ``(3n + 9)^2`` values for a system of n atoms (``(3n)^2``
without a cell).  It lives in the batch as one row block per atom, ``bfgs_hessian``
``[N, 3, W]``, plus the cell rows ``bfgs_hessian_cell`` ``[B, 9, W]``, padded to the
widest allowed system, ``W = 3 max_atoms + 9``; so it migrates, checkpoints and crosses
ranks like any field, and a system takes ``(3n + 9) W`` values.  A batch whose
Hessians would exceed ``max_memory_gb`` is refused: use LBFGS (``2 memory (3n + 9)``
values a system).  Each step diagonalises every system's Hessian (``O((3n)^3)``),
batched over systems of equal size; the groups are read on the host.
"""

from __future__ import annotations

import warnings

import torch

from ..core.errors import ConfigError, row_names
from ..core.linalg import one_at_a_time
from ..core.state import Batch
from ..core.tensor_ops import may_be_set
from .base import FieldSpec
from .cell import CellFilter
from .convergence import Criterion
from .extended import CellOptimizer, dense_groups, set_diagonal
from .neb import NEB, as_band
from .params import check_param


class BFGS(CellOptimizer):
    """Quasi-Newton optimizer with a full Hessian per system; converges at max |F| < fmax."""

    shaped_by = "max_atoms"
    reads_host = True  # groups of systems by size

    def __init__(
        self,
        fmax: float = 0.05,
        max_steps: int = 1000,
        maxstep: float = 0.2,
        alpha: float = 70.0,
        cell: CellFilter | str | None = None,
        max_atoms: int = 256,
        max_memory_gb: float = 4.0,
        criterion: Criterion | None = None,
        band: NEB | None = None,
    ) -> None:
        super().__init__(fmax, max_steps, maxstep, cell, criterion, as_band(band))
        name = type(self).__name__
        if self.maxstep > 1.0:  # as ASE
            warnings.warn(f"{name}: a *very* large maxstep, {self.maxstep} Å", stacklevel=2)
        self.alpha = check_param("alpha (eV/Å^2)", name, alpha)
        self.max_memory_gb = check_param("max_memory_gb", name, max_memory_gb)
        if int(max_atoms) < 1:
            raise ConfigError(f"{name}: max_atoms must be >= 1, got {max_atoms}")
        self.max_atoms = int(max_atoms)
        c = self.view.width
        self.width = w = 3 * self.max_atoms + c
        shapes = {"hessian": ((3, w), (c, w)), "r0": ((3,), (c,)), "f0": ((3,), (c,))}
        for key, (atom_shape, cell_shape) in shapes.items():
            self.fields[f"bfgs_{key}"] = FieldSpec("atom", atom_shape)
            if c:
                self.fields[f"bfgs_{key}_cell"] = FieldSpec("system", cell_shape)

    def refuse(self, batch: Batch, mask: torch.Tensor) -> None:
        """Also systems above ``max_atoms``, and a batch whose Hessians exceed the budget."""
        super().refuse(batch, mask)
        name = type(self).__name__
        size = batch.n_atoms if self.band is None else self.band.vector_atoms(batch, mask)
        big = (mask & (size > self.max_atoms)).nonzero().flatten().tolist()
        if big:
            raise ConfigError(
                f"{name}(max_atoms={self.max_atoms}): "
                f"{row_names(batch, big)} "
                f"{'has' if len(big) == 1 else 'have'} more atoms; raise max_atoms (the "
                f"Hessian takes (3n+9)(3 max_atoms+9) values per system) or use LBFGS"
            )
        rows = 3 * batch.num_atoms + self.view.width * batch.num_systems
        gb = rows * self.width * torch.finfo(batch.dtype).bits / 8 / 2**30
        if gb > self.max_memory_gb:
            raise ConfigError(
                f"{type(self).__name__}: the Hessians of {batch.num_systems} systems "
                f"({batch.num_atoms} atoms, rows of {self.width} values) need {gb:.2f} GB > "
                f"max_memory_gb={self.max_memory_gb}; use LBFGS (memory grows as "
                f"2 memory (3n+9) per system), fewer systems per batch, or raise max_memory_gb"
            )

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        mask = self.entering(batch, mask)
        super().init_systems(batch, mask)
        atoms, k = torch.arange(batch.num_atoms, device=batch.device)[:, None], torch.arange(3)
        local = batch.segments.local_index if self.band is None else self.band.local_index(batch)
        cols = 3 * local[:, None] + k.to(batch.device)
        set_diagonal(batch.bfgs_hessian, atoms, cols, batch.atom_mask(mask), self.alpha)
        if self.view.width:
            rows = torch.arange(batch.num_systems, device=batch.device)[:, None]
            cols = 3 * batch.n_atoms[:, None] + torch.arange(9, device=batch.device)
            set_diagonal(batch.bfgs_hessian_cell, rows, cols, mask, self.alpha)

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        x_atoms, x_cell = self.view.coordinates(batch)
        f_atoms, f_cell = self.view.forces(batch)
        new_atoms, new_cell = x_atoms, x_cell
        keys = ("hessian", "r0", "f0")
        state = [getattr(batch, f"bfgs_{k}") for k in keys]
        cells = [getattr(batch, f"bfgs_{k}_cell") if self.view.width else x_cell for k in keys]
        for group in dense_groups(batch, mask, self.view):
            x, f = group.pack(x_atoms, x_cell), group.pack(f_atoms, f_cell)
            hess, r0, f0 = (group.pack(a, c) for a, c in zip(state, cells))
            hess = hess[..., : group.dim]
            moved = batch.step.index_select(0, group.sys) > 0
            hess, dx = one_at_a_time(_newton_step, hess, x - r0, f0 - f, moved, f)
            longest = (dx.reshape(len(dx), -1, 3) ** 2).sum(-1).amax(-1).sqrt()
            too_long = (longest >= self.maxstep)[:, None]
            dx = torch.where(too_long, dx * (self.maxstep / longest)[:, None], dx)
            hess = torch.nn.functional.pad(hess, (0, self.width - group.dim))
            for dense, atoms, cell in zip((hess, x, f), state, cells):
                group.scatter(dense, atoms, cell, in_place=True)
            new_atoms, new_cell = group.scatter(x + dx, new_atoms, new_cell)
        if may_be_set(mask):
            self.view.set_coordinates(batch, new_atoms, new_cell, mask)


def _newton_step(
    hess: torch.Tensor, dx: torch.Tensor, dg: torch.Tensor, moved: torch.Tensor, f: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ASE's update of ``[G, D, D]`` Hessians for steps ``dx`` and gradient changes ``dg``
    (where ``moved`` and a coordinate moved by 1e-7), and its step ``-V ((g V) / |w|)``,
    g = -f; one system at a time on CPU (``one_at_a_time``: a group's size follows its
    batch mates)."""
    a = (dx * dg).sum(-1)[:, None, None]
    hdx = (hess @ dx.unsqueeze(-1)).squeeze(-1)
    b = (dx * hdx).sum(-1)[:, None, None]
    new = hess + (
        dg.unsqueeze(-1) * dg.unsqueeze(-2) / a - hdx.unsqueeze(-1) * hdx.unsqueeze(-2) / b
    )
    hess = torch.where((moved & (dx.abs().amax(-1) >= 1e-7))[:, None, None], new, hess)
    omega, vectors = torch.linalg.eigh(hess)
    coef = (-f).unsqueeze(1) @ vectors
    return hess, -(vectors @ (coef.squeeze(1) / omega.abs()).unsqueeze(-1)).squeeze(-1)
