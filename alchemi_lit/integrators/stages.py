"""Stage plans: pure descriptions of what runs where.

* ``a + b`` -> :class:`Fused`: stages sharing one batch and one model forward per
  step on one device; each system carries a status code (its stage) and moves to
  the next code when its stage exits.  ``+`` is left-associative and appends.
* ``x | y`` -> :class:`Pipeline`: one fused plan per rank, finished systems flowing
  along edges between ranks.  ``|`` is left-associative; ``pipe | pipe`` renumbers.

Plans hold no state and no tensors; they can be printed, compared and validated
before anything runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..core.errors import ConfigError

if TYPE_CHECKING:
    from .base import Integrator


@runtime_checkable
class Stage(Protocol):
    """What a plan holds: anything following the integrator contract
    (:class:`~alchemi_lit.integrators.Integrator` and its subclasses).  Checked by shape,
    so plans, a layer below the integrators' implementations, need not import them."""

    max_steps: int

    def setup(self, batch: Any, seed: int, prefix: str) -> None: ...
    def init_systems(self, batch: Any, mask: Any) -> None: ...
    def pre_update(self, batch: Any, mask: Any) -> None: ...
    def post_update(self, batch: Any, mask: Any) -> None: ...
    def converged(self, batch: Any) -> Any: ...


class Fused:
    """Stages run together on one device.

    ``codes`` are the status codes of the stages (default ``0..k-1``), in the order
    systems visit them; ``exit`` is the code of finished systems (default
    ``max(codes) + 1``).  Printed as ``Fused([0:FIRE, 1:Langevin], entry=0, exit=2)``.
    """

    def __init__(
        self,
        stages: Sequence[Integrator],
        codes: Sequence[int] | None = None,
        exit: int | None = None,
    ) -> None:
        stages = list(stages)
        if not stages:
            raise ValueError("a fused plan needs at least one stage")
        for s in stages:
            _refuse_class(s, "a fused stage")
            if not isinstance(s, Stage):
                raise TypeError(
                    f"fused stages must be Integrator instances, got {type(s).__name__}; "
                    f"combine plans with '+' (same device) or '|' (across ranks)"
                )
        codes = list(range(len(stages))) if codes is None else [int(c) for c in codes]
        if len(codes) != len(stages):
            raise ValueError(f"got {len(codes)} status codes for {len(stages)} stages")
        if len(set(codes)) != len(codes) or min(codes) < 0:
            raise ValueError(f"status codes must be distinct and >= 0, got {codes}")
        exit = max(codes) + 1 if exit is None else int(exit)
        if exit in codes:
            raise ValueError(f"exit code {exit} collides with a stage code {codes}")
        self.stages = stages
        self.codes = codes
        self.exit = exit

    @property
    def entry(self) -> int:
        return self.codes[0]

    def next_code(self, index: int) -> int:
        """Status a system gets when it leaves stage number ``index``."""
        return self.codes[index + 1] if index + 1 < len(self.codes) else self.exit

    def __len__(self) -> int:
        return len(self.stages)

    def __iter__(self):
        return iter(self.stages)

    def __add__(self, other: Integrator | Fused) -> Fused:
        more = other.stages if isinstance(other, Fused) else [other]
        return Fused([*self.stages, *more])

    def __radd__(self, other: Any) -> Fused:
        if other == 0:  # sum([a, b, c])
            return self
        return NotImplemented

    def __or__(self, other: Any) -> Pipeline:
        return Pipeline.of(self) | other

    def __repr__(self) -> str:
        inner = ", ".join(f"{c}:{type(s).__name__}" for c, s in zip(self.codes, self.stages))
        return f"Fused([{inner}], entry={self.entry}, exit={self.exit})"

    def total_budget(self) -> int:
        """Upper bound on the steps any system can spend in this plan."""
        return sum(s.max_steps for s in self.stages)


def as_plan(
    stages: Integrator | Fused | Pipeline | Sequence[Integrator | Sequence[Integrator]],
) -> Fused | Pipeline:
    """Plans from config-friendly lists: ``[a, b]`` is ``a + b``; ``[[a, b], [c]]`` is
    ``(a + b) | c`` (one inner list per rank)."""
    _refuse_class(stages, "stages")
    if isinstance(stages, (Fused, Pipeline, Stage)):
        return stages if not isinstance(stages, Stage) else Fused([stages])
    if isinstance(stages, (str, bytes)) or not isinstance(stages, Iterable):
        raise TypeError(
            f"stages must be an Integrator (FIRE()), a Fused plan (a + b), a Pipeline "
            f"(a | b) or a list of integrators, got {type(stages).__name__}"
        )
    items = list(stages)
    for k, item in enumerate(items):
        for j, inner in enumerate(item if isinstance(item, (list, tuple)) else [item]):
            where = f"stages[{k}]" + (f"[{j}]" if isinstance(item, (list, tuple)) else "")
            _refuse_class(inner, where)
    if items and all(isinstance(p, (list, tuple, Fused)) for p in items):
        return Pipeline([as_fused(p) for p in items])
    return as_fused(items)


def _refuse_class(value: Any, where: str) -> None:
    """An integrator class where an instance belongs (``stages=FIRE``): the fix is to call it."""
    if isinstance(value, type) and _is_stage_class(value):
        name = value.__name__
        try:
            params = inspect.signature(value).parameters.values()
            required = [p.name for p in params if p.default is p.empty and p.kind <= p.KEYWORD_ONLY]
        except (TypeError, ValueError):  # no signature to read: suggest the plain call
            required = []
        call = f"{name}({', '.join(f'{p}=...' for p in required)})"
        raise TypeError(
            f"{where}: got the class {name}, not an integrator; create one: {call} "
            f"(its parameters go in the parentheses)"
        )


def as_fused(plan: Integrator | Fused | Sequence[Integrator]) -> Fused:
    """Normalise an integrator, a list of integrators or a fused plan to :class:`Fused`."""
    if isinstance(plan, Fused):
        return plan
    if isinstance(plan, Stage):
        return Fused([plan])
    if isinstance(plan, (list, tuple)) and all(isinstance(p, Stage) for p in plan):
        return Fused(plan)
    raise TypeError(
        f"stages must be an Integrator, a Fused plan (a + b) or a Pipeline (a | b), "
        f"got {type(plan).__name__}"
    )


class Pipeline:
    """One fused plan per rank and directed edges between ranks.

    ``x | y`` chains the last rank of ``x`` to the first of ``y``.  Explicit
    topologies (independent sub-pipelines, fan-out, fan-in) are built with
    ``Pipeline(stages={0: a, 1: b, 2: c}, edges=[(0, 1), (0, 2)])``.
    """

    def __init__(
        self,
        stages: Mapping[int, Integrator | Fused] | Sequence[Integrator | Fused],
        edges: Iterable[tuple[int, int]] | None = None,
    ) -> None:
        items = stages.items() if isinstance(stages, Mapping) else enumerate(stages)
        self.stages: dict[int, Fused] = {int(r): as_fused(p) for r, p in items}
        ranks = sorted(self.stages)
        if ranks != list(range(len(ranks))):
            raise ValueError(f"pipeline ranks must be 0..n-1, got {ranks}")
        if edges is None:
            edges = [(r, r + 1) for r in ranks[:-1]]
        self.edges: list[tuple[int, int]] = []
        for a, b in edges:
            a, b = int(a), int(b)
            if a not in self.stages or b not in self.stages:
                raise ValueError(f"pipeline edge ({a}, {b}) names a rank without a stage")
            if a == b:
                raise ValueError(f"pipeline edge ({a}, {b}) is a self-loop")
            if (a, b) in self.edges:
                raise ValueError(f"duplicate pipeline edge ({a}, {b})")
            self.edges.append((a, b))
        self._check_acyclic()
        self._check_band_routes()

    @classmethod
    def of(cls, plan: Integrator | Fused | Pipeline) -> Pipeline:
        return plan if isinstance(plan, Pipeline) else cls({0: as_fused(plan)})

    @property
    def num_ranks(self) -> int:
        return len(self.stages)

    def upstream(self, rank: int) -> list[int]:
        return [a for a, b in self.edges if b == rank]

    def downstream(self, rank: int) -> list[int]:
        return [b for a, b in self.edges if a == rank]

    def sources(self) -> list[int]:
        """Ranks that read from the sampler (no upstream)."""
        return [r for r in sorted(self.stages) if not self.upstream(r)]

    def sinks(self) -> list[int]:
        """Ranks whose finished systems go to the sinks (no downstream)."""
        return [r for r in sorted(self.stages) if not self.downstream(r)]

    def __or__(self, other: Any) -> Pipeline:
        right = Pipeline.of(other)
        offset = self.num_ranks
        stages = dict(self.stages)
        stages.update({r + offset: p for r, p in right.stages.items()})
        edges = list(self.edges) + [(a + offset, b + offset) for a, b in right.edges]
        for a in self.sinks():
            for b in right.sources():
                edges.append((a, b + offset))
        return Pipeline(stages, edges)

    def replicate(self, n: int) -> Pipeline:
        """``n`` independent copies of this pipeline (data-parallel replicas), ranks
        numbered replica by replica."""
        if int(n) < 1:
            raise ValueError(f"replicas must be >= 1, got {n}")
        p = self.num_ranks
        stages = {k * p + r: plan for k in range(int(n)) for r, plan in self.stages.items()}
        edges = [(k * p + a, k * p + b) for k in range(int(n)) for a, b in self.edges]
        return Pipeline(stages, edges)

    def optimizer_columns(self) -> list[int]:
        """Columns of optimizer stages in the pipeline-wide stage history."""
        cols, offset = [], 0
        for r in sorted(self.stages):
            plan = self.stages[r]
            cols += [offset + i for i, s in enumerate(plan.stages) if s.is_optimizer]
            offset += len(plan)
        return cols

    def __ror__(self, other: Any) -> Pipeline:
        return Pipeline.of(other) | self

    def _check_acyclic(self) -> None:
        indeg = {r: len(self.upstream(r)) for r in self.stages}
        queue = [r for r, d in indeg.items() if d == 0]
        seen = 0
        while queue:
            r = queue.pop()
            seen += 1
            for b in self.downstream(r):
                indeg[b] -= 1
                if indeg[b] == 0:
                    queue.append(b)
        if seen != len(self.stages):
            raise ValueError(f"pipeline edges {self.edges} contain a cycle")

    def has_band(self, rank: int) -> bool:
        """Whether ``rank`` or a rank after it relaxes nudged elastic bands (``band=``)."""
        mine = any(getattr(s, "band", None) is not None for s in self.stages[rank].stages)
        return mine or any(self.has_band(d) for d in self.downstream(rank))

    def _check_band_routes(self) -> None:
        """A rank that fans out sends each band, whole, to whichever branch has room: every
        branch must then run bands alike, or some bands would never meet a band stage."""
        for r in sorted(self.stages):
            downs = self.downstream(r)
            found = {d: self.has_band(d) for d in downs}
            if len(set(found.values())) > 1:
                yes = [d for d, b in found.items() if b]
                no = [d for d, b in found.items() if not b]
                raise ConfigError(
                    f"pipeline rank {r} fans out to ranks {downs}, of which {yes} run a band "
                    f"stage (band=NEB(...)) and {no} do not; systems go to whichever branch has "
                    f"room, so some bands would never run as bands: give every branch the "
                    f"same stages, or run the band stage after the branches join"
                )

    def __repr__(self) -> str:
        ranks = ", ".join(f"{r}: {p!r}" for r, p in sorted(self.stages.items()))
        return f"Pipeline({{{ranks}}}, edges={self.edges})"


def _is_stage_class(cls: type) -> bool:
    """Whether ``cls`` is a stage class (passed where an instance was meant)."""
    return all(callable(getattr(cls, m, None)) for m in ("pre_update", "post_update", "setup"))
