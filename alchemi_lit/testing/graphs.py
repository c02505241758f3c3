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
steps -- and leaves version counters as they were, as a graph's kernels do.  What is
left to the ``cuda`` tests: the GPU itself (kernels, streams, memory pools).
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
        self.ops: list[_Op] = []
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

        self.ops.append(_Op(func, tree_map(hold, list(args)), tree_map(hold, kwargs or {}), out))
        self._made.update(id(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


class _Op:
    """One recorded operation, laid out for a cheap replay: the places of its held
    inputs are found once (a replay then fills them in place and empties them again,
    so nothing holds the inputs between replays), and what kind of operation it is
    (writes its inputs, returns a view, makes new tensors) is read from its schema once
    -- a replay is thousands of operations per step, and walking each one's arguments
    as a tree every time made the emulation slower than the step it emulates."""

    __slots__ = ("args", "func", "holes", "kind", "kwargs", "outs")

    def __init__(self, func: Any, args: list, kwargs: dict, out: Any) -> None:
        self.func, self.args, self.kwargs = func, args, kwargs
        self.holes: list[tuple[Any, Any, _Held]] = []
        self._find_holes(args)
        self._find_holes(kwargs)
        schema = func._schema
        aliases = any(r.alias_info is not None for r in schema.returns)
        self.kind = "writes" if schema.is_mutable else "view" if aliases else "makes"
        self.outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def _find_holes(self, container: Any) -> None:
        keys = container.keys() if isinstance(container, dict) else range(len(container))
        for key in list(keys):
            item = container[key]
            if isinstance(item, _Held):
                self.holes.append((container, key, item))
            elif isinstance(item, tuple) and any(isinstance(x, _Held) for x in tree_leaves(item)):
                container[key] = item = list(item)  # (to fill in place; aten takes either)
                self._find_holes(item)
            elif isinstance(item, (list, dict)):
                self._find_holes(item)

    def replay(self) -> None:
        """Run the operation again, writing what it makes into the recorded outputs;
        views and aliases share their input's memory and need nothing."""
        if self.kind == "view":
            return
        holes = self.holes
        try:
            for container, key, held in holes:
                container[key] = held.get()
            new = self.func(*self.args, **self.kwargs)
        finally:
            for container, key, held in holes:
                container[key] = held
        if self.kind == "writes":
            return
        news = new if isinstance(new, (tuple, list)) else (new,)
        for old, fresh in zip(self.outs, news):
            if isinstance(old, torch.Tensor):
                old.copy_(fresh)


def _replayer(ops: list[_Op]) -> Callable[[], None]:
    """A replay of recorded operations: each runs again on the tensors it was recorded
    with, writing its result into the tensor recorded as its output -- a CUDA graph's
    replay: fixed memory, Python's decisions and numbers as they were at the capture --
    and every tensor's version counter is left as it was: a graph writes memory behind
    Python's back, so only the bumps the replayer makes itself tell version-keyed memos
    that a replay changed a tensor (running the operations bumped them as a side effect,
    which hid a missing bump).  The outputs are the same at every replay; the held
    inputs are resolved at each (they may have gone)."""
    outs = [t for op in ops for t in op.outs if isinstance(t, torch.Tensor)]
    held = [h for op in ops for *_, h in op.holes]

    def replay() -> None:
        touched = outs + [t for h in held if (t := h.ref()) is not None]
        versions = [t._version for t in touched]
        for op in ops:
            op.replay()
        _set_versions(touched, versions)

    return replay


def _set_versions(tensors: list[torch.Tensor], versions: list[int]) -> None:
    """Put version counters back (torch's own test utility; one call for all since
    torch 2.7, one per tensor before)."""
    set_version = torch._C._autograd._unsafe_set_version_counter
    try:
        set_version(tuple(tensors), tuple(versions))
    except TypeError:
        for tensor, version in zip(tensors, versions):
            set_version(tensor, version)


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
        again = _replayer(recorder.ops) if self.replay == "ops" else body

        def replay() -> None:
            if ran[0]:
                ran[0] = False
                return
            again()

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
