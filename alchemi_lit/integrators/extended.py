"""What quasi-Newton optimizers (and any optimizer taking ``cell=``) see of a batch --
extended coordinates and forces, with or without a :class:`~.cell.CellFilter` -- and
the state they keep in it.

Both views give per-atom rows ``[N, 3]`` plus per-system cell rows ``[B, c]`` (``c`` = 9
with a cell filter, 0 without), so an optimizer is written once for both.  Systems that
carry no cell in a filtered stage (``cell_for_nonperiodic="ignore"``) have zero cell
rows, which add nothing to a dot product, a norm or a step.  :class:`DenseGroup` packs
the rows of systems of one size into ``[G, D]`` vectors in ASE's order (atoms, then the
three cell rows) for optimizers that need dense linear algebra (BFGS); :class:`History`
is L-BFGS's ring of steps and gradient changes in batch fields; :func:`inertial_step` is
a FIRE-family step over atoms and cell rows alike (ASE's FIRE and FIRE2 on a filter
treat the three cell rows as atoms in every dot product and step length), with the cell
rows' velocities in ``fire_cell_velocities`` ``[B, 9]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..core.errors import ConfigError
from ..core.state import Batch
from ..core.tensor_ops import host_reads_free, may_be_set, row_dot
from . import ops
from .base import FieldSpec, Integrator
from .cell import CellFilter, as_cell_filter
from .convergence import Criterion, ForceMax
from .params import FORCE, check_param
from .stage_fields import CELL_VELOCITIES


class PositionsOnly:
    """The view of an optimizer without a cell filter: positions and forces."""

    width = 0
    kind = None

    def field_specs(self) -> dict[str, FieldSpec]:
        return {}

    def check(self, batch: Batch, owner: str, mask: torch.Tensor) -> None:
        pass

    def init(self, batch: Batch, mask: torch.Tensor) -> None:
        pass

    def carries_cell(self, batch: Batch) -> torch.Tensor:
        return torch.zeros_like(batch.pbc[:, 0])

    def coordinates(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return batch.positions, batch.positions.new_zeros((batch.num_systems, 0))

    def forces(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return batch.forces, batch.forces.new_zeros((batch.num_systems, 0))

    def set_coordinates(
        self, batch: Batch, x_atoms: torch.Tensor, x_cell: torch.Tensor, moving: torch.Tensor
    ) -> None:
        """Positions of the free atoms of the systems of ``moving`` ``[B]``."""
        atoms = (batch.atom_mask(moving) & ~batch.fixed)[:, None]
        batch.positions = torch.where(atoms, x_atoms, batch.positions)


CellView = CellFilter | PositionsOnly


def cell_view(cell: CellFilter | None) -> CellView:
    return PositionsOnly() if cell is None else cell


def max_row_norm_sq(batch: Batch, atoms: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
    """Per system ``[B]``, the largest squared norm of a row of ``atoms`` ``[N, 3]`` or of
    the three rows of ``cell`` ``[B, 9]`` (ASE's ``gradient_norm`` of a filter, squared)."""
    sq = row_dot(atoms)
    out = sq.new_zeros(batch.num_systems).scatter_reduce(
        0, batch.system_idx, sq, "amax", include_self=True
    )
    if cell.shape[-1]:
        out = torch.maximum(out, (cell.reshape(-1, 3, 3) ** 2).sum(-1).amax(-1))
    return out


class FilterForceMax(Criterion):
    """Largest row of a cell filter's forces below ``fmax``: the atoms' ``f F`` and the
    three cell rows, as ``ase.optimize`` checks an optimizer running on the filter.

    Args:
        fmax: threshold in eV/Å (> 0).
        cell: the optimizer's cell filter.
    """

    def __init__(self, fmax: float, cell: CellFilter) -> None:
        if not fmax > 0:
            raise ValueError(f"fmax must be > 0 eV/Å, got {fmax}")
        self.fmax = float(fmax)
        self.cell = cell

    def __call__(self, batch: Batch) -> torch.Tensor:
        return max_row_norm_sq(batch, *self.cell.forces(batch)) < self.fmax**2

    def __repr__(self) -> str:
        return f"FilterForceMax({self.fmax}, {self.cell.kind!r})"


class BandForceMax(Criterion):
    """Every NEB force of a band below ``fmax``: ASE's test of an optimizer running on
    ``NEB`` (the largest row of the forces on all interior images); endpoints pass.

    Args:
        fmax: threshold in eV/Å (> 0).
        band: the optimizer's :class:`~.neb.NEB` filter.
    """

    def __init__(self, fmax: float, band: Any) -> None:
        if not fmax > 0:
            raise ValueError(f"fmax must be > 0 eV/Å, got {fmax}")
        self.fmax, self.band = float(fmax), band

    def declare(self, batch: Batch) -> None:
        self.band.declare(batch)  # (so results drop the band fields with the stage's)

    def __call__(self, batch: Batch) -> torch.Tensor:
        return self.band.converged(batch, self.fmax)

    def __repr__(self) -> str:
        return f"BandForceMax({self.fmax})"


def default_criterion(fmax: float, cell: CellFilter | None, band: Any = None) -> Criterion:
    """ASE's convergence test of an optimizer: on the forces, or on the filter's forces."""
    if band is not None:
        return BandForceMax(fmax, band)
    return ForceMax(fmax) if cell is None else FilterForceMax(fmax, cell)


class DenseGroup:
    """Systems of a stage with one atom count and cell use, packed densely: a system's
    coordinates are its atoms' rows, then its cell's (ASE's order)."""

    def __init__(self, batch: Batch, members: list[int], n: int, cell_width: int) -> None:
        self.sys = torch.tensor(members, device=batch.device)
        self.idx = batch.atom_index(self.sys)
        self.n, self.c, self.dim = n, cell_width, 3 * n + cell_width

    def pack(self, atoms: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
        """``[N, 3, ...]`` atom rows and ``[B, c, ...]`` cell rows as ``[G, dim, ...]``."""
        g = len(self.sys)
        rows = atoms.index_select(0, self.idx).reshape(g, 3 * self.n, *atoms.shape[2:])
        return torch.cat([rows, cell.index_select(0, self.sys)], 1) if self.c else rows

    def scatter(
        self, dense: torch.Tensor, atoms: torch.Tensor, cell: torch.Tensor, in_place: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`pack` undone: ``dense`` written into copies of (or into) atoms and cell."""
        rows = dense[:, : 3 * self.n].reshape(-1, *atoms.shape[1:])
        if in_place:
            atoms.index_copy_(0, self.idx, rows)
            if self.c:
                cell.index_copy_(0, self.sys, dense[:, 3 * self.n :])
            return atoms, cell
        atoms = atoms.index_copy(0, self.idx, rows)
        return atoms, cell.index_copy(0, self.sys, dense[:, 3 * self.n :]) if self.c else cell


def dense_groups(batch: Batch, mask: torch.Tensor, view: CellView) -> list[DenseGroup]:
    """The systems of ``mask`` ``[B]`` grouped by (atom count, carries a cell); the
    grouping is read on the host.  A band filter packs each band as one vector."""
    if hasattr(view, "dense_groups"):
        return view.dense_groups(batch, mask)
    rows = mask.nonzero().flatten().tolist()
    carries = view.carries_cell(batch).tolist()
    found: dict[tuple[int, bool], list[int]] = {}
    for r, n in zip(rows, batch.n_atoms[rows].tolist()):
        found.setdefault((n, bool(carries[r])), []).append(r)
    return [DenseGroup(batch, m, n, view.width if c else 0) for (n, c), m in found.items()]


class CellOptimizer(Integrator):
    """Base of optimizers that take ``cell=`` (a :class:`CellFilter`, ``"frechet"``,
    ``"unit"`` or None): ``fmax``, ``maxstep``, the view of the batch (:attr:`view`) and
    ASE's convergence test on its forces.  Subclasses add their fields to
    :attr:`fields` and name the parameter that sets their shapes (:attr:`shaped_by`)."""

    is_optimizer = True
    requires_stress = False  # (True with a cell; a subclass may need it anyway)
    shaped_by = "parameters"
    #: the step reads the batch on the host anyway (then arrivals are checked everywhere)
    reads_host = False

    def __init__(
        self,
        fmax: float,
        max_steps: int,
        maxstep: float,
        cell: CellFilter | str | None,
        criterion: Criterion | None,
        band: Any = None,
    ) -> None:
        super().__init__(max_steps)
        name = type(self).__name__
        self.fmax = check_param("fmax", name, fmax, unit="eV/Å", usual=FORCE)
        self.maxstep = check_param("maxstep", name, maxstep, unit="Å")
        self.cell = as_cell_filter(cell)
        self.band = band  # an NEB filter (.neb; its optimizers convert band= with as_band)
        if self.band is not None and self.cell is not None:
            raise ConfigError(f"{name}: give cell= or band=, not both (NEB keeps the cell fixed)")
        self.view = self.band if self.band is not None else cell_view(self.cell)
        if self.cell is not None:  # the cell forces come from the stress
            self.requires_stress = True
        self.criterion = criterion or default_criterion(self.fmax, self.cell, self.band)
        # the class's own fields (FIRE's), then the filter's (the reference cell)
        self.fields: dict[str, FieldSpec] = {**type(self).fields, **self.view.field_specs()}

    def __repr__(self) -> str:
        cell = "" if self.cell is None else f", cell={self.cell.kind!r}"
        cell += "" if self.band is None else f", band={self.band!r}"
        return f"{type(self).__name__}(fmax={self.fmax}, max_steps={self.max_steps}{cell})"

    def setup(self, batch: Batch, seed: int, prefix: str) -> None:
        for key, spec in self.fields.items():  # two stages of a kind share fields by name
            if batch.has_field(key) and tuple(getattr(batch, key).shape[1:]) != spec.shape:
                raise ConfigError(
                    f"two {type(self).__name__} stages with different {self.shaped_by} or "
                    f"cell share the batch field {key!r}: give them the same {self.shaped_by} "
                    f"and cell"
                )
        self.refuse(batch, torch.ones_like(batch.pbc[:, 0]))  # before any model call
        super().setup(batch, seed, prefix)
        if self.band is not None:
            self.band.declare(batch)

    def refuse(self, batch: Batch, mask: torch.Tensor) -> None:
        """Raise ConfigError for systems of ``mask`` this stage cannot take."""
        self.view.check(batch, type(self).__name__, mask)

    def converged(self, batch: Batch) -> torch.Tensor | None:
        """The criterion; a plan's stages without ``band=`` pass the interior images of
        bands straight on (they relax the endpoints; the images wait in the band stage)."""
        conv = super().converged(batch)
        if self.band is None and conv is not None and batch.has_field("neb_count"):
            conv = conv | ((batch.neb_image > 0) & (batch.neb_image < batch.neb_count - 1))
        return conv

    def entering(self, batch: Batch, mask: torch.Tensor) -> torch.Tensor:
        """Systems of ``mask`` enter: with ``band=``, also the waiting images of bands
        that start now, whose optimizer state must be fresh too (call first in
        ``init_systems``)."""
        return mask if self.band is None else self.band.arrive(batch, mask)

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        # systems arriving after a refill were checked by setup; from another rank, here
        # (on an accelerator only where the step reads the host anyway: no sync added)
        if (self.reads_host or host_reads_free(mask)) and may_be_set(mask):
            self.refuse(batch, mask)
        super().init_systems(batch, mask)
        self.view.init(batch, mask)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        if self.band is not None:  # a delayed climbing image may start now
            self.band.advance(batch, mask)


class History:
    """A stage's L-BFGS ring buffers in the batch: write a pair, read a slot per system,
    and the per-system dot products and updates of the recursion (atoms plus cell)."""

    def __init__(self, batch: Batch, cell_width: int) -> None:
        self.batch, self.c = batch, cell_width
        self.atoms = torch.arange(batch.num_atoms, device=batch.device)
        self.systems = torch.arange(batch.num_systems, device=batch.device)

    def write(
        self,
        upd: torch.Tensor,
        slot: torch.Tensor,
        x_a: torch.Tensor,
        x_c: torch.Tensor,
        f_a: torch.Tensor,
        f_c: torch.Tensor,
    ) -> None:
        """Store ``s = x - r0``, ``y = (-f) - (-f0)``, ``rho = 1 / y.s`` in ``slot`` ``[B]``
        for the systems of ``upd`` (in place: the ring is this stage's own state)."""
        b = self.batch
        s_a, y_a = x_a - b.lbfgs_r0, b.lbfgs_f0 - f_a
        s_c = x_c - b.lbfgs_r0_cell if self.c else x_c
        y_c = b.lbfgs_f0_cell - f_c if self.c else f_c
        rho = 1.0 / self.dot(s_a, s_c, y_a, y_c)
        atom_slot, atom_upd = slot.index_select(0, b.system_idx), b.atom_mask(upd)[:, None]
        for name, new in (("lbfgs_s", s_a), ("lbfgs_y", y_a)):
            t = getattr(b, name)
            t[self.atoms, atom_slot] = torch.where(atom_upd, new, t[self.atoms, atom_slot])
        b.lbfgs_rho[self.systems, slot] = torch.where(upd, rho, b.lbfgs_rho[self.systems, slot])
        for name, new in (("lbfgs_s_cell", s_c), ("lbfgs_y_cell", y_c))[: 2 if self.c else 0]:
            t = getattr(b, name)
            t[self.systems, slot] = torch.where(upd[:, None], new, t[self.systems, slot])

    def read(self, slot: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(s_atoms, s_cell, y_atoms, y_cell, rho)`` of each system's ``slot``."""
        b = self.batch
        atom_slot = slot.index_select(0, b.system_idx)
        s_a, y_a = b.lbfgs_s[self.atoms, atom_slot], b.lbfgs_y[self.atoms, atom_slot]
        if self.c:
            s_c, y_c = b.lbfgs_s_cell[self.systems, slot], b.lbfgs_y_cell[self.systems, slot]
        else:
            s_c = y_c = b.positions.new_zeros((b.num_systems, 0))
        return s_a, s_c, y_a, y_c, b.lbfgs_rho[self.systems, slot]

    def dot(
        self, u_a: torch.Tensor, u_c: torch.Tensor, v_a: torch.Tensor, v_c: torch.Tensor
    ) -> torch.Tensor:
        """Per-system dot product of (atoms, cell) vectors ``[B]``."""
        total = self.batch.segments.sum_xyz(u_a * v_a)
        return total + (u_c * v_c).sum(-1) if self.c else total

    def axpy(
        self,
        valid: torch.Tensor,
        a: torch.Tensor,
        u_a: torch.Tensor,
        u_c: torch.Tensor,
        v_a: torch.Tensor,
        v_c: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``v + a u`` for the systems of ``valid``, ``v`` elsewhere."""
        seg = self.batch.segments
        v_a = torch.where(
            self.batch.atom_mask(valid)[:, None], v_a + seg.to_atoms(a)[:, None] * u_a, v_a
        )
        return v_a, torch.where(valid[:, None], v_c + a[:, None] * u_c, v_c)


# ------------------------------------------------------------------ FIRE-family steps
#: ``coefficients(vf, ff, vv)`` of the per-system sums v.F, F.F, v.v ``[B]``:
#: ``(A, C, P, S, vmax or None, *state)`` of ``v' = A v + C F`` (clipped to ``|v'| <=
#: vmax`` per component), ``x' = x + P v + S v'``
Coefficients = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[Any, ...]]


def inertial_fields(view: CellView) -> dict[str, FieldSpec]:
    """The cell rows' velocities of a FIRE-family stage with a cell filter (none without)."""
    return {CELL_VELOCITIES: FieldSpec("system", (view.width,))} if view.width else {}


def inertial_step(
    batch: Batch, mask: torch.Tensor, view: CellView, coefficients: Coefficients
) -> tuple[torch.Tensor, ...]:
    """A FIRE-family step of the systems of ``mask`` on the extended coordinates: the
    velocities of atoms (``velocities``, in extended coordinates) and cell rows
    (:data:`CELL_VELOCITIES`) mixed and advanced by :data:`Coefficients`, the new
    coordinates set through ``view``.  Returns the coefficients' ``state``.

    The torch path only: the positions-only steps keep their compiled primitives
    (:func:`~.ops.fire_update`, :func:`~.ops.fire2_update`)."""
    seg = batch.segments
    x_a, x_c = view.coordinates(batch)
    f_a, f_c = view.forces(batch)
    v_a = batch.velocities
    v_c = getattr(batch, CELL_VELOCITIES) if view.width else x_c  # (x_c: [B, 0] then)

    reduce = getattr(view, "reduce", None)  # a band sums over its images

    def dot(u_a: torch.Tensor, u_c: torch.Tensor, w_a: torch.Tensor, w_c: torch.Tensor) -> Any:
        total = seg.sum_xyz(u_a * w_a) + (u_c * w_c).sum(-1)
        return total if reduce is None else reduce(total, batch)

    vf, ff, vv = dot(v_a, v_c, f_a, f_c), dot(f_a, f_c, f_a, f_c), dot(v_a, v_c, v_a, v_c)
    a, c, p, s, vmax, *state = coefficients(vf, ff, vv)
    a3, c3, s3 = seg.to_xyz(a, c, s)
    new_v_a, new_v_c = a3 * v_a + c3 * f_a, a[:, None] * v_c + c[:, None] * f_c
    if vmax is not None:  # ABC-FIRE: each component, cell rows included
        (vmax3,) = seg.to_xyz(vmax)
        new_v_a = torch.minimum(torch.maximum(new_v_a, -vmax3), vmax3)
        new_v_c = torch.minimum(torch.maximum(new_v_c, -vmax[:, None]), vmax[:, None])
    if p is not None:  # FIRE2's half step back
        (p3,) = seg.to_xyz(p)
        x_a, x_c = x_a + p3 * v_a, x_c + p[:, None] * v_c
    new_x_a, new_x_c = x_a + s3 * new_v_a, x_c + s[:, None] * new_v_c
    batch.velocities = ops.masked(ops.moving_atoms(batch, mask), new_v_a, v_a)
    if view.width:
        setattr(batch, CELL_VELOCITIES, torch.where(mask[:, None], new_v_c, v_c))
    view.set_coordinates(batch, new_x_a, new_x_c, mask)
    return tuple(state)


def set_diagonal(
    t: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, mask: torch.Tensor, value: float
) -> None:
    """``t[r, k, cols[r, k]] = value`` for the rows of ``mask`` (in place: fresh state)."""
    k = torch.arange(cols.shape[1], device=t.device)[None, :]
    current = t[rows, k, cols]
    t[rows, k, cols] = torch.where(mask[:, None], torch.full_like(current, value), current)
