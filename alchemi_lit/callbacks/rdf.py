"""RDF: the radial distribution function of every system, accumulated during the run.

Each sample adds the frame's g(r) (as :func:`alchemi_lit.core.rdf.rdf_frame`: ASE's bins,
minimum image, normalisation) to a per-system sum; the result is their mean over the
samples, ``get_rdf(frames, rmax, nbins)`` of ASE for the same frames.  A frame whose cell
is too small for ``rmax`` (under half a periodic height, possible under a barostat) is
not added and counted in ``rejected``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..core import rdf as core_rdf
from ..core.errors import ConfigError
from ..core.tensor_ops import host_reads_free, identity_key, same_key
from ..engine.hooks import StepContext
from .observables import Observable


class RDF(Observable):
    """Radial distribution function per system: total and by element pair.

    Args:
        rmax: largest distance (Å); at most half the smallest periodic cell height.
        nbins: number of bins of width ``rmax / nbins``.
        pairs: element pairs for partial RDFs, e.g. ``[("Si", "O"), ("O", "O")]``.
        every: loop steps between two samples (>= 1).
        skip: stage steps a system takes before its first sample (equilibration).
        path: zarr store the results are appended to (None: in memory only).
        stages: indices of the plan's stages sampled (None: every MD stage).

    Results per system (:meth:`result`): ``r`` (bin centres, Å), ``g`` ``[1 + P, nbins]``
    (the total RDF, then each pair's, NaN for a pair whose elements the system lacks),
    ``samples`` (frames averaged) and ``rejected`` (frames with a cell too small).
    """

    name = "rdf"

    def __init__(
        self, rmax: float, nbins: int = 100, pairs: Sequence[Sequence[int | str]] = (),
        every: int = 10, skip: int = 0, path: str | os.PathLike[str] | None = None,
        stages: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(every, skip, path, stages)
        if not float(rmax) > 0:
            raise ConfigError(f"RDF: rmax must be > 0 Å, got {rmax!r}")
        if isinstance(nbins, bool) or int(nbins) != nbins or nbins < 1:
            raise ConfigError(f"RDF: nbins must be an int >= 1, got {nbins!r}")
        self.rmax, self.nbins = float(rmax), int(nbins)
        self.pairs = core_rdf.element_pairs(pairs)
        self._layout: tuple[Any, ...] | None = None
        self._constants: tuple[Any, ...] | None = None

    def meta(self) -> dict[str, Any]:
        return {**super().meta(), "rmax": self.rmax, "nbins": self.nbins,
                "pairs": [list(p) for p in self.pairs]}  # fmt: skip

    def declare(self, ctx: StepContext) -> None:
        b = ctx.batch
        b.ensure_field(self.field("g"), "system", (1 + len(self.pairs), self.nbins))
        b.ensure_field(self.field("samples"), "system", (), torch.int64)
        b.ensure_field(self.field("rejected"), "system", (), torch.int64)

    def _pairs(self, ctx: StepContext) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The batch layout's pairs and weights, built once per layout (none where the
        compiled kernel takes the histogram: it visits the pairs without storing them)."""
        b = ctx.batch
        key = (b.segments, b.atom["atomic_numbers"])
        if self._layout is None or any(x is not y for x, y in zip(self._layout[0], key)):
            compiled = core_rdf.pair_histogram.choose(
                b.positions, b.cell, b.pbc, b.system_idx, b.atomic_numbers, b.n_atoms
            ) != "torch"  # (a kernel counts the pairs in place: sum n^2 / 2 indices saved)
            if compiled:
                pairs = (b.system_idx[:0], b.system_idx[:0])
            else:
                pairs = core_rdf.all_pairs(b.n_atoms)
            weights = core_rdf.pair_weights(b.atomic_numbers, *pairs, self.pairs)
            self._layout = (key, pairs, weights)
        return self._layout[1], self._layout[2]

    def _frame_constants(self, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Each system's normalisation (:func:`~alchemi_lit.core.rdf.normalization`) and
        whether its cell fits ``rmax``: kept on CPU while the cell, the periodicity and
        the layout are (MD at a fixed cell computes them once); computed at each sample
        elsewhere, where a captured graph may replay samples at other cells."""
        b = ctx.batch

        def compute() -> tuple[torch.Tensor, torch.Tensor]:
            norm = core_rdf.normalization(b.cell, b.atomic_numbers, b.system_idx, self.rmax,
                                          self.nbins, self.pairs, b.dtype)  # fmt: skip
            return norm, core_rdf.cell_fits(b.cell, b.pbc, self.rmax)

        if not host_reads_free(b.cell):
            return compute()
        key = identity_key((b.cell, b.pbc, b.segments, b.atom["atomic_numbers"]))
        if self._constants is None or not same_key(self._constants[0], key):
            self._constants = (key, compute())
        return self._constants[1]

    def accumulate(self, ctx: StepContext, rows: torch.Tensor) -> None:
        b = ctx.batch
        pairs, weights = self._pairs(ctx)
        counts = core_rdf.pair_histogram(
            b.positions, b.cell, b.pbc, b.system_idx, b.atomic_numbers, b.n_atoms, pairs,
            weights, self.rmax, self.nbins, tuple(self.pairs),
        )  # fmt: skip
        norm, fits = self._frame_constants(ctx)
        g = core_rdf.normalized(counts, norm)
        add = rows & fits
        g_sum, samples = self.field("g"), self.field("samples")
        b.system[g_sum] = torch.where(add.view(-1, 1, 1), b.system[g_sum] + g, b.system[g_sum])
        b.system[samples] = b.system[samples] + add.to(torch.int64)
        rejected = self.field("rejected")
        b.system[rejected] = b.system[rejected] + (rows & ~fits).to(torch.int64)

    def summarize(self, sums: dict[str, np.ndarray]) -> dict[str, Any]:
        n = int(sums["samples"])
        edges = np.linspace(0.0, self.rmax, self.nbins + 1)
        g = sums["g"] / n if n else np.full_like(sums["g"], np.nan)
        return {"r": 0.5 * (edges[:-1] + edges[1:]), "g": g, "samples": np.int64(n),
                "rejected": np.int64(sums["rejected"])}  # fmt: skip


__all__ = ["RDF"]
