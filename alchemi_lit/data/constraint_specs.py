"""Constraints from a run config: ``data.constraints``, applied to every structure.

A config cannot hold ``ase.constraints`` objects, so it lists them as mappings: the
ASE class name under ``type`` and ASE's own arguments, with the atoms selected per
structure by ``indices`` (a list, or a ``"start:stop:step"`` slice) or by ``tags``
(the structure's ``Atoms.get_tags()``)::

    data:
      structures: slabs.extxyz
      constraints:
        - {type: FixAtoms, tags: [2, 3]}                        # the bottom layers
        - {type: FixCartesian, tags: [1], mask: [false, false, true]}
        - {type: FixedPlane, indices: "0:4", direction: [0, 0, 1]}
        - {type: Hookean, a1: 0, a2: 1, k: 5.0, rt: 1.2}
        - {type: FixBondLengths, pairs: [[0, 1], [0, 2]]}
        - {type: FixSymmetry, symprec: 0.01}                     # refines, keeps the group

Each structure gets these after the constraints its file carries (ASE's ``.traj`` keeps
constraints; extxyz keeps ``FixAtoms`` / ``FixCartesian`` as its ``move_mask`` column).
A wrong ``type`` or argument is a config error naming ``data.constraints[i]``; an index
out of range in a structure is the structure's error, naming it, before the run.
``FixSymmetry`` goes with any other kind whose constraint set every symmetry operation
of the structure maps onto itself (fixed atoms, masks, planes and lines as whole orbits
with directions the operations permute; FixCom; bonds, springs and pulls as whole
orbits of pairs: :mod:`alchemi_lit.core.symmetry_invariance`), checked when the
structure enters the run; its refinement runs with the other constraints lifted and
moves every atom onto its symmetric site, the constrained ones included, so constraints
listed after it are built on the refined structure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from .datasets import StructureDataset

#: per type: the arguments that select atoms (replaced by indices) and the others ASE takes
_TYPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "FixAtoms": ("indices", ()),
    "FixCartesian": ("a", ("mask",)),
    "FixedPlane": ("indices", ("direction",)),
    "FixedLine": ("indices", ("direction",)),
    "FixCom": ("", ()),
    "Hookean": ("", ("a1", "a2", "k", "rt")),
    "ExternalForce": ("", ("a1", "a2", "f_ext")),
    "FixBondLengths": ("", ("pairs", "tolerance", "bondlengths")),
    "FixSymmetry": ("", ("symprec", "adjust_positions", "adjust_cell")),
}


def check_specs(specs: Sequence[dict[str, Any]], key: str = "data.constraints") -> list[dict]:
    """The specs, checked: a known ``type``, known arguments, one selection at most."""
    out = []
    for i, spec in enumerate(specs or []):
        where = f"{key}[{i}]"
        if not isinstance(spec, dict) or "type" not in spec:
            raise ConfigError(f"{where}: give a mapping with a 'type' (one of {sorted(_TYPES)})")
        kind = spec["type"]
        if kind not in _TYPES:
            raise ConfigError(f"{where}: unknown constraint type {kind!r}; known: {sorted(_TYPES)}")
        select, allowed = _TYPES[kind]
        chosen = [k for k in ("indices", "tags") if k in spec]
        if select and len(chosen) != 1:
            raise ConfigError(f"{where}: {kind} selects its atoms by 'indices' or 'tags' (one)")
        extra = set(spec) - {"type", *chosen, *allowed}
        if extra or (not select and chosen):
            bad = sorted(extra or set(chosen))
            takes = sorted(allowed) or "no arguments"
            raise ConfigError(f"{where}: {kind} takes {takes}, not {bad}")
        out.append(dict(spec))
    return out


def _selected(spec: dict[str, Any], atoms: Any) -> np.ndarray:
    if "tags" in spec:
        return np.flatnonzero(np.isin(atoms.get_tags(), np.asarray(spec["tags"])))
    sel = spec["indices"]
    if isinstance(sel, str):
        parts = [int(p) if p else None for p in sel.split(":")]
        return np.arange(len(atoms))[slice(*parts)]
    return np.atleast_1d(np.asarray(sel, dtype=np.int64))


def build_constraint(spec: dict[str, Any], atoms: Any) -> Any:
    """The ASE constraint object of one checked spec for ``atoms``."""
    import ase.constraints as ac

    kind = spec["type"]
    select, allowed = _TYPES[kind]
    args = {k: spec[k] for k in allowed if k in spec}
    if kind == "Hookean" and isinstance(args.get("a2"), list):
        args["a2"] = tuple(args["a2"])
    if select:
        args[select] = _selected(spec, atoms)
    if kind == "FixSymmetry":  # ASE's constructor refines the structure it is given,
        kept = atoms.constraints  # every atom: a file's FixAtoms would leave some off-site
        atoms.set_constraint()
        try:
            return ac.FixSymmetry(atoms, **args)
        finally:
            atoms.set_constraint(kept)
    return getattr(ac, kind)(**args)


def apply_specs(atoms: Any, specs: Sequence[dict[str, Any]]) -> Any:
    """``atoms`` with the specs' constraints after its own (changed in place)."""
    if specs:
        atoms.set_constraint([*atoms.constraints, *(build_constraint(s, atoms) for s in specs)])
    return atoms


class ConstrainedDataset(StructureDataset):
    """A dataset whose every frame gets the constraints of ``specs`` (read on access)."""

    def __init__(self, base: Sequence[Any], specs: Sequence[dict[str, Any]]) -> None:
        self.base, self.specs = base, check_specs(specs)
        self.path = getattr(base, "path", None)

    def __len__(self) -> int:
        return len(self.base)

    def _read(self, k: int) -> Any:
        return apply_specs(self.base[k].copy(), self.specs)  # (a list hands out its own)


__all__ = ["ConstrainedDataset", "apply_specs", "build_constraint", "check_specs"]
