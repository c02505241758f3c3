"""Measured batch budgets: ``SizeAwareSampler(max_atoms="auto")``.

Before a run, the sampler evaluates the real model (through a probe the run loop
builds: :class:`~alchemi_lit.engine.memory_probe.MemoryProbe`; forward, forces by autograd,
stress where the run needs it, with the plan's integrator state allocated) on a few
small probe batches of its own structures, reads how far each raised the peak
memory, fits ``memory = a + b * atoms + c * edges`` and sizes the budgets so that the
predicted peak of a full batch stays below ``memory_fraction`` of the free memory.

Why a fit rather than growing batches until the device runs out of memory (what
TorchSim's autobatchers do): an out-of-memory error is not one exception (PyTorch's
and Warp's differ), the memory it leaves cached starves other allocators, and a
budget set at the edge fails on the next slightly larger batch.  Probes here stay
within a quarter of the usable memory (each predicted before it runs, from the ones
before), so nothing runs out; the budget keeps a stated margin; and with an edge term
dense systems get a budget in pairs as well as atoms.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from .memory import MemoryReader

#: probes stop once one raised the peak by this many reader resolutions
SIGNAL = 32
#: most probe batches (each up to four times the last: from 1 to ~10^6 atoms)
MAX_PROBES = 12
#: share of the usable memory a probe may be predicted to take
PROBE_SHARE = 0.25
#: probes whose edge-per-atom ratios spread less than this fit ``a + b * atoms``
COLLINEAR_SPREAD = 0.05
#: largest probe while none grew past the resolution (a model whose memory the reader
#: does not see must not be grown into the whole dataset)
SILENT_ATOMS = 4096


class MemoryNotSeen(ConfigError):
    """The model's memory did not grow with the probe batches: the reader cannot see it
    (a model that allocates outside PyTorch), so nothing can be measured."""


@dataclasses.dataclass
class MemoryFit:
    """What ``max_atoms="auto"`` measured and chose; bytes throughout.  ``probes``:
    (atoms, edges, peak growth) of each probe batch; the law is ``intercept +
    per_atom * atoms + per_edge * edges``; budgets put a full batch at ``fraction *
    available``."""

    reader: str
    probes: list[tuple[int, int, int]]
    law: str
    intercept: float
    per_atom: float
    per_edge: float
    available: int
    fraction: float
    max_atoms: int
    max_edges: int | None
    predicted_peak: float
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["probes"] = [list(p) for p in self.probes]
        return out

    def summary(self) -> str:
        law = f"{self.intercept / 2**20:.1f} MiB + {self.per_atom / 1024:.2f} KiB/atom"
        if self.law == "atoms+edges":
            law += f" + {self.per_edge:.0f} B/edge"
        edges = f", max_edges={self.max_edges}" if self.max_edges is not None else ""
        return (
            f"memory budget: max_atoms={self.max_atoms}{edges} (predicted peak "
            f"{self.predicted_peak / 2**20:.1f} MiB of {self.fraction:g} x "
            f"{self.available / 2**20:.0f} MiB free on {self.reader}); fit over "
            f"{len(self.probes)} probe(s): {law}{'; ' + self.note if self.note else ''}"
        )


def measure(
    structures: Sequence[Any],
    sizes: np.ndarray,
    edges: np.ndarray,
    rows: np.ndarray,
    probe: Callable[[Sequence[Any]], None],
    reader: MemoryReader,
    fraction: float,
) -> list[tuple[int, int, int]]:
    """Probe batches of growing size from ``structures[rows]``, alternately the sparsest
    and the densest systems (edges per atom) so that atoms and edges can be told apart;
    returns (atoms, edges, peak growth) of each (the lower of two evaluations: the
    first use of a code path -- lazy loading, compilation, caches -- is not the
    batch's).  Each probe after the first is predicted (scaling a measured one) to
    take at most ``PROBE_SHARE`` of the usable memory (``fraction`` of the free)
    before it runs."""
    density = edges[rows] / np.maximum(sizes[rows], 1)
    by_density = rows[np.lexsort((rows, density))]  # sparse first, ties by index
    total = int(sizes[rows].sum())
    smallest = int(rows[np.argmin(sizes[rows])])

    ends = {False: by_density, True: by_density[::-1]}
    cumulative = {dense: np.cumsum(sizes[order]) for dense, order in ends.items()}

    def pick(target: int, dense: bool) -> list[int]:
        """Systems from one end: the prefix that fits, then first fit of the next few."""
        order = ends[dense]
        m = int(np.searchsorted(cumulative[dense], target, side="right"))
        chosen = [int(k) for k in order[:m]]
        n = int(cumulative[dense][m - 1]) if m else 0
        for k in order[m : m + 1024]:
            if n + sizes[k] <= target:
                chosen.append(int(k))
                n += int(sizes[k])
        return chosen or [smallest]

    cap, res = PROBE_SHARE * fraction * reader.available(), reader.resolution
    done: list[tuple[int, int, int]] = []
    chosen = [smallest]
    for k in range(MAX_PROBES):
        n, e = int(sizes[chosen].sum()), int(edges[chosen].sum())
        readings = []
        for _ in range(2):  # the lower of two: the first may pay for a path's first use
            reader.start()
            probe([structures[i] for i in chosen])
            readings.append(int(reader.peak_growth()))
        done.append((n, e, min(readings)))
        if n >= total or (len(done) >= 3 and done[-1][2] >= SIGNAL * res):
            break
        silent = max(g for _, _, g in done) < res
        nxt = None
        for grow in (4.0, 2.0, 1.5):
            cand = pick(math.ceil(n * grow), dense=k % 2 == 0)
            atoms = int(sizes[cand].sum())
            if silent and atoms > SILENT_ATOMS:
                break
            if _bound(done, atoms, int(edges[cand].sum()), res) <= cap:
                nxt = cand
                break
        if nxt is None or sorted(nxt) == sorted(chosen):
            break
        chosen = nxt
    reader.release()
    return done


def _bound(done: list[tuple[int, int, int]], n: int, e: int, resolution: int) -> float:
    """An upper bound of a batch's growth from measured ones: with a + b N + c E and
    nonnegative terms, scaling N and E by at most s scales the growth by at most s (a
    growth below the resolution counts as the resolution)."""
    return min(max(g, resolution) * max(1.0, n / max(dn, 1), e / max(de, 1)) for dn, de, g in done)


def fit(probes: list[tuple[int, int, int]], resolution: int) -> tuple[float, float, float, str]:
    """Least-squares ``(a, b, c, note)`` of ``growth = a + b atoms + c edges`` with
    nonnegative slopes (``c = 0`` when the probes cannot tell edges from atoms); all
    zero when no probe grew past the reader's resolution."""
    pts = np.asarray(probes, dtype=np.float64)
    if pts[:, 2].max() < resolution:
        return 0.0, 0.0, 0.0, "no growth above the reader's resolution"
    if len(np.unique(pts[:, 0])) < 2:  # one size: all of it per atom (over-, never under-)
        n, _, g = max(probes, key=lambda p: p[2])
        return 0.0, g / n, 0.0, "one probe size: memory taken as proportional to atoms"
    n, e, g = pts[:, 0], pts[:, 1], pts[:, 2]
    ratio = e / n
    spread = (ratio.max() - ratio.min()) / max(ratio.mean(), 1e-12)
    candidates: list[tuple[float, float, float, str]] = []
    if len(pts) >= 3 and spread >= COLLINEAR_SPREAD:
        a, b, c = np.linalg.lstsq(np.stack([np.ones_like(n), n, e], 1), g, rcond=None)[0]
        if b >= 0 and c >= 0:
            return float(a), float(b), float(c), ""
        (a1, c1) = np.linalg.lstsq(np.stack([np.ones_like(e), e], 1), g, rcond=None)[0]
        candidates.append((float(a1), 0.0, float(c1), "edges only (atoms fitted < 0)"))
    note = (
        f"edges per atom varied by {spread:.1%} across the probes: fitted per atom"
        if spread < COLLINEAR_SPREAD
        else "atoms only (edges fitted < 0)"
        if len(pts) >= 3
        else "two probe sizes: fitted per atom"
    )
    a0, b0 = np.linalg.lstsq(np.stack([np.ones_like(n), n], 1), g, rcond=None)[0]
    candidates.append((float(a0), float(b0), 0.0, note))

    def residual(cand: tuple[float, float, float, str]) -> float:
        return float(np.sum((cand[0] + cand[1] * n + cand[2] * e - g) ** 2))

    ok = [c for c in candidates if c[1] >= 0 and c[2] >= 0 and c[1] + c[2] > 0]
    if not ok:
        return 0.0, 0.0, 0.0, "memory did not grow with the batch"
    return min(ok, key=residual)


def choose(
    probes: list[tuple[int, int, int]],
    sizes: np.ndarray,
    edges: np.ndarray,
    rows: np.ndarray,
    reader: MemoryReader,
    fraction: float,
    max_edges: int | None = None,
) -> MemoryFit:
    """The fit and the budgets: the predicted peak of a batch at ``max_atoms`` atoms
    and ``max_edges`` pairs (split at the dataset's mean edges per atom, and at least
    the largest system) is ``fraction`` of the free memory, or the whole dataset."""
    a, b, c, note = fit(probes, reader.resolution)
    a = max(a, 0.0)  # a negative intercept is noise; zero only predicts more
    available = int(reader.available())
    usable = fraction * available
    n, e = sizes[rows].astype(np.float64), edges[rows].astype(np.float64)
    total_n, total_e = float(n.sum()), float(e.sum())
    whole = [g for atoms, _, g in probes if atoms >= total_n]
    if whole and whole[-1] <= usable:  # measured: everything fits at once
        return MemoryFit(
            reader=reader.name, probes=probes, law="atoms+edges" if c > 0 else "atoms",
            intercept=a, per_atom=b, per_edge=c, available=available, fraction=fraction,
            max_atoms=int(total_n), max_edges=max_edges, predicted_peak=float(whole[-1]),
            note="the whole dataset was probed" + (f"; {note}" if note else ""),
        )  # fmt: skip
    if b <= 0 and c <= 0:
        seen = ", ".join(f"{g / 2**20:.2f} MiB for {atoms} atoms" for atoms, _, g in probes)
        raise MemoryNotSeen(
            f"max_atoms='auto': the model's memory use did not grow with the batch past "
            f"{reader.resolution / 2**20:g} MiB on {reader.name} ({seen}): its memory is not "
            f"seen by this reader (a model that allocates outside PyTorch?), or too little is "
            f"free to probe in ({usable / 2**20:.1f} MiB usable); give max_atoms a number"
        )
    need = a + b * n + c * e
    worst, k_n = int(np.argmax(need)), int(np.argmax(n))
    k_e = int(np.argmax(e)) if c > 0 else k_n
    if a + b * n[k_n] + c * e[k_e] > usable:
        k = int(rows[worst]) if need[worst] > usable else int(rows[k_n])
        what = (
            f"system {k} ({int(sizes[k])} atoms, {int(edges[k])} pairs) alone needs "
            f"{need[worst] / 2**20:.0f} MiB"
            if need[worst] > usable
            else f"a budget holding the largest system ({int(rows[k_n])}: {int(n[k_n])} "
            f"atoms) and the densest ({int(rows[k_e])}: {int(e[k_e])} pairs) needs "
            f"{(a + b * n[k_n] + c * e[k_e]) / 2**20:.0f} MiB"
        )
        raise ConfigError(
            f"max_atoms='auto': {what} by the fitted law{f' ({note})' if note else ''}, more "
            f"than memory_fraction="
            f"{fraction:g} of the {available / 2**20:.0f} MiB free on {reader.name}; raise "
            f"memory_fraction, free memory, or run the largest systems apart"
        )
    if c <= 0:
        atoms_budget, edge_budget = (usable - a) / b, None
    elif b <= 0:
        atoms_budget, edge_budget = total_n, (usable - a) / c
    else:
        rho = total_e / total_n
        atoms_budget = max((usable - a) / (b + c * rho), n.max())
        edge_budget = (usable - a - b * atoms_budget) / c
        if edge_budget < e.max():
            edge_budget = e.max()
            atoms_budget = (usable - a - c * edge_budget) / b
    # (at least the largest system, which the check above found to fit: no rounding loss)
    max_atoms = max(int(min(math.floor(atoms_budget), total_n)), int(n.max()))
    limit = None
    if edge_budget is not None:
        limit = max(int(min(math.floor(edge_budget), total_e)), int(e.max()))
    if max_edges is not None:
        limit = max_edges if limit is None else min(limit, max_edges)
    return MemoryFit(
        reader=reader.name, probes=probes, law="atoms+edges" if c > 0 else "atoms",
        intercept=a, per_atom=b, per_edge=c, available=available, fraction=fraction,
        max_atoms=max_atoms, max_edges=limit,
        predicted_peak=a + b * max_atoms + c * (limit if limit is not None else 0), note=note,
    )  # fmt: skip
