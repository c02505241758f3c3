"""Rigid bonds: ASE's ``FixBondLengths`` (and ``FixBondLength``) with SHAKE for positions
and RATTLE for velocities and forces, batched.

ASE sweeps its bonds one after another (Gauss-Seidel) until every correction ``|x|`` is
at most ``tolerance`` (default 1e-13), for at most ``maxiter = 500`` sweeps.  Here the
bonds are stored in :data:`BOND_SLOTS` "colours" -- per atom ``bond_offset[:, c]``
(partner) and ``bond_length[:, c]`` (0: no bond) -- chosen so that no two bonds of a
colour share an atom: one colour's bonds are corrected all at once, colour after colour,
which is a Gauss-Seidel sweep in another bond order.  Converged to the same tolerance,
the positions agree with ASE's to that tolerance.  On CPU the sweeps stop when every
system has converged (the compiled kernel of :mod:`alchemi_lit.kernels.constraints` sweeps
each system to its own; a converged system is left alone either way) and raise (naming the
system) after ``maxiter`` sweeps, as ASE's ``RuntimeError``; on an accelerator, where
reading the residual would stall the device, exactly :data:`DEVICE_SWEEPS` sweeps run
(bonds already within tolerance are left alone, as ASE leaves them).  Bond lengths are
those of the input structure (ASE's ``bondlengths=None``) unless given; the minimum-image
convention applies, as ASE's.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from .backends import primitive
from .constraint_forces import minimum_image
from .constraints import Constraint, ConstraintField, Host, partner, register_constraint
from .errors import StructureError
from .tensor_ops import host_reads_free, row_dot

#: bond colours (slots per atom): every atom may be in up to this many rigid bonds
BOND_SLOTS = 4
#: ASE's FixBondLengths.maxiter
MAX_SWEEPS = 500
#: sweeps on an accelerator (no convergence read)
DEVICE_SWEEPS = 64


class BondLengthsKind(Constraint):
    """ASE ``FixBondLengths(pairs, tolerance, bondlengths)``: one DOF removed per bond."""

    ase_names = ("FixBondLengths",)
    bit = 1 << 5
    order = 80
    fields: ClassVar[dict[str, ConstraintField]] = {
        "bond_offset": ConstraintField("atom", (BOND_SLOTS,), "int64"),
        "bond_length": ConstraintField("atom", (BOND_SLOTS,)),
        "bond_tolerance": ConstraintField("system"),
    }

    def encode(self, constraint: Any, host: Host) -> None:
        pairs = np.asarray(constraint.pairs, dtype=np.int64).reshape(-1, 2)
        pairs = host.indices("FixBondLengths", pairs.reshape(-1)).reshape(-1, 2)
        lengths = constraint.bondlengths
        if lengths is None:  # ASE's get_distance(a, b, mic=True), every pair at once
            from ase.geometry import find_mic

            r, cell, pbc = host.atoms.positions, host.atoms.cell, host.atoms.pbc
            lengths = find_mic(r[pairs[:, 1]] - r[pairs[:, 0]], cell, pbc)[1] if len(pairs) else []
        lengths = np.asarray(lengths, dtype=np.float64).reshape(-1)
        tol = float(constraint.tolerance)
        if len(lengths) != len(pairs) or not (np.all(lengths > 0) and tol > 0):
            raise host.refuse(
                f"FixBondLengths: {len(pairs)} pairs need as many positive bond lengths "
                f"and a tolerance > 0 (got {lengths.tolist()}, tolerance {tol})"
            )
        prior = host.array("bond_tolerance")
        if prior[0] and prior[0] != tol:
            raise host.refuse("two FixBondLengths with different tolerances; give one")
        prior[0] = tol
        offset, length = host.array("bond_offset"), host.array("bond_length")
        used = length > 0
        for (a, b), cd in zip(pairs, lengths):
            for i in (a, b):
                axis = host.arrays.get("axis_kind")
                if host.fixed[i] or (axis is not None and axis[i]):
                    raise host.refuse(
                        f"atom {i} is fixed and also in a rigid bond ({a}, {b}); a rigid "
                        f"bond needs both atoms free: drop one of the constraints"
                    )
            if a == b:
                raise host.refuse(f"FixBondLengths pair ({a}, {b}) joins an atom to itself")
            free = np.flatnonzero(~used[a] & ~used[b])
            if not len(free):
                raise host.refuse(
                    f"atoms {a}, {b} are in more than {BOND_SLOTS} rigid bonds between them"
                )
            c = free[0]
            offset[a, c], length[a, c] = b - a, cd
            used[a, c] = used[b, c] = True
        host.flags |= self.bit
        host.dof += float(len(pairs))

    def decode(self, arrays: dict[str, np.ndarray], system: dict[str, Any]) -> list[Any]:
        from ase.constraints import FixBondLengths

        rows, cols = np.nonzero(arrays["bond_length"])
        if not len(rows):
            return []
        pairs = [(int(i), int(i + arrays["bond_offset"][i, c])) for i, c in zip(rows, cols)]
        lengths = arrays["bond_length"][rows, cols]
        return [FixBondLengths(pairs, float(system["bond_tolerance"]), lengths.tolist())]

    def adjust_positions(self, batch, old, new, active):  # type: ignore[no-untyped-def]
        return shake(batch, old, new, active)

    def adjust_velocities(self, batch, velocities, active):  # type: ignore[no-untyped-def]
        return rattle(batch, velocities, active)

    def adjust_forces(self, batch, forces, active):  # type: ignore[no-untyped-def]
        return rattle_forces(batch, forces, active)


def unconverged(batch: Any, row: int, what: str) -> StructureError:
    """The error for system ``row``'s sweeps that did not converge (ASE's RuntimeError)."""
    return StructureError(
        f"system {int(batch.system_id[row])}: FixBondLengths {what} did not converge "
        f"in {MAX_SWEEPS} sweeps (ASE's maxiter); a smaller time step or step length "
        f"keeps the bonds within reach"
    )


def _colours(batch: Any, ref: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """Per colour: partner index, bond vector at ``ref`` and its minimum image, ``m_b``
    and the reduced mass -- fixed during the sweeps."""
    m, out = batch.masses, []
    for c in range(BOND_SLOTS):
        other = partner(batch, batch.bond_offset[:, c])
        r0 = ref - ref.index_select(0, other)
        mb = m.index_select(0, other)
        out.append((other, r0, minimum_image(batch, r0), mb, 1.0 / (1.0 / m + 1.0 / mb)))
    return out


def _sweeps(batch: Any, active: torch.Tensor, correct: Any, what: str) -> None:
    """Run ``correct(colour, on, tol)`` -> ``|x| > tol`` per atom until converged."""
    on_all = batch.atom_mask(active).unsqueeze(-1) & (batch.bond_length > 0)
    tol = batch.segments.to_atoms(batch.bond_tolerance)
    reads = host_reads_free(on_all)
    used = [c for c in range(BOND_SLOTS) if not reads or bool(on_all[:, c].any())]
    for _ in range(MAX_SWEEPS if reads else DEVICE_SWEEPS):
        moved = torch.zeros_like(on_all[:, 0])
        for c in used:
            moved = moved | correct(c, on_all[:, c], tol)
        if reads and not bool(moved.any()):
            return
    if reads:
        raise unconverged(batch, int(batch.system_idx[moved.nonzero()[0, 0]]), what)


@primitive
def shake(batch: Any, old: torch.Tensor, new: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """SHAKE: positions ``new`` with the rigid bonds of ``active``'s systems at their
    lengths, corrected along the bond vectors at ``old`` (the module docstring)."""
    m = batch.masses.unsqueeze(-1)
    colours, state = _colours(batch, old), {"new": new}

    def correct(c: int, on: torch.Tensor, tol: torch.Tensor) -> torch.Tensor:
        other, r0, d0, mb, mu = colours[c]
        new = state["new"]
        d1 = new - new.index_select(0, other) - r0 + d0
        cd = batch.bond_length[:, c]
        x = 0.5 * (cd * cd - row_dot(d1)) / row_dot(d0, d1)
        go = on & (x.abs() > tol)
        step = (torch.where(go, x, 0.0) * mu).unsqueeze(-1) * d0
        state["new"] = (new + step / m).index_add(0, other, -step / mb.unsqueeze(-1))
        return go

    _sweeps(batch, active, correct, "positions (SHAKE)")
    return state["new"]


@primitive
def rattle(batch: Any, velocities: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """RATTLE: ``velocities`` without a relative component along any rigid bond of
    ``active``'s systems (bond vectors at the batch's positions)."""
    m = batch.masses.unsqueeze(-1)
    colours, state = _colours(batch, batch.positions), {"v": velocities}

    def correct(c: int, on: torch.Tensor, tol: torch.Tensor) -> torch.Tensor:
        other, _, d, mb, mu = colours[c]
        v = state["v"]
        cd = batch.bond_length[:, c]
        x = -row_dot(v - v.index_select(0, other), d) / (cd * cd).clamp_min(1e-300)
        go = on & (x.abs() > tol)
        step = (torch.where(go, x, 0.0) * mu).unsqueeze(-1) * d
        state["v"] = (v + step / m).index_add(0, other, -step / mb.unsqueeze(-1))
        return go

    _sweeps(batch, active, correct, "velocities (RATTLE)")
    return state["v"]


@primitive
def rattle_forces(batch: Any, forces: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """``forces`` of ``active``'s systems as ASE's ``FixBondLengths.adjust_forces``
    leaves them: :func:`rattle` applied to ``F / m`` (ASE's ``adjust_momenta``), times
    ``m``."""
    m = batch.masses.unsqueeze(-1)
    adjusted = rattle(batch, forces / m, active) * m
    return torch.where(batch.atom_mask(active).unsqueeze(-1), adjusted, forces)


register_constraint(BondLengthsKind())


__all__ = [
    "BOND_SLOTS", "DEVICE_SWEEPS", "MAX_SWEEPS", "BondLengthsKind", "rattle", "rattle_forces",
    "shake", "unconverged",
]  # fmt: skip
