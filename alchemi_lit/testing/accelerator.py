"""The accelerator's code path on a CPU, and what a step costs there.

Why: CI has no GPU, and on a CPU most of the framework takes shortcuts that reading a
tensor for free allows -- skip an empty masked update, per-system arithmetic in NumPy,
the numba kernels, vesin's neighbour lists.  None of them runs on a GPU.  Under
:func:`accelerator_path` CPU tensors take every branch an accelerator takes, so the test
suite checks the GPU's code on CI.  :class:`StepProbe` then counts, per step, the aten
operations the step launches and the values it reads on the host: on a GPU each read is
a sync that stalls the launch queue, and operations whose number grows with the number
of systems are Python loops over systems.  A real GPU counts its syncs with
``torch.cuda.set_sync_debug_mode``; this counts the same reads where no GPU is.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import kernels
from ..core import tensor_ops
from ..engine.hooks import Callback, StepContext


@contextlib.contextmanager
def accelerator_path() -> Iterator[None]:
    """Run CPU tensors through every branch an accelerator takes: reading a value on
    the host is not free (:data:`~alchemi_lit.core.tensor_ops.CPU_READS_FREE`), so masked
    work is branch-free, per-system formulas run in torch, the numba kernels are off and
    neighbour lists are built by the device builder.  Restored on exit."""
    saved = tensor_ops.CPU_READS_FREE, kernels.ENABLED
    tensor_ops.CPU_READS_FREE, kernels.ENABLED = False, False
    try:
        yield
    finally:
        tensor_ops.CPU_READS_FREE, kernels.ENABLED = saved


#: aten operations that wait for the device on a GPU (names without "aten::"): a value
#: or an output size goes to the host, or LAPACK's error code is checked there
SYNCING = frozenset({
    "_local_scalar_dense", "nonzero", "masked_select", "unique_dim", "_unique2",
    "unique_consecutive", "bincount", "histc", "_assert_async", "_linalg_check_errors",
    "linalg_solve", "linalg_inv", "_linalg_svd", "_linalg_eigh", "linalg_eigh",
})  # fmt: skip
#: tensor methods that hand values to Python without an aten operation
_PY_READS = ("tolist", "numpy", "__array__")


def waits_on_device(name: str, args: tuple, kwargs: dict | None = None) -> bool:
    """Whether aten operation ``name`` (its schema name, no overload) with these
    arguments waits for the device on a GPU: one of :data:`SYNCING`, a
    ``repeat_interleave`` not told its output size, or an index by a boolean mask."""
    if name in SYNCING:
        return True
    if name == "repeat_interleave":
        return (kwargs or {}).get("output_size") is None
    if name in ("index", "index_put", "index_put_", "_index_put_impl_") and len(args) > 1:
        return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in args[1])
    return False


class _Counting(TorchDispatchMode):
    def __init__(self, probe: StepProbe) -> None:
        super().__init__()
        self.probe = probe

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        probe = self.probe
        if probe.active:
            probe.ops += 1
            name = func._schema.name.split("::")[-1]
            if waits_on_device(name, args, kwargs) and not _host_copy(args):
                probe.note_read(f"aten::{name}")
        return func(*args, **(kwargs or {}))


class StepProbe(Callback):
    """Counts, for every step of a run, the aten operations launched and the values
    read on the host (a GPU's syncs) -- from the step's start to its end, the model's
    forward, neighbour lists and stage transitions included.  Use as a context manager
    around the run and as one of its callbacks::

        probe = StepProbe()
        with accelerator_path(), probe:
            Simulator(model=..., stages=..., callbacks=[probe]).run(systems)
        probe.reads_per_step, probe.ops_per_step, probe.where

    Reads of host copies (tensors marked ``host_buffer``, which a device filled
    without blocking) do not count."""

    def __init__(self, keep_where: int = 20) -> None:
        super().__init__(every=1)
        self.active = False
        self.ops = 0
        self.reads = 0
        self.ops_per_step: list[int] = []
        self.reads_per_step: list[int] = []
        self.where: list[str] = []  # the first ``keep_where`` reads' code locations
        self.keep_where = keep_where
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> StepProbe:
        self._stack.enter_context(_Counting(self))
        for name in _PY_READS:
            original = getattr(torch.Tensor, name)
            self._stack.enter_context(_patched(name, self._python_read(name, original)))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def _python_read(self, name: str, original: Any) -> Any:
        probe = self

        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if probe.active and not getattr(tensor, "host_buffer", False):
                probe.note_read(f"Tensor.{name}")
            return original(tensor, *args, **kwargs)

        return read

    def note_read(self, what: str) -> None:
        self.reads += 1
        if len(self.where) < self.keep_where:
            frames = [f for f in traceback.extract_stack(sys._getframe(2)) if
                      "alchemi_lit" in f.filename and "testing" not in f.filename]  # fmt: skip
            spot = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
            self.where.append(f"{what} at {spot}")

    # ----------------------------------------------------------------- hooks
    def before_step(self, ctx: StepContext) -> None:
        self.ops = self.reads = 0
        self.active = True

    def after_step(self, ctx: StepContext) -> None:
        self.active = False
        self.ops_per_step.append(self.ops)
        self.reads_per_step.append(self.reads)

    def on_run_end(self, ctx: StepContext) -> None:
        self.active = False

    def share_without_reads(self) -> float:
        """The share of steps that read nothing on the host."""
        steps = self.reads_per_step
        return sum(1 for r in steps if r == 0) / max(len(steps), 1)


def _host_copy(args: tuple) -> bool:
    return any(getattr(a, "host_buffer", False) for a in args if isinstance(a, torch.Tensor))


@contextlib.contextmanager
def _patched(name: str, replacement: Any) -> Iterator[None]:
    original = getattr(torch.Tensor, name)
    setattr(torch.Tensor, name, replacement)
    try:
        yield
    finally:
        setattr(torch.Tensor, name, original)


__all__ = ["SYNCING", "StepProbe", "accelerator_path", "waits_on_device"]
