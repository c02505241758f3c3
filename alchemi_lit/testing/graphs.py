"""``emulated_cuda_graphs()``: ``Simulator(cuda_graphs=True)`` on a CPU, for tests.

A CUDA graph cannot be captured without a GPU, but everything around the capture can
be checked on CI: which steps replay and which run eagerly, the copy of a step's
results into the tensors it read, the accumulators, the neighbour list's in-graph skin
measure and its one-replay-late decision, the fallback when a step cannot be
captured.  Under this switch a capture runs the step once and refuses every
operation a real capture refuses (one that hands a value to the host: the aten
operations :func:`~.accelerator.waits_on_device` names), and each replay runs the
captured step again.  What it cannot check -- state a real graph bakes in at capture
-- the ``cuda`` tests check on a GPU (replay == eager, step for step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


class EmulatedGraphBackend:
    """Captures by running the step once (refusing host reads); replays by running it
    again.  ``captures`` counts the captures made."""

    def __init__(self) -> None:
        self.captures = 0

    def capture(self, body: Callable[[], None]) -> Callable[[], None]:
        with _RefuseHostReads():
            body()
        self.captures += 1
        ran = [True]  # the capture ran the step its first replay stands for

        def replay() -> None:
            if ran[0]:
                ran[0] = False
                return
            body()

        return replay


@contextmanager
def emulated_cuda_graphs() -> Iterator[list[EmulatedGraphBackend]]:
    """Within: ``cuda_graphs=True`` works on a CPU through :class:`EmulatedGraphBackend`
    (use with :func:`~.accelerator.accelerator_path`, whose branches a GPU takes).
    Yields the list of backends made, one per run loop."""
    made: list[EmulatedGraphBackend] = []

    def make(device: torch.device) -> EmulatedGraphBackend:
        made.append(EmulatedGraphBackend())
        return made[-1]

    saved = cuda_graph.backend_for
    cuda_graph.backend_for = make
    try:
        yield made
    finally:
        cuda_graph.backend_for = saved
