"""Per-step updates compiled for CPU by numba: one native call per step instead of a
few dozen torch operations.

Why: with a cheap model (Lennard-Jones) the framework's part of a CPU step is dominated by how many
*kinds* of operations it runs, not by arithmetic.  Right after the model's forward each kind runs
cold, a few times slower than the same operation back to back, and FIRE's update alone touched ~30
of them.  The same arithmetic as one compiled loop over the atoms pays that once and reads each
array once (figures in docs/design/08-compiled-cpu-kernels-for-the-per-step.md, and BENCHMARKS.md).

The kernels are a CPU fast path, not a second physics: :mod:`.backend` registers them
as implementations of primitives (:mod:`alchemi_lit.core.backends`) whose torch code is the
reference -- the integrators' operations (:mod:`alchemi_lit.integrators.ops`), the
keyed noise, the force criterion -- and which runs wherever a kernel does not
(accelerators, autograd, bfloat16, inside ``torch.compile``, and any CPU run without
numba or with ``ALCHEMI_LIT_CPU_KERNELS=0``); the tests hold both to the same results
within rounding.  No integrator imports this package.  Per-system decision logic is
written once: a kernel calls the same ``xp`` function
(:mod:`alchemi_lit.integrators.formulas`) that NumPy and torch run, on one system's
numbers (:mod:`~alchemi_lit.kernels.scalar_xp`).  The fused loop's bookkeeping and
NaNGuard's check (layers above) call their kernels directly.
Kernels are compiled on first use and cached on disk by numba, so a process pays the
compilation once per installation and afterwards only numba's import and start-up, at the
first kernel call (numba is not imported before).  The cache folder is keyed on every
source the kernels compile (:mod:`.cache`), not only the file of each kernel, so no
stale machine code survives an edit of the formulas.
"""

from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import torch
from loguru import logger

from ..core.tensor_ops import numpy_viewable

if TYPE_CHECKING:
    from ..core.state import Batch

#: set ``ALCHEMI_LIT_CPU_KERNELS=0`` to run every integrator's torch path on CPU
ENV_SWITCH = "ALCHEMI_LIT_CPU_KERNELS"
ENABLED = os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


#: what the kernels compute with (float16 has no arithmetic in numba: torch path)
_KERNEL_DTYPES = frozenset({torch.float64, torch.float32, torch.int64, torch.int32, torch.bool})

# A kernel runs on one core; torch spreads an operation over its threads in chunks of
# 32 768 elements, so past ~3 chunks with more than two threads torch is faster
# (docs/design/08-compiled-cpu-kernels-for-the-per-step.md).  The kernels are used whatever the size
# nonetheless: a choice by the batch's size would give a system the kernel's rounding in
# one batch and torch's in a larger one -- its bits would follow its batch mates (#41).
# A run without a budget stays under that size on a CPU (8 192 atoms).


def usable(*tensors: torch.Tensor) -> bool:
    """Whether a compiled kernel may take these tensors: kernels enabled, numba
    importable, every tensor a CPU tensor NumPy can view (no autograd graph) of a dtype
    the kernels compute with, and not inside ``torch.compile`` (whose graph fuses the
    torch path itself).  Never by size (the note above the function)."""
    if not ENABLED or torch.compiler.is_compiling() or not _numba_available():
        return False
    return all(numpy_viewable(t) and t.dtype in _KERNEL_DTYPES for t in tensors)


@functools.cache
def load(name: str) -> ModuleType:
    """The kernel module ``alchemi_lit.kernels.<name>`` (importing it imports numba);
    call only after :func:`usable` said yes."""
    return importlib.import_module(f"{__name__}.{name}")


def per_system(batch: Batch, value: float | torch.Tensor) -> np.ndarray:
    """A parameter that is a number or a ``[B]`` tensor as a ``[B]`` array of the
    batch's dtype, so one compiled kernel serves both (read only: a number's array is
    kept for the next step)."""
    if isinstance(value, torch.Tensor):
        return value.to(batch.dtype).numpy()
    return _filled(batch.num_systems, float(value), batch.dtype)


@functools.lru_cache(maxsize=32)
def _filled(n: int, value: float, dtype: torch.dtype) -> np.ndarray:
    """``[n]`` times ``value``: kept, because making it right after the forward is one
    more cold operation in every step."""
    return torch.full((n,), value, dtype=dtype).numpy()


@functools.cache
def _numba_available() -> bool:
    try:
        importlib.import_module("numba")
    except ImportError:
        logger.info(
            "numba is not installed: integrators run their torch path on CPU "
            "(pip install numba for the compiled CPU kernels)"
        )
        return False
    return True


__all__ = ["ENABLED", "ENV_SWITCH", "load", "per_system", "usable"]
