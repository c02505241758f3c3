"""``Simulator(cuda_graphs=True)``: the fused step captured once as a CUDA graph, replayed.

Why: on a GPU a cheap model's step is a few hundred small kernels launched one by one from Python;
replaying them as one graph removes the launch cost
(docs/design/16-gpu-residency-one-switch-what-still-syncs.md).  Between two bookkeeping points and
two neighbour-list rebuilds the batch keeps its shapes and a steady step reads nothing on the host,
so the step (integrators, the model's forward and backward, NaNGuard, the stage transitions) is the
same sequence of kernels every time.

How a replay stays the step it replaces:

* **State in place.**  Integrators replace the batch's tensors; the captured step ends
  by copying every replaced field back into the tensor it read, so each replay reads
  what the last one wrote.  Fields that changed get their version bumped before the
  capture and after each replay, so every memo keyed on a tensor's identity and
  version (status masks, the finish watch) is recomputed inside the graph and seen
  as changed outside it.  The accumulators of systems that left a stage since the
  last bookkeeping (``ctx.exited``, ``ctx.converged``) are static tensors too.
* **Neighbour list outside.**  A captured call keeps the list and measures its skin
  on the device (:meth:`~alchemi_lit.models.skin_watch.SkinWatch.measure_in_graph`);
  before each replay the previous replay's measure, copied to the host without
  waiting, says whether the list holds for one more call -- the one-call-late rule
  of the eager path.  When it does not, the step runs eagerly (it rebuilds) and the
  next one is captured again.
* **Eager where a graph cannot follow.**  Steps where a callback that is not
  ``graph_safe`` fires, the first steps after a bookkeeping, refills and rebuilds run
  eagerly.  A step that cannot be captured at all (a model reading the host, a shape
  that depends on values) falls back to eager for the rest of the run with one
  warning naming why.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
from loguru import logger

from ..core.errors import ConfigError, first_line
from .hooks import HookStageEnum, StepContext


class NotCapturable(RuntimeError):
    """The step changed the batch's set of fields or shapes: it is not steady yet."""


class CudaGraphBackend:
    """Capture and replay with ``torch.cuda.CUDAGraph`` on a side stream, each graph in
    its own memory pool (freed with it).  Python's cyclic garbage collector is held off
    while capturing: collecting an old graph then destroys it inside the capture, which
    CUDA refuses (and the capture is lost)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def capture(self, body: Callable[[], None]) -> Callable[[], None]:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.stream(stream):
                graph.capture_begin()
                try:
                    body()
                finally:
                    graph.capture_end()
        finally:
            if collecting:
                gc.enable()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return graph.replay


def cuda_backend(device: torch.device) -> CudaGraphBackend | None:
    """The graph backend of ``device``; None where there are no CUDA graphs."""
    return CudaGraphBackend(device) if device.type == "cuda" else None


#: what makes a device's backend (:func:`alchemi_lit.testing.emulated_cuda_graphs` swaps
#: it for one that runs the captured step on a CPU, to test everything around it)
backend_for: Callable[[torch.device], Any] = cuda_backend


class GraphedSteps:
    """Runs :meth:`FusedLoop.step <alchemi_lit.engine.step.FusedLoop.step>` eagerly or as
    the replay of a captured graph (see the module docstring).  ``backend``: what
    captures (:class:`CudaGraphBackend`; tests pass others)."""

    def __init__(self, loop: Any, backend: Any) -> None:
        self.loop, self.backend = loop, backend
        nl = getattr(loop.model, "neighbors", None)
        self.neighbors = nl if hasattr(nl, "ready_for_graph") else None
        self.disabled: str | None = None  # why graphs are off for the rest of the run
        self.replays = self.captures = 0  # counted for tests and benchmarks
        self._replay: Callable[[], None] | None = None
        self._signature: list[Any] = []
        self._written: list[torch.Tensor] = []  # what each replay writes (versions bumped)
        # the fields the eager step just before wrote (None: no such step since the last
        # capture): each capture follows one, which tells what a step writes (memos on it
        # must recompute inside the graph) and, after a rebuild, gives the skin a history
        self._last_written: set[str] | None = None
        unsafe = [cb for cb in loop.hooks.callbacks if not cb.graph_safe and _per_step(cb)]
        self._unsafe = [cb.every for cb in unsafe]
        every_step = sorted(type(cb).__name__ for cb in unsafe if cb.every == 1)
        if every_step:
            self._disable(
                f"callback(s) {', '.join(every_step)} run at every step and are not "
                f"graph_safe (set graph_safe = True on a callback that only does device "
                f"work and reads nothing on the host)"
            )

    def __call__(self, batch: Any, ctx: StepContext) -> None:
        """One step of ``batch``."""
        if self._replay is not None:
            if _same(self._signature_of(batch, ctx), self._signature) and self._list_holds():
                self._replay_step(ctx)
                return
            self._replay = None
        if self.disabled is None and self._last_written is not None and self._ready(batch, ctx):
            self._capture(batch, ctx)
        else:
            self._eager(batch, ctx)

    def release(self) -> None:
        """Drop the graph at the run's end: its memory pool goes with it at once, not
        when the garbage collector reaches the run (a later run could run out)."""
        self._replay = None
        self._signature = []

    # ------------------------------------------------------------------ steps
    def _eager(self, batch: Any, ctx: StepContext) -> None:
        before = _versions(batch)
        self.loop.step(batch, ctx)
        after = _versions(batch)
        same_fields = before.keys() == after.keys()
        self._last_written = _written(before, after) if same_fields else None

    def _replay_step(self, ctx: StepContext) -> None:
        self._replay()
        # the replay wrote these without Python knowing: memos keyed on them recompute
        torch.autograd.graph.increment_version(self._written)
        ctx.step += 1
        self.loop.num_forward_calls += 1
        if self.neighbors is not None:
            self.neighbors.skin_watch.publish_graph()
        self.replays += 1

    def _list_holds(self) -> bool:
        return self.neighbors is None or self.neighbors.skin_watch.keeps()

    def _signature_of(self, batch: Any, ctx: StepContext) -> list[Any]:
        """What a replay assumes unchanged since the capture, compared by identity: the
        batch, its tensors, the accumulators, the neighbour list and its skin state."""
        loop, nl = self.loop, self.neighbors
        held = loop.pending or loop.evict
        sig = [batch, batch.layout, ctx.exited, ctx.converged, held, self._unsafe_fire(ctx)]
        sig += list(batch.atom.values()) + list(batch.system.values())
        if nl is not None:
            watch = nl.skin_watch
            sig += [nl._i, nl._j, nl._shift, nl._ref_positions, watch._prev_u, watch._prev_limit]
        return sig

    # ------------------------------------------------------------------ capture
    def _ready(self, batch: Any, ctx: StepContext) -> bool:
        loop = self.loop
        if loop.pending or loop.evict or batch.num_systems == 0:
            return False
        if self._unsafe_fire(ctx):
            return False
        return self.neighbors is None or self.neighbors.ready_for_graph(batch)

    def _unsafe_fire(self, ctx: StepContext) -> bool:
        """Whether a callback that must run eagerly fires at this step."""
        return any(ctx.step % freq == 0 for freq in self._unsafe)

    def _capture(self, batch: Any, ctx: StepContext) -> None:
        loop, nl = self.loop, self.neighbors
        if ctx.exited is None:
            ctx.exited = torch.zeros(batch.num_systems, dtype=torch.bool, device=batch.device)
        if ctx.converged is None:
            ctx.converged = torch.zeros_like(ctx.exited)
        before = _fields(batch)
        accumulators = (ctx.exited, ctx.converged)
        expected = self._last_written or set()
        written = [before[k] for k in expected] + list(accumulators)
        # what the last eager step wrote changes every step: memos on it must recompute
        torch.autograd.graph.increment_version(written)
        counters = (ctx.step, loop.num_forward_calls)

        def body() -> None:
            """One step, its results copied into the tensors it read, and the batch and
            context left pointing at those (run once by a capture, which records its
            kernels; a test's backend runs it at every replay)."""
            versions = _versions(batch)
            start = (ctx.step, loop.num_forward_calls)
            if nl is not None:
                nl.in_graph = True
            try:
                loop.step(batch, ctx)
            finally:
                if nl is not None:
                    nl.in_graph = False
            after = _versions(batch)
            if after.keys() != versions.keys():
                raise NotCapturable("the step added or dropped fields")
            if _written(versions, after) - expected:
                raise NotCapturable("the step wrote a field the step before did not")
            pairs = [(before[k], _field(batch, k)) for k in before]
            pairs += list(zip(accumulators, (ctx.exited, ctx.converged)))
            pairs = [(old, new) for old, new in pairs if new is not old]
            inputs = {t.untyped_storage().data_ptr() for t in before.values()}
            for old, new in pairs:
                if new.shape != old.shape or new.dtype != old.dtype:
                    raise NotCapturable("the step changed a field's shape or dtype")
                if new.untyped_storage().data_ptr() in inputs:
                    raise NotCapturable("the step made a field of another field's memory")
            for old, new in pairs:
                old.copy_(new)
            _point_at(batch, before)
            ctx.exited, ctx.converged = accumulators
            ctx.step, loop.num_forward_calls = start  # (the replayer counts)

        try:
            replay = self.backend.capture(body)
        except Exception as exc:
            # nothing ran: the tensors read hold the state; what the capture derived and
            # kept (memos) holds nothing, and is recomputed at the next use
            _point_at(batch, before)
            ctx.exited, ctx.converged = accumulators
            ctx.step, loop.num_forward_calls = counters
            batch.forget_derived()
            loop.forget_masks()
            if nl is not None:
                nl.forget_derived()
            if not isinstance(exc, NotCapturable):
                self._disable(f"{type(exc).__name__}: {first_line(exc)}")
            self._eager(batch, ctx)
            return
        self._written, self._replay = written, replay
        self._signature = self._signature_of(batch, ctx)
        self.captures += 1
        self._last_written = None
        self._replay_step(ctx)  # (a capture records kernels without running them)

    def _disable(self, why: str) -> None:
        if self.disabled is None:
            self.disabled = why
            logger.warning(f"cuda_graphs: running every step eagerly: {why}")


def check_cuda_graphs(value: object, device: torch.device) -> bool:
    """``Simulator(cuda_graphs=...)``: a bool; True where graphs cannot run warns once."""
    if value not in (True, False):
        raise ConfigError(f"cuda_graphs must be true or false, got {value!r}")
    if value and backend_for(device) is None:
        logger.warning(
            f"cuda_graphs=True has no effect on {device.type} (CUDA graphs need "
            f"accelerator='cuda'); running eagerly"
        )
    return bool(value)


def step_function(loop: Any, simulator: Any) -> Callable[[Any, StepContext], None]:
    """What runs one step of ``loop``: its own ``step``, or with
    ``simulator.cuda_graphs`` on a CUDA device, a :class:`GraphedSteps`."""
    backend = backend_for(simulator.device) if getattr(simulator, "cuda_graphs", False) else None
    return loop.step if backend is None else GraphedSteps(loop, backend)


def _per_step(callback: Any) -> bool:
    """Whether ``callback`` subscribes to a stage inside the step (not only events)."""
    return bool(set(callback.hook_stages()) - {HookStageEnum.ON_CONVERGE})


def _fields(batch: Any) -> dict[str, torch.Tensor]:
    return {**batch.atom, **batch.system}


def _point_at(batch: Any, fields: dict[str, torch.Tensor]) -> None:
    """Make ``fields`` the batch's tensors again (without Batch's shape checks: they
    are the tensors it had)."""
    for name, tensor in fields.items():
        (batch.atom if name in batch.atom else batch.system)[name] = tensor


def _field(batch: Any, name: str) -> torch.Tensor:
    return batch.atom[name] if name in batch.atom else batch.system[name]


def _versions(batch: Any) -> dict[str, tuple[torch.Tensor, int]]:
    """Each field and its version: what tells a replaced or written field."""
    return {k: (v, v._version) for k, v in _fields(batch).items()}


def _written(before: dict[str, tuple], after: dict[str, tuple]) -> set[str]:
    """The fields replaced or written between two :func:`_versions`."""
    return {k for k, (t, v) in after.items() if t is not before[k][0] or v != before[k][1]}


def _same(a: list[Any], b: list[Any]) -> bool:
    """Equal signatures: tensors and objects by identity, flags by value."""
    return len(a) == len(b) and all(x is y or (type(x) is bool and x == y) for x, y in zip(a, b))


__all__ = [
    "CudaGraphBackend", "GraphedSteps", "NotCapturable", "backend_for",
    "check_cuda_graphs", "cuda_backend", "step_function",
]  # fmt: skip
