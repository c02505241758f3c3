"""The constraint columns of a results store: which a write appends, which a read gives
back (layout: :mod:`.results_store`).

A store keeps a batch's constraint fields as they are in memory (every field of
:func:`~alchemi_lit.core.constraint_io.stored_fields`, FixSymmetry's operations
included), so the rows read back go through the same
:func:`~alchemi_lit.core.constraint_io.decode_system` as a result in memory, and a
system read back has the constraints it had.  Why the columns are written only once a
store holds a constrained system: an unconstrained campaign then writes no extra array
and pays nothing.  Why, once they exist, every later append writes them (zeros for a
batch without the field): rows past a resumed store's commit marker are overwritten
by the next write, and a column left unwritten would keep a rolled-back row's
constraints for the system that takes its place.  Rows written before the columns
existed read as zeros (the arrays' fill, floats included): unconstrained.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..core.constraint_io import holds_constraints, stored_fields


def columns_to_write(
    atom: dict[str, torch.Tensor], system: dict[str, torch.Tensor], group: Any
) -> dict[str, np.ndarray]:
    """The constraint arrays to append for a (host) batch's fields, by store path
    (``atoms/NAME``, ``systems/NAME``); empty while neither the batch nor the store
    holds a constrained system."""
    fields = stored_fields()
    stored = [n for n, kind in fields.items() if f"{kind}s/{n}" in group]
    if not stored and not holds_constraints(system):
        return {}
    rows = {"atom": len(atom["positions"]), "system": len(system["n_atoms"])}
    out = {}
    for name, kind in fields.items():
        have = (atom if kind == "atom" else system).get(name)
        key = f"{kind}s/{name}"
        if have is not None:
            out[key] = have.numpy()
        elif name in stored:  # (a batch without it: zeros, "not constrained")
            arr = group[key]
            out[key] = np.zeros((rows[kind], *arr.shape[1:]), dtype=arr.dtype)
    return out


def stored_columns(group: Any) -> dict[str, str]:
    """The constraint columns a store holds (name -> ``"atom"`` or ``"system"``)."""
    return {n: k for n, k in stored_fields().items() if f"{k}s/{n}" in group}


def drop_if_unconstrained(atom: dict[str, torch.Tensor], system: dict[str, torch.Tensor]) -> None:
    """Remove the constraint fields of rows read back that hold no constrained system:
    a batch carries them only when it holds one, as in a run."""
    if holds_constraints(system):
        return
    for name, kind in stored_fields().items():
        (atom if kind == "atom" else system).pop(name, None)


__all__ = ["columns_to_write", "drop_if_unconstrained", "stored_columns"]
