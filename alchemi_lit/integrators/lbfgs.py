"""L-BFGS structure optimizer, batched: ``ase.optimize.LBFGS`` step for step.

Each system keeps its last ``memory`` steps ``s`` and gradient changes ``y`` (with
``rho = 1 / y.s``); a step is ASE's two-loop recursion from the initial inverse
Hessian ``I / alpha``, scaled down as a whole when its longest row exceeds ``maxstep``
and multiplied by ``damping``.  With ``cell=`` it optimizes ASE's filter coordinates
(see :mod:`.cell`) and converges on their forces, cell included.

Memory: ``2 memory (3n + 9)`` values a system of n atoms (``3n`` without a cell), kept
in the batch as ring buffers -- ``lbfgs_s``/``lbfgs_y`` ``[N, memory, 3]`` per atom and
``[B, memory, 9]`` for the cell -- so the history migrates, checkpoints and crosses
ranks like any field.  A system's step in the stage says where its ring starts.  On
CPU the recursion runs over the longest history in the stage; elsewhere over
``memory`` slots, masked (no host read).
"""

from __future__ import annotations

import torch

from ..core.errors import ConfigError
from ..core.state import Batch
from .base import FieldSpec
from .cell import CellFilter
from .convergence import Criterion
from .extended import CellOptimizer, History, max_row_norm_sq
from .params import check_param


class LBFGS(CellOptimizer):
    """Limited-memory BFGS; converges when max |F| < ``fmax`` (filter forces with a cell)."""

    shaped_by = "memory"

    def __init__(
        self,
        fmax: float = 0.05,
        max_steps: int = 1000,
        maxstep: float = 0.2,
        memory: int = 100,
        damping: float = 1.0,
        alpha: float = 70.0,
        cell: CellFilter | str | None = None,
        criterion: Criterion | None = None,
    ) -> None:
        super().__init__(fmax, max_steps, maxstep, cell, criterion)
        name = type(self).__name__
        if self.maxstep > 1.0:  # as ASE
            raise ConfigError(f"{name}: maxstep {self.maxstep} Å is much too large (max 1 Å)")
        self.damping = check_param("damping", name, damping)
        self.alpha = check_param("alpha (eV/Å^2)", name, alpha)
        if int(memory) < 1:
            raise ConfigError(f"{name}: memory must be >= 1 step, got {memory}")
        self.memory = m = int(memory)
        for key, shape in (("s", (m, 3)), ("y", (m, 3)), ("r0", (3,)), ("f0", (3,))):
            self.fields[f"lbfgs_{key}"] = FieldSpec("atom", shape)
        self.fields["lbfgs_rho"] = FieldSpec("system", (m,))
        c = self.view.width
        for key, shape in (("s", (m, c)), ("y", (m, c)), ("r0", (c,)), ("f0", (c,)))[: 4 * bool(c)]:
            self.fields[f"lbfgs_{key}_cell"] = FieldSpec("system", shape)

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        c, seg = self.view.width, batch.segments
        x_atoms, x_cell = self.view.coordinates(batch)
        f_atoms, f_cell = self.view.forces(batch)
        ring = History(batch, c)
        k = batch.step  # ASE's iteration: steps taken in the stage
        # the pair of the last step goes to slot (k - 1) mod memory (ASE: update, k > 0)
        ring.write(mask & (k > 0), (k - 1) % self.memory, x_atoms, x_cell, f_atoms, f_cell)
        q_atoms, q_cell = -f_atoms, -f_cell  # the gradient
        count = torch.clamp(k, max=self.memory)
        loops = self.memory if not seg.on_cpu else int(torch.where(mask, count, 0).max(0)[0])
        pairs = []
        for t in range(loops):  # newest first
            valid = mask & (t < count)
            s_a, s_c, y_a, y_c, rho = pair = ring.read((k - 1 - t) % self.memory)
            a = torch.where(valid, rho * ring.dot(s_a, s_c, q_atoms, q_cell), 0.0)
            q_atoms, q_cell = ring.axpy(valid, -a, y_a, y_c, q_atoms, q_cell)
            pairs.append((valid, a, pair))
        inv_alpha = 1.0 / self.alpha  # ASE multiplies by a sparse diag(1 / alpha)
        z_atoms, z_cell = q_atoms * inv_alpha, q_cell * inv_alpha
        for valid, a, (s_a, s_c, y_a, y_c, rho) in reversed(pairs):  # oldest first
            b = rho * ring.dot(y_a, y_c, z_atoms, z_cell)
            z_atoms, z_cell = ring.axpy(valid, a - b, s_a, s_c, z_atoms, z_cell)
        longest = max_row_norm_sq(batch, z_atoms, z_cell).sqrt()  # |p| = |z|
        scale = torch.where(longest >= self.maxstep, self.maxstep / longest, 1.0)
        dr = (-z_atoms * seg.to_atoms(scale)[:, None], -z_cell * scale[:, None])
        batch.lbfgs_r0 = torch.where(batch.atom_mask(mask)[:, None], x_atoms, batch.lbfgs_r0)
        batch.lbfgs_f0 = torch.where(batch.atom_mask(mask)[:, None], f_atoms, batch.lbfgs_f0)
        if c:
            batch.lbfgs_r0_cell = torch.where(mask[:, None], x_cell, batch.lbfgs_r0_cell)
            batch.lbfgs_f0_cell = torch.where(mask[:, None], f_cell, batch.lbfgs_f0_cell)
        new_atoms = x_atoms + dr[0] * self.damping
        self.view.set_coordinates(batch, new_atoms, x_cell + dr[1] * self.damping, mask)
