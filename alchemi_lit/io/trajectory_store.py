"""Reading the trajectory stores :class:`~alchemi_lit.callbacks.TrajectoryWriter` writes.

The layout is described in :mod:`alchemi_lit.callbacks.trajectory`; reading needs no
callback, so it lives with the other readers, below the run loop.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "alchemi_lit.trajectory"
VERSION = 1


def _as_path(path: Any, owner: str) -> Path:
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{owner}: path must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)


def _is_store(path: Path) -> bool:
    return (path / "zarr.json").is_file()


def read_trajectory(path: str | os.PathLike[str], system_id: int) -> list[Any]:
    """Frames of system ``system_id`` as ``ase.Atoms``, in the order they were written.

    That is step order within a run, runs in the order they were appended.  Each
    ``Atoms`` has the stored cell and pbc; ``energy``, ``forces`` and ``stress`` (when
    written) in a ``SinglePointCalculator``; velocities as momenta and masses when
    written; other per-atom fields in ``atoms.arrays`` and per-system fields (e.g.
    ``temperature``) in ``atoms.info``, next to ``system_id``, ``step`` (steps the system
    had taken), ``loop_step``, ``run`` and ``final``.
    """
    import zarr
    from ase import Atoms
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.stress import full_3x3_to_voigt_6_stress

    p = _as_path(path, "read_trajectory")
    if not _is_store(p):
        raise FileNotFoundError(f"read_trajectory: no zarr trajectory store at {p}")
    group = zarr.open_group(p, mode="r")
    if group.attrs.get("format") != FORMAT:
        raise ValueError(f"read_trajectory: {p} is not an alchemi_lit trajectory store")
    if group.get("frames/step") is None:
        raise KeyError(f"read_trajectory: {p} holds no frames yet")
    n_frames = min(int(a.shape[0]) for _, a in group["frames"].arrays())
    n_rows = min(int(a.shape[0]) for _, a in group["systems"].arrays())
    ids = group["systems/system_id"][:n_rows]
    frame_of = group["systems/frame"][:n_rows]
    rows = np.flatnonzero((ids == int(system_id)) & (frame_of < n_frames))  # complete frames
    if rows.size == 0:
        known = np.unique(ids)
        raise KeyError(
            f"read_trajectory: system {system_id} is not in {p}; it holds systems "
            f"{known[:20].tolist()}{' ...' if known.size > 20 else ''}"
        )
    sys_keys = list(group["systems"].array_keys())
    atom_keys = list(group["atoms"].array_keys())
    sys_data = {k: group[f"systems/{k}"].oindex[rows] for k in sys_keys}
    n_atoms, offset = sys_data["n_atoms"], sys_data["atom_offset"]
    aidx = np.concatenate([np.arange(o, o + n) for o, n in zip(offset, n_atoms)])
    atom_data = {k: group[f"atoms/{k}"].oindex[aidx] for k in atom_keys}
    frames = sys_data["frame"]
    loop_steps = group["frames/step"].oindex[frames]
    runs = group["frames/run"].oindex[frames]
    layout = {"frame", "system_id", "step", "final", "n_atoms", "atom_offset", "cell", "pbc"}
    calc_keys = {"energy", "stress"}
    out = []
    lo = 0
    for r in range(len(rows)):
        hi = lo + int(n_atoms[r])
        a = {k: v[lo:hi] for k, v in atom_data.items()}
        lo = hi
        atoms = Atoms(
            numbers=a.pop("atomic_numbers").astype(np.int64),
            positions=a.pop("positions"),
            cell=sys_data["cell"][r],
            pbc=sys_data["pbc"][r],
        )
        if "masses" in a:
            atoms.set_masses(a.pop("masses"))
        if "velocities" in a:
            momenta = a.pop("velocities") * atoms.get_masses()[:, None]
            atoms.set_momenta(momenta, apply_constraint=False)
        props: dict[str, Any] = {}
        if "forces" in a:
            props["forces"] = a.pop("forces")
        for k, v in a.items():
            atoms.new_array(k, v)
        if "energy" in sys_data:
            props["energy"] = float(sys_data["energy"][r])
        if "stress" in sys_data and abs(np.linalg.det(sys_data["cell"][r])) > 1e-12:
            props["stress"] = full_3x3_to_voigt_6_stress(sys_data["stress"][r])
        atoms.info.update(
            system_id=int(system_id),
            step=int(sys_data["step"][r]),
            loop_step=int(loop_steps[r]),
            run=int(runs[r]),
            final=bool(sys_data["final"][r]),
        )
        for k in set(sys_keys) - layout - calc_keys:
            v = sys_data[k][r]
            atoms.info[k] = v.item() if np.ndim(v) == 0 else v
        if props:
            atoms.calc = SinglePointCalculator(atoms, **props)
        out.append(atoms)
    return out


def trajectory_system_ids(path: str | os.PathLike[str]) -> np.ndarray:
    """Sorted ids of the systems with at least one frame in the store at ``path``."""
    import zarr

    p = _as_path(path, "trajectory_system_ids")
    if not _is_store(p):
        raise FileNotFoundError(f"trajectory_system_ids: no zarr trajectory store at {p}")
    group = zarr.open_group(p, mode="r")
    arr = group.get("systems/system_id")
    return np.zeros(0, dtype=np.int64) if arr is None else np.unique(arr[:])
