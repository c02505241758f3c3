"""The model call of a step, and what happens when the model raises.

One structure the model cannot evaluate (an element it lacks, a descriptor undefined
for that geometry) must not stop thousands of others: the batch is bisected to the
systems the model fails on, those are quarantined with the error text (exit reason
``model_error``), and the others get their results from an evaluation without them.
If every system fails on its own, the model -- not a structure -- is broken: the
error is raised.
"""

from __future__ import annotations

from typing import Any

import torch
from loguru import logger

from ..core.state import MODEL_ERROR_KEY, Batch
from ..models.neighbors import NeighborList


def isolate_failure(
    model: Any, batch: Batch, exc: Exception, needs_stress: bool
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Bisect ``batch`` to the systems ``model`` raises on (``exc`` came from the whole
    batch); returns the results for the others (the failing ones keep their last
    values) and the ``[B]`` mask of the failing ones, whose error text is written to
    ``batch.info``.  Re-raises ``exc`` when the model fails on every system alone."""

    def fails(rows: list[int]) -> Exception | None:
        try:
            model(
                batch.select(rows), compute_stress=False, neighbors=NeighborList(model.cutoff, 0.0)
            )
        except Exception as e:
            return e
        return None

    bad: dict[int, Exception] = {}

    def bisect(rows: list[int], err: Exception) -> None:
        if len(rows) == 1:
            bad[rows[0]] = err
            return
        half = len(rows) // 2
        for part in (rows[:half], rows[half:]):
            e = fails(part)
            if e is not None:
                bisect(part, e)

    rows = list(range(batch.num_systems))  # finished systems awaiting graduation too
    bisect(rows, exc)
    if not bad or (len(bad) == len(rows) and len(rows) > 1):
        raise exc  # not one structure's fault: the model itself fails
    good = [r for r in range(batch.num_systems) if r not in bad]
    energy = batch.energy.clone()  # quarantined systems keep their last values
    forces = batch.forces.clone()
    stress = batch.stress.clone()
    if good:
        sub = model(
            batch.select(good),
            compute_stress=needs_stress,
            neighbors=NeighborList(model.cutoff, 0.0),
        )
        idx = torch.as_tensor(good, device=batch.device)
        energy[idx] = sub["energy"]
        forces[batch.atom_index(idx)] = sub["forces"]
        if "stress" in sub:
            stress[idx] = sub["stress"]
    mask = torch.zeros(batch.num_systems, dtype=torch.bool, device=batch.device)
    mask[list(bad)] = True
    for row, err in bad.items():
        sid = int(batch.system_id[row])
        text = f"{type(err).__name__}: {err}"
        batch.info.setdefault(sid, {})[MODEL_ERROR_KEY] = text
        logger.warning(f"system {sid} quarantined: the model raised on it ({text})")
    out = {"energy": energy, "forces": forces}
    if needs_stress:
        out["stress"] = stress
    return out, mask
