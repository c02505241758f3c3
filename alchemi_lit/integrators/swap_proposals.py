"""The swap's part of ``SwapMC(..., proposals=k)``: its auxiliary swap's fields, undoing
the swaps, and its statistics; the generalized Metropolis-Hastings step itself (draws,
choice, every row taking the chosen state) is :mod:`.proposals`.  Valid because the swap
kernel is symmetric: a swap keeps the composition (design record 57).
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.state import Batch
from . import mc_ops as mc
from . import proposals as props
from .base import FieldSpec

#: the auxiliary swap's two sites (stage-private, local atom indices)
FIELDS: dict[str, FieldSpec] = {
    "mc_aux_a": FieldSpec("system", dtype="int64"),
    "mc_aux_b": FieldSpec("system", dtype="int64"),
}


def same_pair(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Whether the swaps ``{a, b}`` and ``{c, d}`` are one: then ``K(K(x))`` is ``x``."""
    return ((a == c) & (b == d)) | ((a == d) & (b == c))


def post_update(stage: Any, batch: Batch, mask: torch.Tensor) -> None:
    """Choose among ``{x, y_1 .. y_k}`` (:func:`.proposals.conclude`); statistics:
    accepted when the chosen state is not ``x``, counted under the pair kind of the
    auxiliary swap."""
    starts = batch.ptr[:-1]

    def site(name: str) -> torch.Tensor:
        return torch.where(mask, getattr(batch, name) + starts, starts)

    a, b, c, d = (site(n) for n in ("mc_aux_a", "mc_aux_b", "mc_site_a", "mc_site_b"))
    proposed = {n: getattr(batch, n) for n in props.PROPOSED}
    mc.exchange(batch, c, d)  # every row back to x: its own swap undone, then z's
    mc.exchange(batch, a, b)
    idx = mc.species_index(batch, stage._numbers)
    kind = mc.pair_kind(idx.index_select(0, a), idx.index_select(0, b), len(stage.species))
    e_y = proposed["energy"]
    source, moved = props.conclude(stage, batch, mask, proposed, batch.mc_energy, e_y)
    back = same_pair(batch.mc_aux_a, batch.mc_aux_b, batch.mc_site_a.index_select(0, source),
                     batch.mc_site_b.index_select(0, source))  # fmt: skip
    mc.record(batch, mask, moved & ~back, kind, "pair")


__all__ = ["FIELDS", "post_update", "same_pair"]
