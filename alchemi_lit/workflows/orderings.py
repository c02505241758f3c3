"""Orderings of a partially occupied structure: read, checked, enumerated or sampled.

A disordered crystal (a CIF with ``_atom_site_occupancy`` below 1, or a pymatgen
``Structure`` whose sites hold fractions of species) is not one structure a model can
evaluate: its orderings in a supercell are.  Counting them is exact before anything
runs -- each set of sites sharing one species mix contributes a multinomial -- so a
supercell with more orderings than ``max_enumerate`` is known at once and either
sampled (random orderings, then annealed by swap Monte Carlo: :mod:`.order`) or refused.
Enumeration is pymatgen's ``OrderDisorderedStructureTransformation`` (enumlib's
``enum.x`` is not installed here, and pymatgen's own path needs nothing else), ranked by
its Ewald energy, then reduced to the symmetry-distinct orderings by pymatgen's
``StructureMatcher`` -- the tools materials scientists already use for this.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.errors import ConfigError, StructureError

#: occupancies within this of 1 (or of an integral count) count as exact
TOLERANCE = 1e-6


def as_disordered(structures: Any) -> list[Any]:
    """The inputs as pymatgen ``Structure`` objects: a Structure, a CIF path (partial
    occupancies kept), or a list of them; occupancies summing above 1 on a site are a
    :class:`StructureError` naming the site (checked on the file where pymatgen cannot
    read it)."""
    from pymatgen.core import Structure

    items = structures if isinstance(structures, (list, tuple)) else [structures]
    if not items:
        raise ConfigError("order: no structures given; pass a pymatgen Structure or a CIF path")
    out = []
    for i, item in enumerate(items):
        if isinstance(item, (str, os.PathLike)):
            item = _read_cif(str(item), i)
        if not isinstance(item, Structure):
            raise ConfigError(
                f"order: structure {i} is a {type(item).__name__}; pass a pymatgen Structure "
                f"with partial occupancies or the path of a CIF with them (an ase.Atoms holds "
                f"one species per site: it has no orderings to find)"
            )
        check_occupancies(item, i)
        out.append(item)
    return out


def _read_cif(path: str, i: int) -> Any:
    """A CIF as a pymatgen Structure, partial occupancies kept; a site whose occupancies
    sum above 1 (pymatgen then finds "no structures") is named from ASE's reading."""
    from pymatgen.core import Structure

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (pymatgen's notes on CIF keys it guessed)
            return Structure.from_file(path)
    except (ValueError, KeyError) as exc:
        from ase.io import read

        atoms = read(path, format="cif")
        for site, species in (atoms.info.get("occupancy") or {}).items():
            total = sum(species.values())
            if total > 1 + TOLERANCE:
                mix = " + ".join(f"{s} {o:g}" for s, o in species.items())
                raise StructureError(
                    f"order: {path!r} site {site} ({mix}) has occupancies summing to {total:g} "
                    f"> 1; a site holds at most one atom: fix the CIF's _atom_site_occupancy",
                    i,
                ) from None
        raise StructureError(f"order: pymatgen cannot read {path!r}: {exc}", i) from exc


def check_occupancies(structure: Any, i: int) -> None:
    """Each site's occupancies sum to at most 1 (a Structure built by hand may not have
    been checked), and at least one site is partially occupied."""
    for k, site in enumerate(structure):
        total = sum(site.species.values())
        if total > 1 + TOLERANCE:
            raise StructureError(
                f"order: structure {i} site {k} ({site.species}) has occupancies summing to "
                f"{total:g} > 1; a site holds at most one atom",
                i,
            )
    if structure.is_ordered:
        raise StructureError(
            f"order: structure {i} ({structure.composition.reduced_formula}) is fully ordered "
            f"(every site holds one species with occupancy 1): it has one ordering, itself; "
            f"relax it with alchemi-lit run (FIRE), or give the partially occupied structure",
            i,
        )


def count_orderings(structure: Any, i: int = 0) -> int:
    """How many orderings the sites of ``structure`` (already the supercell) have: the
    product over each set of sites sharing a species mix of the multinomial of its
    counts (vacancies included).  Counts that are not integers are a ConfigError naming
    the supercell to use."""
    groups: dict[tuple[tuple[str, float], ...], int] = {}
    for site in structure:
        if site.is_ordered:
            continue
        mix = tuple(sorted((str(s), round(float(o), 9)) for s, o in site.species.items()))
        groups[mix] = groups.get(mix, 0) + 1
    total = 1
    for mix, n in groups.items():
        counts = [n * o for _, o in mix]
        counts.append(n - sum(counts))  # vacancies
        if any(abs(c - round(c)) > TOLERANCE * max(n, 1) for c in counts):
            shown = ", ".join(f"{s} {o:g}" for s, o in mix)
            need = _least_multiple([o for _, o in mix], n)
            raise ConfigError(
                f"order: structure {i}: {n} sites of {shown} do not make whole atoms ({counts}); "
                f"use a supercell with {need}x as many sites (supercell=...)"
            )
        ints = [round(c) for c in counts]
        total *= math.factorial(n) // math.prod(math.factorial(c) for c in ints)
    return total


def _least_multiple(fractions: Sequence[float], n: int) -> int:
    for m in range(1, 1001):
        if all(abs(n * m * f - round(n * m * f)) < TOLERANCE * n * m for f in fractions):
            return m
    return 1000


def supercell_of(structure: Any, supercell: Any) -> Any:
    """``structure`` repeated by ``supercell``: None or 1 (as given), an integer per axis
    (three), or a 3x3 scaling matrix."""
    if supercell is None:
        return structure.copy()
    matrix = np.asarray(supercell, dtype=float)
    if matrix.ndim == 0 or matrix.shape in ((3,), (3, 3)):
        out = structure.copy()
        out.make_supercell(matrix.tolist() if matrix.ndim else int(matrix))
        return out
    raise ConfigError(
        f"order: supercell must be an integer, three integers or a 3x3 matrix, got {supercell!r}"
    )


def enumerate_orderings(structure: Any, limit: int) -> list[tuple[Any, float]]:
    """Every ordering of ``structure`` (at most ``limit``, its exact count checked
    before) by pymatgen's ``OrderDisorderedStructureTransformation``, ranked by its Ewald
    energy (NaN without oxidation states: all orderings tie), reduced to the
    symmetry-distinct ones (one per ``StructureMatcher`` group, the lowest-ranked kept):
    ``[(Structure, ewald eV)]``."""
    from pymatgen.analysis.structure_matcher import StructureMatcher
    from pymatgen.transformations.standard_transformations import (
        OrderDisorderedStructureTransformation,
    )

    elements = [e for site in structure for e in site.species]
    oxidised = all(getattr(e, "oxi_state", None) is not None for e in elements)
    step = OrderDisorderedStructureTransformation(no_oxi_states=not oxidised)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ranked = step.apply_transformation(structure, return_ranked_list=limit)
    found = [(r["structure"], float(r["energy"]) if oxidised else np.nan) for r in ranked]
    groups = StructureMatcher().group_structures([s for s, _ in found])
    energy = {id(s): e for s, e in found}
    firsts = [min(g, key=lambda s: energy[id(s)]) for g in groups]
    return sorted(((s, energy[id(s)]) for s in firsts), key=lambda p: np.nan_to_num(p[1]))


def random_orderings(structure: Any, count: int, seed: int) -> list[Any]:
    """``count`` random orderings of ``structure``: each set of sites sharing a species
    mix filled with its whole counts in a random order (numpy ``default_rng(seed)``)."""
    from pymatgen.core import Structure

    rng = np.random.default_rng(seed)
    sets: dict[tuple[tuple[str, float], ...], list[int]] = {}
    for k, site in enumerate(structure):
        if not site.is_ordered:
            mix = tuple(sorted((str(s), float(o)) for s, o in site.species.items()))
            sets.setdefault(mix, []).append(k)
    out = []
    for _ in range(count):
        species: dict[int, str | None] = {}
        for mix, sites in sets.items():
            fill = [s for s, o in mix for _ in range(round(o * len(sites)))]
            fill += [None] * (len(sites) - len(fill))  # vacancies
            for k, s in zip(sites, rng.permutation(np.array(fill, dtype=object))):
                species[k] = s
        keep = [k for k in range(len(structure)) if species.get(k, "") is not None]
        labels = [species.get(k) or structure[k].specie for k in keep]
        out.append(Structure(structure.lattice, labels,
                             [structure[k].frac_coords for k in keep]))  # fmt: skip
    return out


def to_atoms(structure: Any) -> Any:
    """An ordered pymatgen Structure as a fresh ``ase.Atoms`` (species, positions, cell;
    no oxidation states, no ``info`` an earlier run left, such as its ``system_id``)."""
    from ase import Atoms

    numbers = [site.specie.Z for site in structure]
    return Atoms(numbers=numbers, positions=structure.cart_coords,
                 cell=structure.lattice.matrix, pbc=True)  # fmt: skip


__all__ = [
    "TOLERANCE", "as_disordered", "check_occupancies", "count_orderings",
    "enumerate_orderings", "random_orderings", "supercell_of", "to_atoms",
]  # fmt: skip
