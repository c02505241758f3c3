"""SizeAwareSampler: feed a dataset into a batch within atom/edge/system budgets.

The strategy asks it for as many systems as fit the capacity that graduation freed
(inflight batching).  Systems come out in dataset order, except that smaller ones
may pass a large system waiting for room (first fit within a lookahead window, for
a bounded number of takes), so free room is used; the order depends only on the
data, budgets and graduations, which keeps runs deterministic.  Every system is
checked before the run starts -- a system larger than the budget, or an invalid
structure, is an error naming its index then, not hours into a campaign (or, with
``skip_invalid``, left out with a warning and listed in the run's summary).
``max_atoms="auto"`` measures the budgets when the sampler is bound to the run's
model (:mod:`alchemi_lit.data.memory_budget`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from loguru import logger

from ..core.atoms_codec import integral_ids
from ..core.batched_validation import validate_structures
from ..core.errors import ConfigError, StructureError
from ..core.geometry import count_pairs
from ..core.state import default_system_ids, require_atoms
from .bands import band_runs, check_band
from .io import read_structures
from .memory import MemoryReader

#: structures validated together (their small cells' closest pairs in one search each),
#: few enough that a lazily read dataset is never all in memory
VALIDATION_CHUNK = 4096


class SizeAwareSampler:
    """Yield systems of ``dataset`` within ``max_atoms`` / ``max_edges`` / ``max_systems``.

    ``max_edges`` counts neighbour pairs within the model's cutoff plus skin, counted
    once per system when the sampler is bound to a model.  With ``max_atoms="auto"``
    the run measures the model's memory on a few small probe batches when it binds the
    sampler (``memory = a + b * atoms + c * edges``, fitted) and sets ``max_atoms`` (and
    ``max_edges`` where edges cost memory) so that a full batch is predicted to take
    ``memory_fraction`` of the free memory; the fit and budgets are logged, kept in
    :attr:`memory_fit` and recorded with the run in its results stores.

    The images of a nudged elastic band (consecutive structures sharing
    ``info["path_id"]``, :mod:`.bands`) are taken as one unit, never split across
    batches: a band larger than the budget is an error before the run.

    Args:
        dataset: a sequence of ``ase.Atoms`` or a path :func:`read_structures` reads.
        max_atoms: most atoms in flight at once, or ``"auto"`` (measured).
        max_systems: most systems in flight at once (None: no limit).
        max_edges: most neighbour pairs in flight (None: no limit; with ``"auto"``, a
            cap on the measured one).
        system_ids: one id per structure (default: dataset positions, or the ids that
            results of an earlier run carry: :func:`~alchemi_lit.core.state.default_system_ids`).
        skip_invalid: leave invalid structures, and ones above ``max_atoms`` or
            ``max_edges``, out with a warning instead of failing (:attr:`skipped` and the
            run's summary list them, with why).
        memory_fraction: share of the free memory a full batch may take (``"auto"``).
        memory_reader: where memory is read (``"auto"``; default: the run's device).
    """

    #: how many systems that do not fit yet a refill may pass looking for ones that do
    LOOKAHEAD = 256
    #: takes that may pass the head of the queue before the room is kept for it
    MAX_PASSED = 8

    def __init__(
        self,
        dataset: Sequence[Any] | str | Path,
        max_atoms: int | Literal["auto"],
        max_systems: int | None = None,
        max_edges: int | None = None,
        system_ids: Sequence[int] | None = None,
        skip_invalid: bool = False,
        memory_fraction: float = 0.8,
        memory_reader: MemoryReader | None = None,
    ) -> None:
        if isinstance(dataset, (str, Path)):
            dataset = read_structures(dataset)
        self.dataset = dataset
        self.auto = isinstance(max_atoms, str)
        if self.auto and max_atoms != "auto":
            raise ConfigError(
                f"SizeAwareSampler: max_atoms must be a number >= 1 or 'auto', got {max_atoms!r}"
            )
        if not self.auto and int(max_atoms) < 1:
            raise ConfigError(f"SizeAwareSampler: max_atoms must be >= 1, got {max_atoms}")
        if not 0.0 < float(memory_fraction) <= 1.0:
            raise ConfigError(
                f"SizeAwareSampler: memory_fraction must be in (0, 1], got {memory_fraction}: "
                f"the share of the free memory a full batch may take (0.8: 80 %)"
            )
        if max_systems is not None and int(max_systems) < 1:
            raise ConfigError(f"SizeAwareSampler: max_systems must be >= 1, got {max_systems}")
        if max_edges is not None and int(max_edges) < 1:
            raise ConfigError(f"SizeAwareSampler: max_edges must be >= 1, got {max_edges}")
        #: the atom budget; "auto" until measured (:meth:`bind` with a probe)
        self.max_atoms: int | str = "auto" if self.auto else int(max_atoms)
        self.max_systems = int(max_systems) if max_systems is not None else None
        self.max_edges = int(max_edges) if max_edges is not None else None
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise ConfigError(
                f"SizeAwareSampler: the dataset must be indexable (len() and [k]) or a path, "
                f"got a {type(dataset).__name__}; wrap it in list(...)"
            )
        n = len(dataset)
        if n == 0:
            raise ConfigError("SizeAwareSampler: the dataset is empty")
        items = [dataset[k] for k in range(n)]  # (read once: a dataset may load lazily)
        require_atoms(items, "SizeAwareSampler")
        ids = default_system_ids(items) if system_ids is None else integral_ids(system_ids)
        if len(ids) != n or len(set(ids)) != n:
            raise ConfigError("SizeAwareSampler: system_ids must be unique, one per structure")
        self.system_ids = np.asarray(ids, dtype=np.int64)
        self.sizes = np.asarray([len(a) for a in items], dtype=np.int64)
        #: bands as ``(path_id, start, stop)`` dataset positions; ``unit[k]``: how many
        #: structures are taken with structure k when it heads its unit (a band's first)
        self.bands = band_runs(items)
        self.unit = np.ones(n, dtype=np.int64)
        for _, start, stop in self.bands:
            self.unit[start:stop] = 0
            self.unit[start] = stop - start
        self.edges: np.ndarray | None = None
        self.skip_invalid = skip_invalid
        self.memory_fraction = float(memory_fraction)
        self.memory_reader = memory_reader
        self._edge_cap = self.max_edges  # the caller's (a cap on a measured one)
        #: what ``max_atoms="auto"`` measured and chose (None until then, or without it)
        self.memory_fit: dict[str, Any] | None = None
        self.order = np.arange(n)
        self.position = 0
        self._passed = 0  # takes that passed the system at the head of the queue
        self._validated = False
        #: structures left out under ``skip_invalid``: ``{"index", "system_id", "reason"}``
        self.skipped: list[dict[str, Any]] = []
        too_big = np.flatnonzero(self.sizes > self.max_atoms) if not self.auto else []
        if len(too_big) and not skip_invalid:
            k = int(too_big[0])
            raise StructureError(
                f"system {k} (system_id {self.system_ids[k]}) has {int(self.sizes[k])} atoms, "
                f"more than max_atoms={self.max_atoms} "
                f"({len(too_big)} system(s) too large); raise max_atoms, remove them or pass "
                f"skip_invalid=True",
                k,
            )
        limit = f"more than max_atoms={self.max_atoms}"
        self._skip([(int(k), f"{int(self.sizes[k])} atoms, {limit}") for k in too_big])
        self._check_bands_fit()

    def _check_bands_fit(self) -> None:
        """A band runs in one batch: refuse one larger than the budget (before the run)."""
        queued = set(self.order.tolist())
        for p, start, stop in self.bands:
            if start not in queued:  # skipped (skip_invalid)
                continue
            atoms, count = int(self.sizes[start:stop].sum()), stop - start
            edges = int(self.edges[start:stop].sum()) if self.edges is not None else 0
            measured = None if self.max_atoms == "auto" else self.max_atoms
            for what, need, limit in (
                ("max_atoms", atoms, measured),
                ("max_systems", count, self.max_systems),
                ("max_edges", edges, self.max_edges if self.edges is not None else None),
            ):
                if limit is not None and need > int(limit):
                    raise StructureError(
                        f"band path_id {p} (structures {start}-{stop - 1}) needs {what}={need} "
                        f"in one batch, more than {what}={limit}; a band is never split: "
                        f"raise {what} to at least {need} or use fewer images",
                        start,
                    )

    def __len__(self) -> int:
        return len(self.order)

    def without(self, system_ids: set[int] | Sequence[int]) -> SizeAwareSampler:
        """A sampler of the same data and budgets that leaves out the systems with these
        ids (a restarted run skips the ones already stored); the rest keep their ids."""
        skip = set(int(s) for s in system_ids)
        for _, start, stop in self.bands:  # a band is done when all its images are
            if not skip.issuperset(int(s) for s in self.system_ids[start:stop]):
                skip.difference_update(int(s) for s in self.system_ids[start:stop])
        keep = [k for k in range(len(self.dataset)) if int(self.system_ids[k]) not in skip]
        return SizeAwareSampler(
            [self.dataset[k] for k in keep], *self.requested_budget(),
            system_ids=[int(self.system_ids[k]) for k in keep], skip_invalid=self.skip_invalid,
            memory_fraction=self.memory_fraction, memory_reader=self.memory_reader,
        )  # fmt: skip

    def requested_budget(self) -> tuple[int | str, int | None, int | None]:
        """(max_atoms, max_systems, max_edges) as given (``"auto"`` stays ``"auto"``)."""
        return ("auto" if self.auto else self.max_atoms), self.max_systems, self._edge_cap

    @property
    def remaining(self) -> int:
        return len(self.order) - self.position

    @property
    def exhausted(self) -> bool:
        return self.position >= len(self.order)

    def bind(self, cutoff: float | None = None, probe: Any = None) -> None:
        """Validate every structure and, with ``max_edges``, count its edges at ``cutoff``
        (the model's cutoff plus skin).  With ``max_atoms="auto"``, ``probe`` (the run's
        model, see :class:`~alchemi_lit.engine.memory_probe.MemoryProbe`) measures the
        budgets; without one they stay unmeasured (a check that runs nothing)."""
        if not self._validated:
            self._validate(cutoff)
            self._validated = True
        if self.max_atoms == "auto" and probe is not None:
            self._measure(cutoff, probe)

    def _validate(self, cutoff: float | None) -> None:
        bad: list[tuple[int, str]] = []
        for start in range(0, len(self.dataset), VALIDATION_CHUNK):
            stop = min(start + VALIDATION_CHUNK, len(self.dataset))
            chunk = [self.dataset[k] for k in range(start, stop)]
            validate_structures(chunk, [None] * len(chunk), first_index=start, errors=bad)
        if bad and not self.skip_invalid:
            listing = "; ".join(msg for _, msg in bad[:5])
            raise StructureError(
                f"{len(bad)} invalid structure(s) in the dataset: {listing}"
                f"{' ...' if len(bad) > 5 else ''}. Fix them or pass skip_invalid=True",
                bad[0][0],
            )
        queued = set(self.order.tolist())  # (an oversize one is out already)
        self._skip([(k, msg.removeprefix(f"system {k}: ")) for k, msg in bad if k in queued])
        if self.max_edges is not None:
            self.edges = self._count_edges(cutoff, "max_edges")
            too_many = [int(k) for k in self.order if self.edges[k] > self.max_edges]
            limit = f"neighbour pairs, more than max_edges={self.max_edges}"
            if too_many and self.skip_invalid:
                self._skip([(k, f"{int(self.edges[k])} {limit}") for k in too_many])
            elif too_many:
                k = int(too_many[0])
                raise StructureError(
                    f"system {k} has {int(self.edges[k])} neighbour pairs, more than "
                    f"max_edges={self.max_edges}; raise max_edges or remove it",
                    k,
                )
        for p, start, stop in self.bands:
            check_band([self.dataset[k] for k in range(start, stop)], p, start)
        self._check_bands_fit()

    def _skip(self, rows: list[tuple[int, str]]) -> None:
        """Leave dataset rows out (``skip_invalid``) with a warning naming each and why;
        the run's summary lists them (:attr:`skipped`)."""
        if not rows:
            return
        for k, why in rows:
            self.skipped.append({"index": k, "system_id": int(self.system_ids[k]), "reason": why})
        listing = "; ".join(
            f"system {k} (system_id {self.system_ids[k]}): {why}" for k, why in rows
        )
        logger.warning(f"skipping {len(rows)} invalid structure(s) (skip_invalid=True): {listing}")
        skip = {k for k, _ in rows}
        for p, start, stop in self.bands:  # a band with a skipped image goes whole
            mates = [k for k in range(start, stop) if k not in skip]
            if len(mates) < stop - start:
                for k in mates:
                    self.skipped.append(
                        {
                            "index": k,
                            "system_id": int(self.system_ids[k]),
                            "reason": f"in band path_id {p} with a skipped image",
                        }
                    )
                skip.update(mates)
        self.order = np.asarray([k for k in self.order if k not in skip], dtype=np.int64)

    def _count_edges(self, cutoff: float | None, why: str) -> np.ndarray:
        if cutoff is None:
            raise ConfigError(f"SizeAwareSampler: {why} needs the model cutoff to count edges")
        return np.asarray([_count_edges(self.dataset[k], cutoff) for k in range(len(self.dataset))])

    def _measure(self, cutoff: float | None, probe: Any) -> None:
        """``max_atoms="auto"``: probe, fit, set the budgets, log and keep the fit."""
        from .memory import default_reader
        from .memory_budget import choose, measure

        rows = np.asarray(self.order, dtype=np.int64)
        if len(rows) == 0:  # every structure was left out: nothing will run
            self.max_atoms = int(self.sizes.max())
            return
        if self.edges is None:
            self.edges = self._count_edges(cutoff, "max_atoms='auto'")
        reader = self.memory_reader or default_reader(probe.device)
        probes = measure(
            self.dataset, self.sizes, self.edges, rows, probe, reader, self.memory_fraction
        )
        found = choose(
            probes, self.sizes, self.edges, rows, reader, self.memory_fraction, self._edge_cap
        )
        logger.info(found.summary())
        # (edges stay counted even without an edge budget: a resume that measures an
        # edge budget then finds the checkpoint's in-flight edge count kept)
        self.max_atoms, self.max_edges = found.max_atoms, found.max_edges
        self.memory_fit = found.as_dict()
        self._check_bands_fit()

    def take(
        self, free_atoms: int, free_systems: int, free_edges: int | None = None
    ) -> tuple[list[Any], list[int]]:
        """Next systems that fit the free capacity; returns (atoms, system_ids).

        In dataset order, except that systems may pass ones that do not fit yet (first
        fit, passing at most ``LOOKAHEAD`` of them): a large system waiting for room no
        longer leaves the room that is free unused.  So that it is not passed forever,
        after ``MAX_PASSED`` takes that passed it nothing passes it any more until it
        fits.  The order depends only on the data, budgets and graduations, so runs
        stay deterministic (and a system's result does not depend on its neighbours).
        """
        taken: list[int] = []  # positions in self.order, ascending
        head_fits = False
        passed = 0  # systems skipped over so far
        scan = self.position
        while scan < len(self.order):
            if free_systems <= 0 or free_atoms <= 0 or passed >= self.LOOKAHEAD:
                break
            count = int(self.unit[self.order[scan]])  # a band is one unit (kept contiguous)
            unit = self.order[scan : scan + count]
            n = int(self.sizes[unit].sum())
            e = int(self.edges[unit].sum()) if self.edges is not None else 0
            fits = n <= free_atoms and count <= free_systems
            fits = fits and (free_edges is None or e <= free_edges)
            if scan == self.position:
                head_fits = fits
                if not fits and self._passed >= self.MAX_PASSED:
                    break  # the room that frees up is the head's now
            if fits:
                taken.extend(range(scan, scan + count))
                free_atoms -= n
                free_systems -= count
                if free_edges is not None:
                    free_edges -= e
            else:
                passed += 1
            scan += count
        if not taken:
            return [], []
        self._passed = 0 if head_fits else self._passed + 1
        # the taken systems move to the front of the queue; the others keep their order
        window = self.order[self.position : taken[-1] + 1]
        chosen = np.asarray(taken, dtype=np.int64) - self.position
        self.order[self.position : taken[-1] + 1] = np.concatenate(
            [window[chosen], np.delete(window, chosen)]
        )
        picked = self.order[self.position : self.position + len(taken)]
        self.position += len(taken)
        return [self.dataset[int(k)] for k in picked], [int(self.system_ids[k]) for k in picked]

    def budget(self) -> tuple[int, int, int | None]:
        """(max_atoms, max_systems, max_edges) with ``max_systems`` unbounded as a large int."""
        if self.max_atoms == "auto":
            raise ConfigError(
                "SizeAwareSampler(max_atoms='auto') has not measured its budget: Simulator.run "
                "measures it on the run's device with the single strategy (pipeline and "
                "replicas runs cannot: give max_atoms a number there)"
            )
        return int(self.max_atoms), self.max_systems or 1 << 62, self.max_edges

    def edges_of(self, system_ids: Sequence[int]) -> int:
        """Neighbour pairs of the given systems (0 without an edge budget)."""
        if self.edges is None:
            return 0
        row_of = self.__dict__.get("_row_of")
        if row_of is None:  # built once: bookkeeping asks every few steps
            row_of = self._row_of = {int(s): k for k, s in enumerate(self.system_ids)}
        return int(sum(self.edges[row_of[int(s)]] for s in system_ids))

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "order": self.order.tolist(), "passed": self._passed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order = np.asarray(state["order"], dtype=np.int64)
        self.position = int(state["position"])
        self._passed = int(state.get("passed", 0))


def _count_edges(atoms: Any, cutoff: float) -> int:
    return count_pairs(atoms.positions, atoms.cell.array, atoms.pbc, cutoff)
