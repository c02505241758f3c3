"""Cell degrees of freedom for optimizers: ASE's ``FrechetCellFilter`` and
``UnitCellFilter``, batched over systems.

An optimizer with a :class:`CellFilter` moves each periodic system in *extended
coordinates*: its atoms expressed in the reference cell (``x = r F^-T``, ``F`` the
deformation gradient from the reference cell to the current one) plus three "cell
atoms" -- ``c F`` (``unit``) or ``c log F`` (``frechet``), ``c`` the cell factor (the
number of atoms by default, as ASE).  The generalized forces are the atomic forces
``f F`` and the cell forces from the virial ``-V (sigma + p I)``, with ASE's
hydrostatic, constant-volume and mask options.  Every formula follows
``ase/_4/optimize/cellutil.py`` (ASE 3.29) step for step; the tests hold
``get_positions``, ``get_forces`` and ``set_positions`` of ASE's filters to round-off.

Departures, all exact in arithmetic:

* ASE's Frechet coordinates are ``c logm(n F)``, which is ``c (log F + ln(n) I)``; the
  constant ``c ln(n) I`` cancels in every step an optimizer takes, so we keep ``c log F``
  (more accurate: computing around the constant costs ASE ~1e-12 a step).
* ``logm``/``expm`` are batched and accurate to ~1e-15 (:mod:`alchemi_lit.core.linalg`: why
  neither scipy nor ``torch.linalg.matrix_exp``), and the Frechet cell forces are the
  adjoint of ``expm``'s Frechet derivative, ``D exp(L^T)[G]``, one 6x6 block exponential
  per system (ASE sums nine ``expm_frechet`` calls).
* The stress is symmetrised (ASE's calculators hand the filter Voigt stresses).

The reference cell is a batch field (``cell_ref``) set when a system enters the stage,
so it migrates and checkpoints with the system.  Only the cell and positions are
written; the stress must be computed every step (optimizers set ``requires_stress``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np
import torch

from ..core.errors import ConfigError, row_names
from ..core.linalg import expm, expm_frechet_adjoint, inverse, logm, solve, voigt_mask
from ..core.state import Batch
from ..core.system_sums import cell_volume
from ..core.tensor_ops import identity_key, rows_times, same_key, small_matmul
from ..core.units import GPa, bar
from .base import FieldSpec
from .constrain import space_fixed_tethers
from .params import check_pressure
from .stage_fields import CELL_REFERENCE

#: cells of at most this volume (Å^3) carry no cell degrees of freedom
_MIN_VOLUME = 1e-12


PerSystem = float | Sequence[float]


@dataclass
class CellFilter:
    """The cell as extra coordinates of an optimizer, as ASE's filters.

    Args:
        kind: ``"frechet"`` (ASE ``FrechetCellFilter``: log of the deformation) or
            ``"unit"`` (ASE ``UnitCellFilter``: the deformation itself).
        scalar_pressure: external pressure in eV/Å^3 (0 by default).
        pressure_gpa: the same in GPa (give one of the three pressures).
        pressure_bar: the same in bar.  A pressure far outside its unit's usual range
            gets the barostats' :class:`~alchemi_lit.core.errors.UnitWarning`
            (``scalar_pressure=1.0``, 160 GPa, reads as 1 GPa given in eV/Å^3).
        hydrostatic_strain: only hydrostatic deformations (the virial's trace).
        constant_volume: project the volume change out of the cell forces.
        mask: which strain components relax, Voigt order (xx, yy, zz, yz, xz, xy),
            1 relaxes and 0 holds; all six by default.
        cell_factor: scale of the cell coordinates (ASE's ``cell_factor`` /
            ``exp_cell_factor``); the system's number of atoms by default.
        cell_for_nonperiodic: what a system without a periodic 3-D cell does:
            ``"error"`` (refuse it) or ``"ignore"`` (relax its positions only).

    Pressures, ``hydrostatic_strain``, ``constant_volume`` and ``mask`` also take one
    value per system, a list indexed by ``system_id``.  Systems periodic in only some
    directions but with a 3-D cell relax the whole cell, as in ASE (use ``mask``).
    """

    kind: Literal["frechet", "unit"] = "frechet"
    scalar_pressure: PerSystem | None = None
    pressure_gpa: PerSystem | None = None
    pressure_bar: PerSystem | None = None
    hydrostatic_strain: bool | Sequence[bool] = False
    constant_volume: bool | Sequence[bool] = False
    mask: Sequence[float] | Sequence[Sequence[float]] | None = None
    cell_factor: float | None = None
    cell_for_nonperiodic: Literal["error", "ignore"] = "error"

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"CellFilter: {name} {why}, got {getattr(self, name)!r}")

        if self.kind not in ("frechet", "unit"):
            raise bad("kind", "must be 'frechet' (ASE FrechetCellFilter) or 'unit'")
        if self.cell_for_nonperiodic not in ("error", "ignore"):
            raise bad("cell_for_nonperiodic", "must be 'error' or 'ignore'")
        pressures = ("scalar_pressure", "pressure_gpa", "pressure_bar")
        check_pressure("CellFilter", **{n: getattr(self, n) for n in pressures})  # barostats' rules
        for name in ("hydrostatic_strain", "constant_volume"):
            v = getattr(self, name)
            if not (isinstance(v, bool) or all(isinstance(x, bool) for x in v)):
                raise bad(name, "must be true/false or a list of them (one per system_id)")
        if self.mask is not None:
            m = torch.as_tensor(self.mask, dtype=torch.float64)
            if m.shape[-1:] != (6,) or m.dim() > 2 or not bool(((m == 0) | (m == 1)).all()):
                raise bad(
                    "mask", "must be 6 values of 0/1 (xx, yy, zz, yz, xz, xy), or a list of such"
                )
        if self.cell_factor is not None and not float(self.cell_factor) > 0:
            raise bad("cell_factor", "must be > 0")
        self._memo: dict[str, tuple[list[Any], Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # no memo

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._memo = {}

    @property
    def pressure(self) -> PerSystem:
        """The external pressure in eV/Å^3 (a number or one per system_id)."""
        for name, unit in (("scalar_pressure", 1.0), ("pressure_gpa", GPa), ("pressure_bar", bar)):
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, (int, float)):
                    return float(value) * unit
                return [float(v) * unit for v in value]
        return 0.0

    # ------------------------------------------------------------ the batch's view
    width = 9  # cell coordinates per system

    def field_specs(self) -> dict[str, FieldSpec]:
        return {CELL_REFERENCE: FieldSpec("system", (3, 3), fill=float("nan"))}

    def carries_cell(self, batch: Batch) -> torch.Tensor:
        """``[B]``: systems periodic in some direction with a 3-D cell."""
        return batch.pbc.any(-1) & (batch.volume > _MIN_VOLUME)

    def check(self, batch: Batch, owner: str, mask: torch.Tensor) -> None:
        """Refuse systems of ``mask`` without a periodic 3-D cell (unless told to ignore
        them) or beyond the per-system values given (reads the batch on the host)."""
        ids = batch.system_id[mask]
        top = int(ids.max()) if len(ids) else -1
        for name in ("pressure", "hydrostatic_strain", "constant_volume", "mask"):
            value = getattr(self, name)
            per_system = value is not None and np.ndim(value) == (2 if name == "mask" else 1)
            count = len(value) if per_system else None
            if count is not None and top >= count:
                raise ConfigError(
                    f"CellFilter: {name} has {count} values (one per system_id) but {owner} "
                    f"got system_id {top}; give one value per system_id, or one for all"
                )
        tethered = space_fixed_tethers(batch, mask)
        if tethered:
            names = row_names(batch, tethered)
            raise ConfigError(
                f"{owner} with a cell filter: {names} carr{'ies' if len(tethered) == 1 else 'y'} "
                f"FixSymmetry with Hookean springs to points or planes, which stay fixed in "
                f"space while the cell carries the lattice and its symmetry operations' "
                f"translations, so their symmetry (checked for the input cell) need not "
                f"survive a cell step; relax the positions only (cell=None), tether atoms "
                f"to each other instead, or drop FixSymmetry"
            )
        if self.cell_for_nonperiodic == "ignore":
            return
        rows = (mask & ~self.carries_cell(batch)).nonzero().flatten().tolist()
        if rows:
            names = row_names(batch, rows)
            raise ConfigError(
                f"{owner} with a cell filter: {names}{' ...' if len(rows) > 5 else ''} "
                f"{'has' if len(rows) == 1 else 'have'} no periodic 3-D cell, so no cell to "
                f"relax; pass cell=CellFilter(..., cell_for_nonperiodic='ignore') to relax "
                f"their positions only, or remove them"
            )

    def init(self, batch: Batch, mask: torch.Tensor) -> None:
        batch.cell_ref = torch.where(mask[:, None, None], batch.cell, batch.cell_ref)

    def geometry(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        """``(active [B], F, F^-1, log F or None)`` per system (identity where inactive),
        kept while the cell and reference cell tensors stay the same."""
        key = identity_key((batch.cell, batch.cell_ref))
        hit = self._memo.get("geometry")
        if hit is not None and same_key(hit[0], key):
            return hit[1]
        # (a system outside the stage may hold no reference: NaN, or 0 where a batch that
        # lacked the field was concatenated; torch's solve raises on a singular matrix)
        active = self.carries_cell(batch) & (cell_volume(batch.cell_ref) > _MIN_VOLUME)
        eye = torch.eye(3, dtype=batch.dtype, device=batch.device).expand_as(batch.cell)
        ref = torch.where(active[:, None, None], batch.cell_ref, eye)
        cell = torch.where(active[:, None, None], batch.cell, eye)
        f = solve(ref, cell).transpose(-1, -2)
        out = (active, f, inverse(f), logm(f) if self.kind == "frechet" else None)
        self._memo["geometry"] = (key, out)
        return out

    def factor(self, batch: Batch) -> torch.Tensor:
        if self.cell_factor is not None:
            return torch.full_like(batch.energy, float(self.cell_factor))
        return batch.n_atoms.to(batch.dtype)

    def coordinates(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Extended coordinates: atoms ``[N, 3]`` and cell ``[B, 9]`` (zero if inactive)."""
        active, f, f_inv, log_f = self.geometry(batch)
        x_atoms = _per_atom_product(batch, batch.positions, f_inv.transpose(-1, -2))
        cell = (f if log_f is None else log_f) * self.factor(batch)[:, None, None]
        cell = torch.where(active[:, None, None], cell, torch.zeros_like(cell))
        return x_atoms, cell.reshape(-1, 9)

    def forces(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Generalized forces: atoms ``[N, 3]`` and cell ``[B, 9]`` (zero if inactive)."""
        key = identity_key((batch.cell, batch.cell_ref, batch.forces, batch.stress))
        hit = self._memo.get("forces")
        if hit is not None and same_key(hit[0], key):
            return hit[1]
        active, f, f_inv, log_f = self.geometry(batch)
        eye = torch.eye(3, dtype=batch.dtype, device=batch.device)
        stress = batch.stress
        sigma = 0.5 * (stress + stress.transpose(-1, -2))  # ASE's Voigt stress, symmetric
        p = _per_system(self.pressure, batch)
        p = p[:, None, None] if isinstance(p, torch.Tensor) else p
        virial = -batch.volume[:, None, None] * (sigma + p * eye)
        if log_f is None:
            virial = small_matmul(virial, f_inv.transpose(-1, -2))  # ASE: solve(F, virial.T).T
        virial = self._hydrostatic_and_mask(batch, virial, eye)
        if log_f is None:
            cell_force = _project_volume(batch, self.constant_volume, virial, eye)
        else:
            grad = expm_frechet_adjoint(log_f, small_matmul(virial, f_inv.transpose(-1, -2)))
            cell_force = _project_volume(batch, self.constant_volume, grad, eye)
        cell_force = cell_force / self.factor(batch)[:, None, None]
        cell_force = torch.where(active[:, None, None], cell_force, torch.zeros_like(cell_force))
        out = (_per_atom_product(batch, batch.forces, f), cell_force.reshape(-1, 9))
        self._memo["forces"] = (key, out)
        return out

    def _hydrostatic_and_mask(
        self, batch: Batch, virial: torch.Tensor, eye: torch.Tensor
    ) -> torch.Tensor:
        hydro = _per_system(self.hydrostatic_strain, batch)
        if isinstance(hydro, torch.Tensor) or hydro:
            trace = virial.diagonal(0, -2, -1).sum(-1)
            uniform = (trace / 3.0)[:, None, None] * eye
            virial = _choose(hydro, uniform, virial)
        mask = self.mask3x3(batch)
        return virial if mask is None else virial * mask

    def mask3x3(self, batch: Batch) -> torch.Tensor | None:
        if self.mask is None:
            return None
        m = torch.as_tensor(self.mask, dtype=batch.dtype, device=batch.device)
        m = voigt_mask(m)
        return m[batch.system_id] if m.dim() == 3 else m

    def set_coordinates(
        self, batch: Batch, x_atoms: torch.Tensor, x_cell: torch.Tensor, moving: torch.Tensor
    ) -> None:
        """Positions and cells from extended coordinates, for the systems of ``moving``
        ``[B]`` (free atoms take ``x``; fixed atoms follow the cell, as ASE's
        ``set_cell(scale_atoms=True)`` moves them)."""
        active, *_ = self.geometry(batch)
        eye = torch.eye(3, dtype=batch.dtype, device=batch.device)
        x = x_cell.reshape(-1, 3, 3) / self.factor(batch)[:, None, None]
        f_new = x if self.kind == "unit" else expm(x)
        deform = (f_new - eye).transpose(-1, -2)
        mask = self.mask3x3(batch)
        deform = deform if mask is None else deform * mask
        stretch = torch.where(active[:, None, None], eye + deform, eye.expand_as(deform))
        stretched = small_matmul(batch.cell_ref, stretch)
        new_cell = torch.where(active[:, None, None], stretched, batch.cell)
        positions = _per_atom_product(batch, x_atoms, stretch)
        if batch.may_have_fixed_atoms():
            carried = solve(
                torch.where(active[:, None, None], batch.cell, eye),
                torch.where(active[:, None, None], new_cell, eye),
            )
            positions = torch.where(
                batch.fixed[:, None], _per_atom_product(batch, batch.positions, carried), positions
            )
        atoms = batch.atom_mask(moving)[:, None]
        batch.positions = torch.where(atoms, positions, batch.positions)
        batch.cell = torch.where((moving & active)[:, None, None], new_cell, batch.cell)


def as_cell_filter(value: CellFilter | str | dict[str, Any] | None) -> CellFilter | None:
    """``cell=`` of an optimizer: None, ``"frechet"``/``"unit"``, a mapping of
    :class:`CellFilter` arguments, or a CellFilter."""
    if value is None or isinstance(value, CellFilter):
        return value
    if isinstance(value, str):
        return CellFilter(kind=value)  # type: ignore[arg-type]
    if isinstance(value, dict):
        return CellFilter(**value)
    raise ConfigError(
        f"cell must be 'frechet', 'unit', a CellFilter or None, got {type(value).__name__}"
    )


def _per_atom_product(batch: Batch, rows: torch.Tensor, per_system: torch.Tensor) -> torch.Tensor:
    """``rows[i] @ per_system[system of i]`` for ``[N, 3]`` rows and ``[B, 3, 3]`` matrices."""
    return rows_times(rows, per_system.index_select(0, batch.system_idx))


def _per_system(value: Any, batch: Batch) -> Any:
    """A parameter as a plain value, or gathered by ``system_id`` from a per-system list
    (whose length :meth:`CellFilter.check` checked when the systems entered)."""
    if isinstance(value, (bool, int, float)):
        return value
    table = torch.as_tensor(np.asarray(value), device=batch.device)  # floats: float64
    if table.is_floating_point():
        table = table.to(batch.dtype)
    return table[batch.system_id]


def _choose(flag: Any, yes: torch.Tensor, no: torch.Tensor) -> torch.Tensor:
    """``yes`` for the systems of ``flag`` (a ``[B]`` tensor or one bool), ``no`` elsewhere."""
    if isinstance(flag, torch.Tensor):
        return torch.where(flag[:, None, None], yes, no)
    return yes if flag else no


def _project_volume(
    batch: Batch, constant: Any, m: torch.Tensor, eye: torch.Tensor
) -> torch.Tensor:
    """``m - tr(m)/3 I`` where the volume is held (ASE's ``constant_volume``)."""
    flag = _per_system(constant, batch)
    if not (isinstance(flag, torch.Tensor) or flag):
        return m
    trace = m.diagonal(0, -2, -1).sum(-1)
    return _choose(flag, m - (trace / 3.0)[:, None, None] * eye, m)
