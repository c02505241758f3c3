"""The ``k`` copies of each structure that a move with ``proposals=k`` runs as one chain.

Why copies made before the run: an integrator cannot add batch rows for a forward (a
refill adds systems), so a chain's ``k`` proposals need ``k`` systems from the start.
They are ordinary systems sharing ``info["replica_group"]`` (the chain) with
``info["replica"]`` their copy index, like a replica exchange's groups, so the sampler
takes a chain whole (and refuses one larger than its budget).  :meth:`Simulator.run` and
the CLI expand the structures (:func:`expand`); the rows stay identical, marked by the
``mc_chain`` / ``mc_copy`` fields, and ``to_pandas`` keeps copy 0 only.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Sequence
from typing import Any

import torch

from ..core.errors import ConfigError
from ..core.state import Batch
from ..data.replicas import GROUP_KEY, RUNG_KEY
from .extended import CellOptimizer
from .proposals import CHAIN, COPY


def check_single_temperature(stage: Any) -> None:
    """A list of temperatures is per system_id, which the copies renumber: refused."""
    if isinstance(stage.temperature, torch.Tensor) and stage.temperature.dim() > 0:
        raise ConfigError(
            f"{stage!r}: give one temperature (a number or a schedule), not one per "
            f"system_id: the copies of each chain (proposals > 1) get their own ids"
        )


def plan_proposals(stages: Sequence[Any]) -> int:
    """The plan's ``proposals`` (1: none above 1); a plan whose other stages would make
    a chain's copies differ (MD, other Monte Carlo) is refused."""
    k = max([int(getattr(s, "proposals", 1)) for s in stages] + [1])
    if k == 1:
        return 1
    for s in stages:
        if not (isinstance(s, CellOptimizer) or int(getattr(s, "proposals", 1)) == k):
            raise ConfigError(
                f"proposals={k} shares the plan with {s!r}: the copies of a chain must stay "
                f"identical, so its plan may hold relaxations (FIRE, BFGS ...) and Monte Carlo "
                f"stages of the same proposals only; run the other stages in another run"
            )
    return k


def copy_of(atoms: Any, chain: int, j: int) -> Any:
    """Copy ``j`` of a chain: the structure (constraints, momenta, arrays kept), its info
    without ``system_id`` (each copy gets its own), the chain and copy index added."""
    out = atoms.copy()
    out.info = {**{key: v for key, v in atoms.info.items() if key != "system_id"},
                GROUP_KEY: chain, RUNG_KEY: j}  # fmt: skip
    return out


def chain_of(atoms: Any, position: int) -> int:
    """The chain id: the structure's integral ``info["system_id"]``, else its position."""
    sid = atoms.info.get("system_id")
    ok = isinstance(sid, numbers.Integral) and not isinstance(sid, bool)
    return int(sid) if ok else position


class Copies(Sequence):
    """A dataset's structures, each ``k`` times in a row, read on access."""

    def __init__(self, dataset: Sequence[Any], k: int) -> None:
        self.dataset, self.k = dataset, int(k)
    def __len__(self) -> int:
        return len(self.dataset) * self.k

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]
        if not 0 <= int(i) < len(self):
            raise IndexError(i)
        g, j = divmod(int(i), self.k)
        atoms = self.dataset[g]
        return copy_of(atoms, chain_of(atoms, g), j)


def expand(plan: Any, data: Any) -> Any:
    """``data`` with each structure ``k`` times (a list, or a lazy :class:`Copies` of a
    path's dataset) when the plan (fused or a pipeline) has ``proposals=k > 1``; structures
    already in groups (``info["replica_group"]``) and samplers over them are as given."""
    from ase import Atoms

    from ..data.sampler import SizeAwareSampler

    fused = plan.stages.values() if isinstance(plan.stages, dict) else [plan]
    k = plan_proposals([s for f in fused for s in f.stages])
    if k == 1:
        return data
    data = [data] if isinstance(data, Atoms) else data
    if isinstance(data, (str, os.PathLike)):
        from ..data.open_dataset import open_dataset

        data = open_dataset(data)
    if isinstance(data, SizeAwareSampler):
        if data.groups:
            return data
        raise ConfigError(
            f"proposals={k}: the sampler's structures are not in chains of {k} "
            f"copies; build it over alchemi_lit.integrators.proposal_copies.Copies(structures, "
            f"{k}), or give run() the structures and it makes the copies"
        )
    if isinstance(data, Batch):
        raise ConfigError(
            f"proposals={k} runs each structure as {k} copies: give run() the "
            f"ase.Atoms (or a path), not a Batch"
        )
    if len(data) and GROUP_KEY in data[0].info:
        return data  # (groups made by the caller: checked when the stage sets up)
    return list(Copies(data, k)) if isinstance(data, (list, tuple)) else Copies(data, k)


def enter(batch: Batch, k: int, owner: str) -> None:
    """Setup: the chain fields (kept with the results) of the batch's new rows from their
    info; every chain must be here whole, copies ``0 .. k-1`` of one size (reads the host)."""
    for name in (CHAIN, COPY):
        batch.ensure_field(name, "system", (), torch.int64, -1)
    chain, copy = getattr(batch, CHAIN).clone(), getattr(batch, COPY).clone()
    ids, sizes = batch.system_id.tolist(), batch.n_atoms.tolist()
    found: dict[int, list[int]] = {}
    for r in (chain < 0).nonzero().flatten().tolist():
        info = batch.info.get(ids[r], {})
        if info.get(GROUP_KEY) is None or info.get(RUNG_KEY) is None:
            raise ConfigError(
                f"{owner}: system_id {ids[r]} is not a chain's copy (no info['replica_group'] "
                f"and info['replica']); give run() the structures, it makes the {k} copies"
            )
        chain[r], copy[r] = int(info[GROUP_KEY]), int(info[RUNG_KEY])
        found.setdefault(int(chain[r]), []).append(r)
    for g, rows in found.items():
        have = sorted(int(copy[r]) for r in rows)
        if have != list(range(k)) or len({sizes[r] for r in rows}) > 1:
            raise ConfigError(
                f"{owner}: chain {g} entered with copies {have}; "
                f"a chain needs its {k} copies 0..{k - 1} of one structure in one batch (a "
                f"SizeAwareSampler keeps them whole: raise max_systems/max_atoms if refused)"
            )
    setattr(batch, CHAIN, chain)
    setattr(batch, COPY, copy)


__all__ = ["Copies", "chain_of", "check_single_temperature", "copy_of", "enter", "expand",
           "plan_proposals"]  # fmt: skip
