"""Simulator: the Trainer of alchemi_lit.

It validates and wires a model, a stage plan, callbacks and sinks, then hands the
work to a strategy (single device today; pipelines and replicas across ranks).  It
owns no physics: integrators, models and strategies do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from .callbacks.nan_guard import NaNGuard
from .data.sampler import SizeAwareSampler
from .errors import ConfigError
from .hooks import Callback
from .integrators.base import Integrator
from .models.base import Model
from .results import Results
from .sinks import Sink
from .stages import Fused, Pipeline, as_plan
from .state import Batch
from .strategies.single import SingleDeviceStrategy, resolve_device

Precision = Literal["64", "32", "64-true", "32-true"]
_DTYPES = {"64": torch.float64, "32": torch.float32, "64-true": torch.float64, "32-true": torch.float32}


class Simulator:
    """Run a plan of integrators over many systems at once.

    Args:
        model: energy -> forces/stress model (any :class:`~alchemi_lit.models.Model`).
        stages: one integrator, a fused plan (``a + b``, or the list ``[a, b]``) or a
            pipeline (``a | b``, or ``[[a, b], [c]]``: one inner list per rank).
        callbacks: hook callbacks; a :class:`NaNGuard` is added unless one is given.
        sinks: where finished systems go, in priority order (default: one unbounded
            :class:`~alchemi_lit.sinks.HostMemory`, returned as the run's Results).
        accelerator: ``"auto"`` (CUDA if present), ``"cpu"`` or ``"cuda"``.
        devices: device count or indices (pipelines: one rank per device).
        precision: ``"64"`` (float64) or ``"32"`` (float32) for positions and forces.
        seed: key of every random stream (with system_id and step).
        sync_every: steps between host bookkeeping (termination, graduation, refills,
            ON_CONVERGE callbacks); the step loop itself never waits on the host.
    """

    def __init__(
        self,
        model: Model,
        stages: Integrator | Fused | Pipeline | Sequence[Integrator | Sequence[Integrator]],
        callbacks: Sequence[Callback] | None = None,
        sinks: Sequence[Sink] | None = None,
        accelerator: str = "auto",
        devices: int | Sequence[int] = 1,
        precision: Precision = "64",
        seed: int = 0,
        sync_every: int = 10,
    ) -> None:
        if not isinstance(model, Model):
            raise ConfigError(
                f"model must be an alchemi_lit Model (e.g. LennardJones(...)), got "
                f"{type(model).__name__}; wrap other models by subclassing alchemi_lit.models.Model"
            )
        plan = as_plan(stages)
        if isinstance(plan, Pipeline):
            raise ConfigError(
                "a pipeline plan (a | b) runs one stage per rank; this Simulator runs one "
                "device: combine stages with '+' instead"
            )
        self.plan = plan
        if precision not in _DTYPES:
            raise ConfigError(f"precision must be one of {sorted(_DTYPES)}, got {precision!r}")
        if int(sync_every) < 1:
            raise ConfigError(f"sync_every must be >= 1, got {sync_every}")
        self.model = model
        self.callbacks = list(callbacks or [])
        if not any(isinstance(cb, NaNGuard) for cb in self.callbacks):
            self.callbacks.insert(0, NaNGuard())
        self.dtype = _DTYPES[precision]
        self.precision = precision
        self.device = resolve_device(accelerator, devices)
        self.seed = int(seed)
        self.sync_every = int(sync_every)
        self.config: dict[str, Any] | None = None  # the resolved CLI config, when run from one
        self.sinks = list(sinks) if sinks is not None else None  # None: fresh memory per run
        for s in self.sinks or []:
            if not isinstance(s, Sink):
                raise ConfigError(f"sinks must be Sink instances (HostMemory, ZarrSink), got {type(s).__name__}")
        self.strategy = SingleDeviceStrategy(self.device)

    def forward_fn(self) -> Callable[[Batch], dict[str, torch.Tensor]]:
        """The model call used in the step loop."""
        return self.model

    def prepare(self, data: Any) -> Batch:
        """Turn user input (Batch, ase.Atoms or a list of them) into a batch on our device."""
        if isinstance(data, Batch):
            batch = data.to(device=self.device, dtype=self.dtype).clone()  # never mutate input
        else:
            from ase import Atoms

            atoms = [data] if isinstance(data, Atoms) else list(data)
            if not atoms or not all(isinstance(a, Atoms) for a in atoms):
                raise ConfigError(
                    "run() takes a Batch, an ase.Atoms or a non-empty list of ase.Atoms"
                )
            batch = Batch.from_atoms(atoms, dtype=self.dtype, device=self.device)
        self.model.check_batch(batch)
        return batch

    def run(self, data: Any) -> Results:
        """Run every system through the plan; results come back in ``system_id`` order.

        ``data``: a Batch, ase.Atoms or list of them (all in one batch), or a
        :class:`~alchemi_lit.data.SizeAwareSampler` (inflight batching: the batch is
        refilled as systems finish).
        """
        self.model.to(self.device)
        source = data if isinstance(data, SizeAwareSampler) else self.prepare(data)
        return self.strategy.run(self, source, self.plan)

    def run_info(self) -> dict[str, Any]:
        """What produced the results: plan, model, settings and package versions."""
        import ase
        import numpy

        from . import __version__

        return {
            "plan": repr(self.plan),
            "model": type(self.model).__name__,
            "precision": self.precision,
            "device": str(self.device),
            "seed": self.seed,
            "sync_every": self.sync_every,
            "config": self.config,
            "versions": {
                "alchemi_lit": __version__, "torch": torch.__version__,
                "ase": ase.__version__, "numpy": numpy.__version__,
            },
        }
