"""Structure input through ASE: every format ``ase.io`` reads."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..core.errors import ConfigError, StructureError, StructureWarning

Occupancy = Literal["error", "majority"]


def read_structures(
    path: str | Path,
    index: str | int | slice = ":",
    format: str | None = None,
    partial_occupancy: Occupancy = "error",
) -> list[Any]:
    """Read all structures of a file (extxyz, cif, POSCAR, traj, ...) as ``ase.Atoms``.

    ``path`` may also be a folder (every file in it, by name) or a glob pattern
    (``"cifs/*.cif"``, sorted), for structures kept one per file; each then carries
    the file it came from in ``info["source_file"]``, so results map back to files.
    ``index`` selects frames within each file.  A results store written by a ZarrSink
    reads as its systems' final states (in ``system_id`` order, each with its
    ``info["system_id"]``, which a new run keeps as the system's id, and its
    ``info["steps"]``, from which it counts on), so one run continues another's
    results as one run of both plans would, random numbers included.  Errors name the
    file and what went wrong; a file with no structures is an error.

    A structure with partially occupied sites (a disordered CIF: ASE reads each such
    site as its majority species, so Cu 0.5 / Au 0.5 comes out as pure Au -- another
    crystal) is refused naming the sites, unless ``partial_occupancy="majority"``
    accepts that approximation, with a :class:`StructureWarning` naming every site.
    """
    if partial_occupancy not in ("error", "majority"):
        raise ConfigError(
            f"partial_occupancy must be 'error' (refuse partially occupied sites) or "
            f"'majority' (take each site's majority species), got {partial_occupancy!r}"
        )
    p = Path(path)
    files = _files_of(path)
    if files is not None:
        frames = []
        for f in files:
            try:
                read = read_structures(f, index, format, partial_occupancy)
            except StructureError as exc:
                if p.is_dir() and "partially occupied" not in str(exc):  # other files?
                    raise StructureError(
                        f"{exc}; or read only the structure files of {str(p)!r} with a "
                        f"pattern such as '{p / '*.cif'}'"
                    ) from exc
                raise
            for atoms in read:
                atoms.info.setdefault("source_file", str(f))
                frames.append(atoms)
        return frames
    if not p.exists():
        raise StructureError(f"structure file {str(p)!r} does not exist; check the path")
    if (p / "zarr.json").is_file():
        return _select(_read_store(p), index, p)
    frames = _read_file(p, index, format)
    for k, atoms in enumerate(frames):
        _ordered(atoms, f"{str(p)!r} (structure {k})", partial_occupancy, p, k)
    return frames


def _cif_labels(path: Path, k: int) -> list[str]:
    """The ``_atom_site_label``s of the ``k``-th structure of a CIF (none if unknown)."""
    try:
        from ase.io.cif import parse_cif

        with open(path) as fh:
            blocks = [b for b in parse_cif(fh) if b.has_structure()]
        return [str(label) for label in blocks[k].get("_atom_site_label", [])]
    except Exception:  # not a CIF, or one ASE read differently: sites go by number
        return []


def _ordered(atoms: Any, name: str, policy: Occupancy, path: Path, k: int) -> None:
    """Refuse ``atoms`` with partially occupied sites (ASE's ``info["occupancy"]``:
    ``{site: {symbol: occupancy}}``, atoms mapped to sites by ``spacegroup_kinds``), or
    give each such site its majority species with a warning (``policy="majority"``)."""
    occupancy = atoms.info.get("occupancy")
    if not isinstance(occupancy, dict) or not occupancy:
        return
    kinds = atoms.arrays.get("spacegroup_kinds", np.arange(len(atoms)))
    partial = {}
    for site, species in occupancy.items():
        rows = np.flatnonzero(kinds == int(site))
        if len(rows) and (len(species) > 1 or sum(species.values()) < 1.0 - 1e-6):
            partial[site] = (species, rows)

    if not partial:
        return
    labels = _cif_labels(path, k)

    def shown(site: str) -> str:
        species, rows = partial[site]
        mix = " + ".join(f"{sym} {occ:g}" for sym, occ in species.items())
        label = f"{labels[int(site)]}, " if int(site) < len(labels) else ""
        return f"site {site} ({label}{mix}, {len(rows)} atoms)"

    sites = "; ".join(shown(site) for site in partial)
    if policy == "error":
        raise StructureError(
            f"{name} has partially occupied sites: {sites}; ASE reads each as one species "
            f"({atoms.get_chemical_formula()}), another crystal: order it first (a supercell "
            f"or SQS tool such as pymatgen's OrderDisorderedStructureTransformation or icet; "
            f"`alchemi-lit order --config ...` or alchemi_lit.workflows.order enumerate its "
            f"orderings and relax them in one run), or pass partial_occupancy='majority' "
            f"(data.partial_occupancy in a config) to take each site's majority species"
        )
    taken = []
    for site, (species, rows) in partial.items():
        best = max(species.values())
        now = atoms.symbols[rows[0]]  # ties: the species the reader chose
        major = now if species.get(now) == best else max(species, key=species.get)
        atoms.symbols[rows] = major
        taken.append(f"{shown(site)} as {major}")
    warnings.warn(
        StructureWarning(
            f"{name}: partially occupied sites taken as their majority species "
            f"(partial_occupancy='majority'), an ordered approximation: {'; '.join(taken)}"
        ),
        stacklevel=3,
    )


def _files_of(path: str | Path) -> list[Path] | None:
    """The files a folder or glob pattern names (None for one file or a store)."""
    import glob

    text = str(path)
    if any(ch in text for ch in "*?[") and not Path(path).exists():  # (a name with "[")
        files = sorted(Path(f) for f in glob.glob(text) if Path(f).is_file())
        if not files:
            raise StructureError(f"no structure file matches {text!r}; check the pattern")
        return files
    p = Path(path)
    if not p.is_dir() or (p / "zarr.json").is_file():
        return None
    files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
    if not files:
        raise StructureError(f"folder {text!r} holds no structure files")
    return files


def _read_file(p: Path, index: str | int | slice, format: str | None) -> list[Any]:
    """All structures of one file ASE reads (see :func:`read_structures`)."""
    import ase.io

    check_format(format)
    try:
        frames = ase.io.read(str(p), index=index, format=format)
    except (StopIteration, IndexError) as exc:
        if isinstance(exc, IndexError) and index in (":", None):  # a parse error, not the index
            raise StructureError(
                f"could not read structures from {str(p)!r} ({type(exc).__name__}: {exc}); check "
                f"the file and pass format=... if the extension does not tell ASE the format"
            ) from exc
        raise StructureError(
            f"index {index!r} selects no structure of {str(p)!r} ({type(exc).__name__}: {exc}); "
            f"use ':' for all frames, or an index/slice within the file's frames"
        ) from exc
    except Exception as exc:  # ase raises many types for unparsable files
        if "Index argument" in str(exc):
            raise StructureError(
                f"index {index!r} is not a valid frame index; use ':' (all frames), an "
                f"integer such as 0 or -1, or a slice such as '0:10'"
            ) from exc
        raise StructureError(
            f"could not read structures from {str(p)!r} ({type(exc).__name__}: {exc}); check the "
            f"file and pass format=... if the extension does not tell ASE the format"
        ) from exc
    frames = frames if isinstance(frames, list) else [frames]
    if not frames and index not in (":", None):
        raise StructureError(
            f"index {index!r} selects no structure of {str(p)!r}; use ':' for all frames, or an "
            f"index/slice within the file's frames"
        )
    if not frames:
        raise StructureError(f"{str(p)!r} contains no structures")
    return frames


def check_format(format: str | None) -> None:
    """``format`` is None or a format ASE knows, else an error with the closest names."""
    if format is None:
        return
    from ase.io.formats import ioformats

    if format not in ioformats:
        import difflib

        close = difflib.get_close_matches(str(format), sorted(ioformats), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise StructureError(
            f"unknown structure file format {format!r}.{hint} `ase info --formats` lists "
            f"them; leave format unset to guess it from the file name"
        )


def _read_store(path: Path) -> list[Any]:
    """The final structures of an alchemi_lit results store."""
    from ..io.results_store import read_results
    from .store_dataset import check_results_store

    check_results_store(path)
    return read_results(path).to_atoms()


def _select(frames: list[Any], index: str | int | slice, path: Path) -> list[Any]:
    """``frames[index]`` with ASE's index syntax (``":"``, ``-1``, ``"0:10"``)."""
    from ase.io.formats import string2index

    try:
        chosen = string2index(index) if isinstance(index, str) else index
        picked = frames[chosen]
    except (ValueError, IndexError, TypeError) as exc:
        raise StructureError(
            f"index {index!r} selects no structure of {str(path)!r} ({len(frames)} stored); "
            f"use ':' for all, or an index/slice within them"
        ) from exc
    picked = picked if isinstance(picked, list) else [picked]
    if not picked:
        raise StructureError(f"{str(path)!r} contains no structures (index {index!r})")
    return picked
