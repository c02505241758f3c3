"""Checks of an input structure before it enters a batch, with messages naming it.

Every error names the system as the user knows it (``system 2 (system_id 30)``) and the
fix; plausible-but-odd structures (atoms very close, momenta on fixed atoms) give a
:class:`~alchemi_lit.core.errors.StructureWarning` pointing at the user's line instead.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np
import torch

from .constraints import fixed_mask
from .errors import BatchError, StructureError, StructureWarning, system_name
from .geometry import COINCIDENT_DISTANCE, closest_pair, periodic_heights

#: A periodic cell thinner than this (Å) along a periodic direction is (nearly) singular:
#: the neighbour search would need about cutoff/thickness images of it.
MIN_CELL_HEIGHT = 1e-3




def warn_structure(message: str, index: int | None = None, system_id: int | None = None) -> None:
    """A :class:`StructureWarning` (filterable, testable); the CLI routes warnings to
    its log."""
    warnings.warn(StructureWarning(message, index, system_id), stacklevel=_outside_level())


def _outside_level() -> int:
    """``stacklevel`` for :func:`warn_structure` that points at the first caller outside this
    package (user code), wherever in alchemi_lit the warning came from."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(2), 2  # the caller of warn_structure
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def first_few(indices: np.ndarray) -> list[int]:
    """The first few of ``indices`` for a message."""
    return np.asarray(indices)[:10].tolist()


def constraint_host(atoms: Any, index: int, system_id: int | None, fixed: np.ndarray) -> Any:
    """The constraints of one structure beyond ``fixed``, encoded (None: none); a
    :class:`StructureError` naming the structure for any it cannot take."""
    from .constraint_io import encode_structure

    return encode_structure(atoms, index, system_name(index, system_id), fixed)


#: "search the closest pair here" (validate_atoms' default; else a pair found before)
NOT_SEARCHED: Any = object()


def distance_cutoff(thinnest: Any, min_distance: float) -> tuple[Any, Any]:
    """The closest-pair search radius and whether the cell is too thin for
    ``min_distance`` (then only coincidence is searched; see :func:`check_distances`).
    ``thinnest``: the cell's smallest periodic height (inf with none), or an array of
    them (then arrays come back)."""
    if isinstance(thinnest, float):  # (one structure: plain floats cost far less)
        thin = thinnest * 4 < min_distance
        return max(COINCIDENT_DISTANCE if thin else min_distance, COINCIDENT_DISTANCE), thin
    thin = np.asarray(thinnest) * 4 < min_distance
    cutoff = np.maximum(np.where(thin, COINCIDENT_DISTANCE, min_distance), COINCIDENT_DISTANCE)
    return cutoff, thin


def validate_atoms(
    atoms: Any,
    index: int,
    min_distance: float = 0.5,
    system_id: int | None = None,
    closest: Any = NOT_SEARCHED,
) -> None:
    """Check one structure; raise :class:`StructureError` naming the system and the fix.

    Errors: no atoms; non-finite coordinates, momenta or cell; atomic numbers that are
    no element; zero, negative or non-finite masses; a cell that is singular, or
    thinner than :data:`MIN_CELL_HEIGHT`, along a periodic direction; unsupported
    constraints; two atoms (periodic images count) within :data:`COINCIDENT_DISTANCE`.
    Atoms closer than ``min_distance`` Å (periodic images count; 0 turns this off) are
    only a :class:`StructureWarning`: such structures are sometimes meant.  ``closest``: the
    closest pair when it was searched before
    (:func:`~.batched_validation.validate_structures`).
    """
    name = system_name(index, system_id)
    if len(atoms) == 0:
        raise StructureError(f"{name} has no atoms: remove it from the input", index)

    def fail(problem: str) -> NoReturn:
        raise StructureError(f"{name}: {problem}", index)

    pos = np.asarray(atoms.positions, dtype=np.float64)
    bad = _bad_rows(~np.isfinite(pos))
    if bad.size:
        fail(
            f"non-finite (NaN/inf) coordinates at atom(s) {first_few(bad)}; fix or drop this "
            f"structure"
        )
    bad = _bad_rows(~np.isfinite(np.asarray(atoms.get_momenta(), dtype=np.float64)))
    if bad.size:
        fail(f"non-finite (NaN/inf) momenta at atom(s) {first_few(bad)}; fix or zero them")
    numbers = np.asarray(atoms.numbers)
    bad = np.flatnonzero(~is_element(numbers))
    if bad.size:
        fail(
            f"atomic number(s) {numbers[bad][:10].tolist()} at atom(s) {first_few(bad)} are "
            f"not elements (1-118, or 0 for a dummy atom X); fix atoms.numbers"
        )
    masses = np.asarray(atoms.get_masses(), dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(masses) & (masses > 0)))
    if bad.size:
        fail(
            f"zero, negative or non-finite mass at atom(s) {first_few(bad)} (element X or "
            f"atoms.set_masses); set positive masses"
        )
    cell = np.asarray(atoms.cell.array, dtype=np.float64)
    if not np.all(np.isfinite(cell)):
        fail("cell has non-finite entries; fix the cell")
    pbc = np.asarray(atoms.pbc, dtype=bool)
    heights = periodic_heights(cell, pbc)
    thin = np.flatnonzero(heights < MIN_CELL_HEIGHT)
    if thin.size:
        fail(
            f"the cell is singular or nearly so along periodic direction(s) "
            f"{np.flatnonzero(pbc)[thin].tolist()} (thickness {heights[thin].min():.3g} Å < "
            f"{MIN_CELL_HEIGHT} Å; pbc={pbc.tolist()}); give a full cell or set pbc=False "
            f"along directions without a lattice vector (periodic directions need independent "
            f"lattice vectors of sensible length)"
        )
    constraint_host(atoms, index, system_id, fixed_mask(atoms, index, system_id))
    check_distances(pos, cell, pbc, heights, min_distance, name, index, system_id, closest)


def is_element(numbers: np.ndarray) -> np.ndarray:
    """Which atomic numbers name an element (ASE's tables: 0, the dummy X, to 118)."""
    from ase.data import chemical_symbols

    return (numbers >= 0) & (numbers < len(chemical_symbols))


def _bad_rows(bad: np.ndarray) -> np.ndarray:
    """Rows of an ``[n, 3]`` mask with any entry set."""
    return np.flatnonzero(bad.any(axis=1))


def check_distances(
    pos: np.ndarray,
    cell: np.ndarray,
    pbc: np.ndarray,
    heights: np.ndarray,
    min_distance: float,
    name: str,
    index: int,
    system_id: int | None,
    closest: Any = NOT_SEARCHED,
) -> None:
    """Coincident atoms raise; atoms (or periodic images) closer than ``min_distance`` warn.

    A cell much thinner than ``min_distance`` would make the pair search enumerate
    thousands of images, so there only coincidence is searched and the thinness is
    reported instead.  ``closest``: the pair if it was searched already.
    """
    if len(pos) < 2 and not pbc.any():
        return
    cutoff, thin = distance_cutoff(float(heights.min()) if heights.size else math.inf, min_distance)
    pair = closest_pair(pos, cell, pbc, cutoff, heights) if closest is NOT_SEARCHED else closest
    if pair is not None and pair[0] < COINCIDENT_DISTANCE:  # never an atom and its own
        d, i, j, image = pair  # image: the cell is at least MIN_CELL_HEIGHT thick
        raise StructureError(
            f"{name}: atoms {i} and {j} coincide{' through a periodic image' if image else ''} "
            f"(distance {d:.2g} Å); remove the duplicate atom (or fix the cell)",
            index,
        )
    if thin:
        warn_structure(
            f"{name}: the cell is only {heights.min():.3f} Å thick along a periodic direction "
            f"(< min_distance={min_distance} Å), so atoms may be that close to their own "
            f"periodic images; use a larger cell (atoms.repeat), or pass a smaller "
            f"min_distance= (0 turns this check off)",
            index,
            system_id,
        )
    elif pair is not None and pair[0] < min_distance:
        d, i, j, image = pair
        what = (
            f"atom {i} is only {d:.3f} Å from its own periodic image"
            if i == j
            else f"atoms {i} and {j} are only {d:.3f} Å apart"
            f"{' (through a periodic image)' if image else ''}"
        )
        warn_structure(
            f"{name}: {what} (< min_distance={min_distance} Å); check the structure "
            f"(duplicate atoms? a too small cell?), or pass a smaller min_distance= (0 turns "
            f"this check off)",
            index,
            system_id,
        )


def require_atoms(structures: Sequence[Any], owner: str) -> None:
    """Every item must be an ``ase.Atoms``: anything else is named before it fails deep
    inside a run."""
    from ase import Atoms

    for k, a in enumerate(structures):
        if not isinstance(a, Atoms):
            raise StructureError(
                f"{owner}: structure {k} is of type {type(a).__name__}, not ase.Atoms; read "
                f"structure files with alchemi_lit.data.read_structures (or pass the path)",
                k,
            )


def require_unique_ids(
    ids: list[int], where: str, fix: str, error: type[ValueError] = BatchError
) -> None:
    """A ``system_id`` names one system; a repeated one would mix up results and info."""
    repeated = [sid for sid, n in Counter(ids).items() if n > 1]
    if repeated:
        raise error(
            f"{where}: system_id(s) {repeated[:10]} occur more than once, but system_ids "
            f"must be unique; {fix}"
        )


def require_same_fields(batches: Sequence[Any]) -> None:
    """Every batch having a field declares it alike: same kind, trailing shape, dtype."""
    seen: dict[str, tuple[int, tuple[str, tuple[int, ...], torch.dtype]]] = {}
    for k, b in enumerate(batches):
        for kind in ("atom", "system"):
            for name, value in getattr(b, kind).items():
                spec = (kind, tuple(value.shape[1:]), value.dtype)
                first, ref = seen.setdefault(name, (k, spec))
                if ref != spec:
                    raise BatchError(
                        f"concatenate: field {name!r} is {_describe(ref)} in batch {first} "
                        f"but {_describe(spec)} in batch {k}; declare it alike in every batch "
                        f"(ensure_field with the same kind, shape and dtype; "
                        f".to(dtype=...) for a different precision) or drop_field it"
                    )


def _describe(spec: tuple[str, tuple[int, ...], torch.dtype]) -> str:
    kind, shape, dtype = spec
    return f"a per-{kind} field of shape [n, {', '.join(map(str, shape))}] ({dtype})".replace(
        ", ]", "]"
    )
