"""Model base class: energy in, forces and stress out.

A model maps a :class:`~alchemi_lit.core.state.Batch` to per-system energies.  Forces and
stress follow from the gradient of the energy with respect to the *edge vectors*
``vec_ij = r_j - r_i + shift`` (the "edge-gradient" route used by most MLIPs):

* ``F_i = sum_j dE/dvec_ij - sum_k dE/dvec_ki``
* ``stress = (1/V) sum_edges vec ⊗ dE/dvec``  (ASE's sign convention, ``(1/V) dE/dε``)

so one backward pass (or one analytic expression) gives both, with no strain tensor
threaded through the cell.  Subclasses implement one of

* :meth:`Model.energy` -- energies from edges, differentiated by autograd; or
* :meth:`Model.energy_and_edge_gradient` -- energies and ``dE/dvec`` analytically
  (pair potentials: no autograd graph, much faster).

Models whose energy does not depend on positions only through edges override
:meth:`Model.forward` and return the same dictionary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..core.errors import ModelError
from ..core.state import Batch
from .neighbors import Edges, NeighborList


class Model(torch.nn.Module):
    """Base of all interatomic models; see module docstring.

    Calling ``model(batch)`` returns ``{"energy": [B], "forces": [N, 3], "stress": [B, 3, 3]}``.
    ``stress`` is zero for systems without a 3-D cell.  Its sign is ASE's, which the cell
    filters of the optimizers rely on: ``stress = (1/V) dE/d(strain)``, positive under
    tension (a stretched crystal), negative under compression; pressure is
    ``-trace(stress) / 3``.  A model overriding :meth:`forward` must keep it
    (``tests/models/test_stress.py`` checks the built-in models against ASE and the strain
    derivative; the plugins check theirs against their own ASE calculators).
    """

    #: Elements (atomic numbers) the model can evaluate; None means any.
    supported_elements: frozenset[int] | None = None
    #: A caveat the run summary repeats (e.g. a slow path); None for none.
    summary_note: str | None = None
    #: On a CPU, the batch size (atoms) past which a forward gains no throughput while its
    #: memory keeps growing (an MLIP's per-edge features: MBs per atom); the workflows'
    #: single points and relaxations batch up to it by default there.  None: no such
    #: size (cheap models, whose memory per atom is small), one batch of everything.
    cpu_batch_atoms: int | None = None

    def __init__(self, cutoff: float, skin: float = 1.0, compute_stress: bool = True) -> None:
        super().__init__()
        overrides = {
            name
            for name in ("energy", "energy_and_edge_gradient", "forward")
            if getattr(type(self), name) is not getattr(Model, name)
        }
        if not overrides:
            raise TypeError(
                f"{type(self).__name__} must implement energy(), energy_and_edge_gradient() "
                f"or forward()"
            )
        self.cutoff = float(cutoff)
        self.compute_stress = compute_stress
        self.neighbors = NeighborList(self.cutoff, list_skin(self.cutoff, skin))
        self._checked_layout: object | None = None
        self._edge_fn: Callable[..., Any] | None = None
        self._in_compiled = False

    def compile(self, **options: Any) -> bool:  # type: ignore[override]
        """Compile the edge computation with ``torch.compile`` (dynamic shapes: the edge
        count changes at every neighbour-list rebuild).  The first evaluation after this
        call tries it; if the compiler fails there, a warning is logged and the model
        stays eager.  Returns True once compilation is set up."""
        from ..core.compiling import compile_or_eager

        def stay_eager() -> None:
            self._edge_fn = None

        self._edge_fn = compile_or_eager(
            self.compile_target(),
            type(self).__name__,
            on_fallback=stay_eager,
            **{"dynamic": True, **options},
        )
        return True

    def compile_target(self) -> Callable[..., Any]:
        """The function :meth:`compile` compiles; called through ``self._edge_fn``."""
        return self.energy_and_edge_gradient

    # ------------------------------------------------------------ validation
    def check_batch(self, batch: Batch) -> None:
        """Raise :class:`ModelError` naming every unsupported element and the systems
        holding it (:func:`unsupported_elements`)."""
        if self.supported_elements is None:
            return
        allowed = torch.zeros(max(119, int(batch.atomic_numbers.max()) + 1), dtype=torch.bool)
        allowed[list(self.supported_elements)] = True
        bad = ~allowed.to(batch.device)[batch.atomic_numbers]
        if bool(bad.any()):
            atoms = bad.nonzero().flatten()
            ids = batch.system_id.index_select(0, batch.system_idx.index_select(0, atoms))
            found: dict[int, list[int]] = {}
            for z, sid in zip(batch.atomic_numbers[atoms].tolist(), ids.tolist()):
                if sid not in found.setdefault(z, []):
                    found[z].append(sid)
            raise ModelError(unsupported_elements(self, found))

    # ------------------------------------------------------------ evaluation
    def energy(self, batch: Batch, edges: Edges) -> torch.Tensor:
        """Per-system energy ``[B]`` from edges (differentiable w.r.t. ``edges.vec``)."""
        return self.energy_and_edge_gradient(batch, edges)[0]

    def energy_and_edge_gradient(
        self, batch: Batch, edges: Edges
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-system energy ``[B]`` and ``dE/dvec`` ``[P, 3]``; autograd by default."""
        if self._edge_fn is not None and not self._in_compiled:
            self._in_compiled = True
            try:
                return self._edge_fn(batch, edges)
            finally:
                self._in_compiled = False
        with torch.enable_grad():
            vec = edges.vec.detach().requires_grad_(True)
            energy = self.energy(batch, Edges(edges.i, edges.j, vec, edges.system, edges.cutoff))
            (grad,) = torch.autograd.grad(energy.sum(), vec, allow_unused=True)
        if grad is None:
            grad = torch.zeros_like(vec)
        return energy.detach(), grad

    def forward(
        self,
        batch: Batch,
        compute_stress: bool | None = None,
        neighbors: NeighborList | None = None,
    ) -> dict[str, torch.Tensor]:
        """Energy ``[B]``, forces ``[N, 3]`` and (if asked) stress ``[B, 3, 3]``.

        ``neighbors`` replaces the model's cached list for this call (used for one-off
        evaluations that must not disturb the step loop's cache).
        """
        if batch.layout is not self._checked_layout:
            self.check_batch(batch)
            self._checked_layout = batch.layout
        edges = (neighbors or self.neighbors)(batch)
        energy, grad = self.energy_and_edge_gradient(batch, edges)
        forces = edges.forces(grad, batch.num_atoms)
        out = {"energy": energy, "forces": forces}
        if self.compute_stress if compute_stress is None else compute_stress:
            out["stress"] = virial_stress(batch, edges, grad)
        return out

    def stress(self, batch: Batch) -> torch.Tensor:
        """Stress of ``batch`` in a one-off evaluation, with a skinless list of its own
        (:func:`list_skin`): the model's cached list is left alone.  The step loop does
        not call it (its forwards compute the stress where a stage or
        ``Simulator(stress=True)`` asks; graduates otherwise carry NaN stress); a model
        overriding :meth:`forward` overrides this too (the ASE-calculator model, the
        TorchSim plugin)."""
        edges = NeighborList(self.cutoff, list_skin(self.cutoff, 0.0))(batch)
        _, grad = self.energy_and_edge_gradient(batch, edges)  # eager: no recompilation
        return virial_stress(batch, edges, grad)


#: elements, and systems per element, an error names at most (then counts the rest)
SHOWN_ELEMENTS, SHOWN_SYSTEMS = 8, 6


def unsupported_elements(model: Any, found: dict[int, list[int]], noun: str = "system") -> str:
    """The message for elements a model lacks: every element (``found``: atomic number ->
    the ids of the systems, or ``noun``s, holding it) with its holders, capped with the
    counts, so one try names them all -- a screen of hundreds of structures otherwise
    learnt one missing element per run."""
    from ase.data import chemical_symbols

    def systems(ids: list[int]) -> str:
        shown = ", ".join(str(i) for i in ids[:SHOWN_SYSTEMS])
        more = f" and {len(ids) - SHOWN_SYSTEMS} more" if len(ids) > SHOWN_SYSTEMS else ""
        return f"{noun}{'s' if len(ids) > 1 else ''} {shown}{more}"

    zs = sorted(found)
    parts = [f"{chemical_symbols[z]} (Z={z}) in {systems(found[z])}" for z in zs[:SHOWN_ELEMENTS]]
    if len(zs) > SHOWN_ELEMENTS:
        parts.append(f"{len(zs) - SHOWN_ELEMENTS} more elements")
    n = len({i for ids in found.values() for i in ids})
    supported = ", ".join(chemical_symbols[e] for e in sorted(model.supported_elements))
    total = f" ({n} {noun}s in all)" if len(zs) > 1 else ""
    those = "that structure" if n == 1 else "those structures"
    return (
        f"{type(model).__name__} cannot evaluate element{'s' if len(zs) > 1 else ''} "
        f"{'; '.join(parts)}{total}; supported elements: {supported}. Remove {those} or "
        f"choose a model that covers {'it' if n == 1 else 'them'}."
    )


def list_skin(cutoff: float, skin: float) -> float:
    """The skin a model's list gets: ``skin``, or with none the least that keeps a pair
    at exactly the cutoff.  A list holds pairs strictly within its radius (as ASE's
    ``neighbor_list`` and vesin) while a pair potential counts ``r <= cutoff`` (as ASE's
    calculators: a truncated potential's force does not vanish there), so without a
    skin a crystal whose neighbour shell sits at exactly the cutoff would lose it."""
    return skin if skin != 0 else math.nextafter(cutoff, math.inf) - cutoff


#: cells of at most this volume (Å^3) have no stress: molecules, or no cell at all
_MIN_VOLUME = 1e-12


def virial_stress(batch: Batch, edges: Edges, grad: torch.Tensor) -> torch.Tensor:
    """``(1/V) sum_edges vec ⊗ dE/dvec`` per system; zero where the cell has no volume."""
    # row by row: three [P, 3] products are cheaper on CPU than one [P, 3, 3] outer
    # product (docs/design/05-edge-reductions-segment-sums-and-csr-products.md)
    rows = [edges.system_sum(edges.vec[:, a : a + 1] * grad, batch.num_systems) for a in range(3)]
    virial = torch.stack(rows, 1).reshape(-1, 9)
    volume = batch.volume
    inv_v = torch.where(
        volume > _MIN_VOLUME, 1.0 / volume.clamp_min(_MIN_VOLUME), torch.zeros_like(volume)
    )
    return (virial * inv_v[:, None]).reshape(-1, 3, 3)


def per_system_sum(values: torch.Tensor, system: torch.Tensor, num_systems: int) -> torch.Tensor:
    """Sum per-edge or per-atom ``values`` into ``[num_systems]`` bins."""
    out = torch.zeros(num_systems, dtype=values.dtype, device=values.device)
    return out.index_add_(0, system, values)


def elements(symbols_or_numbers: Iterable[str | int]) -> frozenset[int]:
    """Atomic numbers from symbols or numbers."""
    from ase.data import atomic_numbers

    return frozenset(
        atomic_numbers[s] if isinstance(s, str) else int(s) for s in symbols_or_numbers
    )


def cpu_batch_atoms(model: Any) -> int | None:
    """``model.cpu_batch_atoms``, checked: None or a positive int (a plugin's mistake is
    named, not turned into a batch of 0 or of everything)."""
    hint = getattr(model, "cpu_batch_atoms", None)
    if hint is None:
        return None
    if isinstance(hint, bool) or not isinstance(hint, int) or hint < 1:
        raise TypeError(
            f"{type(model).__name__}.cpu_batch_atoms must be None or a positive int (atoms "
            f"per batch on a CPU), got {hint!r}"
        )
    return hint


#: a batch this many times a model's ``cpu_batch_atoms`` gets :func:`cpu_batch_advice`
BIG_CPU_BATCH = 8


def cpu_batch_advice(model: Model, num_atoms: int, device: torch.device) -> str | None:
    """A warning for one batch of many times the atoms past which ``model``'s CPU
    forward gets no faster (``Model.cpu_batch_atoms``): it only costs memory; names the
    fix.  None where there is nothing to say."""
    hint = cpu_batch_atoms(model)
    if hint is None or torch.device(device).type != "cpu" or num_atoms <= BIG_CPU_BATCH * hint:
        return None
    return (
        f"{num_atoms} atoms in one batch on the CPU: {type(model).__name__}'s forward gets "
        f"no faster past ~{hint} atoms per batch and its memory grows with every atom; "
        f"pass SizeAwareSampler(structures, max_atoms={hint}) to run() for inflight "
        f"batches of that size (the same results)"
    )
