"""SizeAwareSampler: feed a dataset into a batch within atom/edge/system budgets.

The strategy asks it for as many systems as fit the capacity that graduation freed
(inflight batching).  Systems come out in dataset order, except that smaller ones
may pass a large system waiting for room (first fit within a lookahead window, for
a bounded number of takes), so free room is used; the order depends only on the
data, budgets and graduations, which keeps runs deterministic.  Every system is
checked before the run starts -- a system larger than the budget, or an invalid
structure, is an error naming its index then, not hours into a campaign (or, with
``skip_invalid``, left out with a warning and listed in the run's summary).  A dataset
is read in streamed passes (its sizes, ids and bands, then the checks) and a take reads
the atoms it hands out, so no list of the dataset's Atoms is ever held.
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
from ..core.errors import ConfigError, StructureError
from .bands import check_band
from .datasets import Subset
from .memory import MemoryReader
from .open_dataset import open_dataset
from .replicas import check_group_sizes
from .sampler_checks import (
    check_arguments,
    check_bands_fit,
    count_all_edges,
    skip_rows,
    validation_pass,
)
from .scan import scan, sharded


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
        dataset: a sequence of ``ase.Atoms`` (a list, or a dataset read on access) or a
            path, streamed (:func:`~alchemi_lit.data.open_dataset`): the sampler keeps
            each structure's size, id and band, and reads its atoms when a take needs them.
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
        shard: ``"i/n"`` or ``(i, n)``: only shard ``i`` of ``n``, the contiguous slice
            :func:`~alchemi_lit.data.datasets.shard_range` (a job array's task); default
            ids stay the dataset positions, so the shards' ids never collide.
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
        shard: str | tuple[int, int] | None = None,
    ) -> None:
        if isinstance(dataset, (str, Path)):
            dataset = open_dataset(dataset)
        check_arguments(dataset, max_atoms, max_systems, max_edges, memory_fraction)
        first = 0  # the global position of the first structure (a shard's own)
        #: which shard of the dataset this sampler runs (``(index, count)``), or None
        self.shard: tuple[int, int] | None = None
        if shard is not None:
            dataset, first, system_ids, self.shard = sharded(dataset, shard, system_ids)
        found = scan(dataset, "SizeAwareSampler")
        if system_ids is not None:
            ids = np.asarray(integral_ids(system_ids), dtype=np.int64)
        elif found.ids is not None:
            ids = found.ids
        else:
            ids = np.arange(first, first + len(dataset), dtype=np.int64)
        self._setup(
            dataset, max_atoms, max_systems, max_edges, ids, found.sizes, found.bands,
            skip_invalid, memory_fraction, memory_reader, found.groups,
        )  # fmt: skip
        #: the atomic numbers and ASE constraint class names that occur (the same pass)
        self.elements, self.constraint_names = found.elements, found.constraints
        self._prechecked, self.content_hashes = found.bad, found.hashes

    def _setup(
        self, dataset: Sequence[Any], max_atoms: int | str, max_systems: int | None,
        max_edges: int | None, ids: np.ndarray, sizes: np.ndarray,
        bands: list[tuple[int, int, int]], skip_invalid: bool, memory_fraction: float,
        memory_reader: MemoryReader | None, groups: Sequence[tuple[int, int, int]] = (),
    ) -> None:  # fmt: skip
        """The sampler of ``dataset`` from its per-structure facts (read once, by
        :func:`~.scan.scan`, or kept from the sampler :meth:`without` came from)."""
        n = len(dataset)
        self.dataset = dataset
        self.auto = isinstance(max_atoms, str)
        #: the atom budget; "auto" until measured (:meth:`bind` with a probe)
        self.max_atoms: int | str = "auto" if self.auto else int(max_atoms)
        self.max_systems = int(max_systems) if max_systems is not None else None
        self.max_edges = int(max_edges) if max_edges is not None else None
        if len(ids) != n or len(np.unique(ids)) != n:
            raise ConfigError("SizeAwareSampler: system_ids must be unique, one per structure")
        self.system_ids = np.asarray(ids, dtype=np.int64)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        #: bands as ``(path_id, start, stop)`` dataset positions; ``unit[k]``: how many
        #: structures are taken with structure k when it heads its unit (a band's first)
        self.bands = bands
        #: replica groups as ``(group, start, stop)``: units like bands (:mod:`.replicas`)
        self.groups = list(groups)
        self.unit = np.ones(n, dtype=np.int64)
        for _, start, stop in [*self.bands, *self.groups]:
            self.unit[start:stop] = 0
            self.unit[start] = stop - start
        self.edges: np.ndarray | None = None
        self.skip_invalid = skip_invalid
        self.memory_fraction = float(memory_fraction)
        self.memory_reader = memory_reader
        self._edge_cap = self.max_edges  # the caller's (a cap on a measured one)
        #: the budget ``"auto"`` falls back to, with a warning, where the model's memory
        #: cannot be seen (the default budget's); None: that is an error
        self.fallback_atoms: int | None = None
        #: what ``max_atoms="auto"`` measured and chose (None until then, or without it)
        self.memory_fit: dict[str, Any] | None = None
        self.order = np.arange(n)
        self.position = 0
        self._passed = 0  # takes that passed the system at the head of the queue
        self._validated = False
        self._prechecked = None  # validation failures found by the scan of this dataset
        #: the structures' content hashes in dataset order (the scan's; None after a change)
        self.content_hashes = None
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
        check_bands_fit(self)
        check_group_sizes(self.groups, self.max_systems, "max_systems", self.sizes)
        if not self.auto:
            check_group_sizes(self.groups, int(self.max_atoms), "max_atoms", self.sizes)

    def __len__(self) -> int:
        return len(self.order)

    def without(self, system_ids: set[int] | Sequence[int]) -> SizeAwareSampler:
        """A sampler of the same data and budgets that leaves out the systems with these
        ids (a restarted run skips the ones already stored); the rest keep their ids."""
        skip = set(int(s) for s in system_ids)
        for _, start, stop in [*self.bands, *self.groups]:  # done when all its members are
            if not skip.issuperset(int(s) for s in self.system_ids[start:stop]):
                skip.difference_update(int(s) for s in self.system_ids[start:stop])
        keep = np.flatnonzero(~np.isin(self.system_ids, np.fromiter(skip, np.int64)))
        new_pos = {int(k): j for j, k in enumerate(keep)}
        bands = [(p, new_pos[a], new_pos[a] + b - a) for p, a, b in self.bands if a in new_pos]
        groups = [(g, new_pos[a], new_pos[a] + b - a) for g, a, b in self.groups if a in new_pos]
        budget = self.requested_budget()[0]
        return self._derived(Subset(self.dataset, keep), budget, keep, bands, groups)

    def with_budget(self, max_atoms: int | str) -> SizeAwareSampler:
        """A sampler of the same structures and facts with another ``max_atoms`` (no pass
        over the dataset)."""
        return self._derived(self.dataset, max_atoms, None, self.bands, self.groups)

    def _derived(
        self, dataset: Sequence[Any], max_atoms: int | str, rows: np.ndarray | None,
        bands: list[tuple[int, int, int]], groups: list[tuple[int, int, int]],
    ) -> SizeAwareSampler:  # fmt: skip
        """A sampler of ``dataset`` (this one's ``rows``, or all of it) from these facts."""
        sub = SizeAwareSampler.__new__(SizeAwareSampler)
        ids, sizes = (self.system_ids, self.sizes) if rows is None else (
            self.system_ids[rows], self.sizes[rows])  # fmt: skip
        sub._setup(
            dataset, max_atoms, self.max_systems, self._edge_cap, ids, sizes, bands,
            self.skip_invalid, self.memory_fraction, self.memory_reader, groups,
        )  # fmt: skip
        sub.shard, sub.elements, sub.fallback_atoms = self.shard, self.elements, self.fallback_atoms
        sub.constraint_names = self.constraint_names
        if rows is None:  # the same dataset: its scan's checks and hashes hold
            sub._prechecked, sub.content_hashes = self._prechecked, self.content_hashes
        return sub

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
        count = self.max_edges is not None
        if count and cutoff is None:
            raise ConfigError("SizeAwareSampler: max_edges needs the model cutoff to count edges")
        if self._prechecked is None:
            bad, edges = validation_pass(self.dataset, cutoff if count else None)
        else:  # validated in the scan: only the edges are left to count
            bad, edges = self._prechecked, count_all_edges(self.dataset, cutoff) if count else None
        if bad and not self.skip_invalid:
            listing = "; ".join(msg for _, msg in bad[:5])
            raise StructureError(
                f"{len(bad)} invalid structure(s) in the dataset: {listing}"
                f"{' ...' if len(bad) > 5 else ''}. Fix them or pass skip_invalid=True",
                bad[0][0],
            )
        queued = set(self.order.tolist())  # (an oversize one is out already)
        self._skip([(k, msg.removeprefix(f"system {k}: ")) for k, msg in bad if k in queued])
        if count:
            self.edges = edges
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
        skip_rows(self, rows)

    def _count_edges(self, cutoff: float | None, why: str) -> np.ndarray:
        if cutoff is None:
            raise ConfigError(f"SizeAwareSampler: {why} needs the model cutoff to count edges")
        return count_all_edges(self.dataset, cutoff)

    def _measure(self, cutoff: float | None, probe: Any) -> None:
        """``max_atoms="auto"``: probe, fit, set the budgets, log and keep the fit."""
        from .memory import default_reader
        from .memory_budget import MemoryNotSeen, choose, measure

        rows = np.asarray(self.order, dtype=np.int64)
        if len(rows) == 0:  # every structure was left out: nothing will run
            self.max_atoms = int(self.sizes.max())
            return
        if self.edges is None:
            self.edges = self._count_edges(cutoff, "max_atoms='auto'")
        reader = self.memory_reader or default_reader(probe.device)
        try:
            probes = measure(
                self.dataset, self.sizes, self.edges, rows, probe, reader, self.memory_fraction
            )
            found = choose(
                probes, self.sizes, self.edges, rows, reader, self.memory_fraction, self._edge_cap
            )
        except MemoryNotSeen as exc:
            if self.fallback_atoms is None:
                raise
            logger.warning(f"{exc}; the default budget instead: max_atoms={self.fallback_atoms}")
            self.max_atoms = self.fallback_atoms
            return
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
