"""Single-device strategy: run a fused plan on one batch until every system exits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..hooks import HookDispatcher, HookStageEnum, StepContext
from ..results import Results
from ..stages import Fused
from ..state import Batch
from .fused import FusedLoop

if TYPE_CHECKING:
    from ..simulator import Simulator


class SingleDeviceStrategy:
    """One process, one device; the fused plan's loop with periodic bookkeeping."""

    name = "single"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def run(self, sim: Simulator, batch: Batch, plan: Fused) -> Results:
        hooks = HookDispatcher(sim.callbacks)
        loop = FusedLoop(sim.model, plan, hooks, seed=sim.seed, forward=sim.forward_fn())
        self.loop = loop
        loop.declare(batch)
        ctx = StepContext(batch=batch, stages=plan.stages, simulator=sim)
        ctx.state.update(has_fixed=bool(batch.fixed.any()), exit_code=plan.exit)
        fresh = torch.ones(batch.num_systems, dtype=torch.bool, device=batch.device)
        loop.compute(batch, ctx)  # forces before the first step
        hooks.run_start(ctx)
        loop.start(batch, fresh)
        limit = plan.total_budget() + 1
        try:
            while True:
                for _ in range(sim.sync_every):
                    loop.step(batch, ctx)
                if self.bookkeeping(loop, batch, ctx, hooks):
                    break
                if ctx.step > limit + sim.sync_every:
                    raise RuntimeError(
                        f"run did not finish within {limit} steps although every stage has a "
                        f"finite budget; this is a bug, please report it with your plan {plan!r}"
                    )
        finally:
            hooks.run_end(ctx)
        return Results(batch, {"steps": ctx.step, "forward_calls": loop.num_forward_calls})

    @staticmethod
    def bookkeeping(loop: FusedLoop, batch: Batch, ctx: StepContext, hooks: HookDispatcher) -> bool:
        """Host-side work every ``sync_every`` steps; returns True when all systems exited."""
        if ctx.exited is not None and hooks.has(HookStageEnum.ON_CONVERGE) and bool(ctx.exited.any()):
            hooks(HookStageEnum.ON_CONVERGE, ctx)
        ctx.exited = ctx.converged = None
        return bool(loop.finished(batch).all())


def resolve_device(accelerator: str, devices: Any = 1) -> torch.device:
    """``auto`` -> first CUDA device if available, else CPU."""
    acc = accelerator.lower()
    if acc == "auto":
        acc = "cuda" if torch.cuda.is_available() else "cpu"
    if acc in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"accelerator={accelerator!r} but no CUDA device is available; use "
                f"accelerator='cpu' or 'auto'"
            )
        index = devices[0] if isinstance(devices, (list, tuple)) else 0
        return torch.device("cuda", int(index))
    if acc == "cpu":
        return torch.device("cpu")
    raise ValueError(f"unknown accelerator {accelerator!r}; choose 'auto', 'cpu' or 'cuda'")
