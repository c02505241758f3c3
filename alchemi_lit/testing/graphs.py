"""``emulated_cuda_graphs()``: ``Simulator(cuda_graphs=True)`` on a CPU, for tests.

A CUDA graph cannot be captured without a GPU, but everything around the capture can
be checked on CI: which steps replay and which run eagerly, the copy of a step's
results into the tensors it read, the accumulators, the neighbour list's in-graph skin
measure and its one-replay-late decision, the fallback when a step cannot be
captured.  Under this switch a capture runs the step once, refusing every operation a
real capture refuses (one that hands a value to the host: the aten operations
:func:`~.accelerator.waits_on_device` names) and recording every operation with its
tensors; each replay then runs the recorded operations on the recorded tensors, as a
graph does -- so a number or decision the step took from Python at the capture stays
as it was, and a step that depends on one that changes shows as a difference from eager
steps.  What is left to the ``cuda`` tests: the GPU itself (kernels, streams, memory
pools).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from ..engine import cuda_graph
from .accelerator import waits_on_device

#: operations that make a tensor from host values: on a GPU a copy from pageable host
#: memory, which a capture refuses
_FROM_HOST = frozenset({"lift_fresh", "lift_fresh_copy"})


class _RefuseHostReads(TorchDispatchMode):
    """Raises where a stream capture would: an operation that needs a value on the host."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        name = func._schema.name.split("::")[-1]
        if name in _FROM_HOST:
            raise RuntimeError(
                f"Cannot copy between CPU and CUDA tensors during CUDA graph capture (aten::"
                f"{name}: a tensor made from Python values; emulated capture)"
            )
        if waits_on_device(name, args, kwargs):
            raise RuntimeError(
                f"operation not permitted when stream is capturing (aten::{name} reads a "
                f"value on the host; emulated capture)"
            )
        return func(*args, **(kwargs or {}))


class _Held:
    """A tensor the capture read but did not make, held weakly: a real graph keeps its
    address, not the tensor, so a replay after Python dropped it reads memory the
    allocator may have given to another tensor -- here, an error naming the operation."""

    __slots__ = ("op", "ref")

    def __init__(self, tensor: torch.Tensor, op: str) -> None:
        self.ref, self.op = weakref.ref(tensor), op

    def get(self) -> torch.Tensor:
        tensor = self.ref()
        if tensor is None:
            raise RuntimeError(
                f"a replayed graph reads a tensor freed since its capture (an input of "
                f"aten::{self.op}): a real graph would read reused memory; keep the tensor "
                f"while the graph lives, or make its replacement end the graph (emulated)"
            )
        return tensor


class _Recorder(_RefuseHostReads):
    """Also records every operation with its tensors: what a CUDA graph keeps -- the
    tensors its operations made, and only the addresses of those it read (views are
    held: they keep their base's memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, tuple, dict, Any]] = []
        self._made: set[int] = set()  # ids of the tensors the recorded operations made

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        name = func._schema.name.split("::")[-1]

        def hold(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and id(x) not in self._made and x._base is None:
                return _Held(x, name)
            return x

        self.ops.append((func, tree_map(hold, args), tree_map(hold, kwargs or {}), out))
        self._made.update(id(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def _resolve(x: Any) -> Any:
    return x.get() if isinstance(x, _Held) else x


def _replay_ops(ops: list[tuple[Any, tuple, dict, Any]]) -> None:
    """Run recorded operations again on the tensors they were recorded with, writing
    each result into the tensor recorded as its output -- a CUDA graph's replay: fixed
    memory, Python's decisions and numbers as they were at the capture.  Operations that
    write their inputs run as they are; views and aliases share their input's memory
    and need nothing."""
    for func, held_args, held_kwargs, out in ops:
        args, kwargs = tree_map(_resolve, held_args), tree_map(_resolve, held_kwargs)
        schema = func._schema
        if schema.is_mutable:
            func(*args, **kwargs)
            continue
        if any(r.alias_info is not None for r in schema.returns):
            continue
        new = func(*args, **kwargs)
        olds = out if isinstance(out, (tuple, list)) else (out,)
        news = new if isinstance(new, (tuple, list)) else (new,)
        for old, fresh in zip(olds, news):
            if isinstance(old, torch.Tensor):
                old.copy_(fresh)


class EmulatedGraphBackend:
    """Captures by running the step once (refusing host reads); replays by running it
    again (``replay="python"``) or, ``replay="ops"``, by running the operations the
    capture recorded on the tensors it recorded -- what a real graph does, so state
    that a graph bakes in at capture (a Python number or decision the step took from
    state that changes) shows as a difference from eager steps.  ``captures`` counts
    the captures made."""

    def __init__(self, replay: str = "python") -> None:
        if replay not in ("python", "ops"):
            raise ValueError(f"replay must be 'python' or 'ops', got {replay!r}")
        self.captures, self.replay = 0, replay

    def capture(self, body: Callable[[], None]) -> Callable[[], None]:
        recorder = _Recorder()
        with recorder:
            body()
        self.captures += 1
        ran = [True]  # the capture ran the step its first replay stands for
        ops = recorder.ops if self.replay == "ops" else None

        def replay() -> None:
            if ran[0]:
                ran[0] = False
                return
            if ops is None:
                body()
            else:
                _replay_ops(ops)

        return replay


@contextmanager
def emulated_cuda_graphs(replay: str = "ops") -> Iterator[list[EmulatedGraphBackend]]:
    """Within: ``cuda_graphs=True`` works on a CPU through :class:`EmulatedGraphBackend`
    (use with :func:`~.accelerator.accelerator_path`, whose branches a GPU takes);
    ``replay``: ``"python"`` reruns the step at each replay, ``"ops"`` replays the
    captured operations as a graph does.  Yields the list of backends made, one per run
    loop."""
    made: list[EmulatedGraphBackend] = []

    def make(device: torch.device) -> EmulatedGraphBackend:
        made.append(EmulatedGraphBackend(replay))
        return made[-1]

    saved = cuda_graph.backend_for
    cuda_graph.backend_for = make
    try:
        yield made
    finally:
        cuda_graph.backend_for = saved
