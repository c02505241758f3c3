"""Replica groups: copies of a structure, one per rung of a temperature ladder.

A replica exchange (:class:`~alchemi_lit.integrators.tempering.ReplicaExchange`) runs
the replicas of a group side by side in one batch; they are ordinary systems that share
``info["replica_group"]`` and start at rung ``info["replica"]``.  Like the images of a
band they follow each other in the dataset and the sampler takes a group whole, so all
of a group's energies exist at the same step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..core.errors import ConfigError, StructureError

#: the ``atoms.info`` key of a replica's group
GROUP_KEY = "replica_group"
#: the ``atoms.info`` key of a replica's rung at the start (0: the lowest temperature)
RUNG_KEY = "replica"


def make_replicas(structures: Any, n: int, first_group: int = 0) -> list[Any]:
    """``n`` copies of each structure (an ``ase.Atoms`` or a list of them), group ``g``
    (``first_group + index``) at rungs ``0 .. n-1``, in dataset order: the input of a
    replica-exchange run.  Results, constraints and momenta are not copied (each
    replica draws its own Maxwell-Boltzmann velocities)."""
    from ase import Atoms

    items = [structures] if isinstance(structures, Atoms) else list(structures)
    if int(n) < 2:
        raise ConfigError(f"make_replicas: a replica group needs at least 2 replicas, got n={n}")
    out = []
    for g, atoms in enumerate(items):
        if not isinstance(atoms, Atoms):
            kind = type(atoms).__name__
            raise ConfigError(f"make_replicas: structure {g} is a {kind}, not an ase.Atoms")
        for k in range(int(n)):
            copy = Atoms(numbers=atoms.numbers, positions=atoms.positions, cell=atoms.cell,
                         pbc=atoms.pbc, masses=atoms.get_masses())  # fmt: skip
            copy.info = {**{k_: v for k_, v in atoms.info.items() if k_ != "system_id"},
                         GROUP_KEY: first_group + g, RUNG_KEY: k}  # fmt: skip
            out.append(copy)
    return out


def group_of(atoms: Any) -> int | None:
    """The replica group of an ``ase.Atoms`` (``info["replica_group"]``), None outside one."""
    value = atoms.info.get(GROUP_KEY)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise StructureError(
            f"info['replica_group'] must be an integer naming the replica group, got {value!r}; "
            f"build groups with alchemi_lit.data.make_replicas"
        )
    return int(value)


def group_runs(groups: Iterable[tuple[int, int | None]]) -> list[tuple[int, int, int]]:
    """``(group, start, stop)`` runs of consecutive structures of one replica group from
    ``(position, group)`` pairs in ascending position; a group seen again after another
    structure is an error (its replicas must be one unit)."""
    runs: list[tuple[int, int, int]] = []
    for k, g in groups:
        if g is None:
            continue
        if runs and runs[-1][0] == g and runs[-1][2] == k:
            runs[-1] = (g, runs[-1][1], k + 1)
            continue
        if any(r[0] == g for r in runs):
            raise StructureError(
                f"replica group {g}: its replicas are not contiguous (again at structure {k}); "
                f"put a group's replicas one after another (make_replicas does)",
                k,
            )
        runs.append((g, k, k + 1))
    return runs


def group_rows(batch: Any, mask: Any, n: int, owner: str) -> dict[int, list[tuple[int, int]]]:
    """``group -> [(row, rung)]`` for the systems of ``mask`` (``[B]``) from their info:
    each must be a replica, and each group must be here whole, rungs ``0 .. n-1`` once
    each (``n``: the ladder's length) -- else a :class:`ConfigError` naming the fix."""
    rows = mask.nonzero().flatten().tolist()
    ids = batch.system_id.tolist()
    found: dict[int, list[tuple[int, int]]] = {}
    for r in rows:
        info = batch.info.get(ids[r], {})
        if info.get(GROUP_KEY) is None or info.get(RUNG_KEY) is None:
            raise ConfigError(
                f"{owner}: system_id {ids[r]} is not a replica (no info['replica_group'] and "
                f"info['replica']); make the replicas with "
                f"alchemi_lit.data.make_replicas(structures, n)"
            )
        found.setdefault(int(info[GROUP_KEY]), []).append((r, int(info[RUNG_KEY])))
    for g, members in found.items():
        rungs = sorted(k for _, k in members)
        if rungs != list(range(n)):
            raise ConfigError(
                f"{owner}: replica group {g} entered with rungs {rungs}, but the ladder has {n} "
                f"temperatures: a group needs one replica per rung 0..{n - 1}, all in one batch "
                f"(make_replicas(structures, n={n}); a SizeAwareSampler keeps groups whole)"
            )
    return found


def check_group_sizes(runs: Sequence[tuple[int, int, int]], limit: int | None, what: str,
                      sizes: Any) -> None:  # fmt: skip
    """Refuse a replica group larger than a budget (``limit`` of ``what``: systems or atoms)."""
    for g, start, stop in runs:
        need = stop - start if what == "max_systems" else int(np.sum(sizes[start:stop]))
        if limit is not None and need > limit:
            raise ConfigError(
                f"replica group {g} (structures {start}-{stop - 1}) needs {what}={need} in one "
                f"batch, more than {what}={limit}; a group is never split: raise {what}"
            )


__all__ = [
    "GROUP_KEY", "RUNG_KEY", "check_group_sizes", "group_of", "group_rows", "group_runs",
    "make_replicas",
]  # fmt: skip
