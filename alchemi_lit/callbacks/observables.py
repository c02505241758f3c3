"""The base of the MD observables that accumulate during a run (RDF, MSD, VACF, block
averages): per system, in batch fields, with nothing kept of the trajectory.

Why batch fields: an observable's running sums are per-system state exactly like an
integrator's, so they live where that state lives.  A system then carries its sums when
it is packed, moved to another rank or checkpointed, a system joining the batch starts
from zeros, a resumed run goes on from the checkpoint's sums bit for bit, and no sum
depends on the systems beside it.  A sample is elementwise torch work on those fields
(no host read; nothing that depends on the step but tensors), taken at ``BEFORE_STEP``
every ``every`` loop steps, as :class:`~alchemi_lit.callbacks.TrajectoryWriter` writes a
frame -- the state after ``step`` steps -- so an observable computed here equals the same
function of the stored trajectory.

Which systems: those in the observed stages (``stages``: indices into the plan; default
every stage that is not an optimizer; on a pipeline rank without one, none) that have
taken at least ``skip`` steps in their stage (equilibration).  When a system leaves the
plan, its sums are read once (the bookkeeping that sees it finish), turned into results
and appended to the store at ``path`` (:mod:`alchemi_lit.io.observables_store`) and
to :meth:`Observable.to_pandas` / :meth:`Observable.result` (in a pipeline or replicas
run these stay in the rank's process: read the store).  With ``every == 1`` an
observable is ``graph_safe``: ``Simulator(cuda_graphs=True)`` captures it with the step;
otherwise its steps run eagerly.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ..core.errors import ConfigError
from ..engine.hooks import Callback, StepContext
from ..io.observables_store import append_rows, truncate
from .logger import stage_codes


class Observable(Callback, metaclass=abc.ABCMeta):
    """Base class (see the module docstring).  Subclasses name their fields
    (:meth:`declare`), add one sample (:meth:`accumulate`) and turn one system's sums
    into results (:meth:`summarize`).

    Args:
        every: loop steps between two samples (>= 1).
        skip: stage steps a system takes before its first sample (equilibration).
        path: zarr store the results are appended to (None: kept in memory only).
        stages: indices of the plan's stages to sample (None: every MD stage).
    """

    #: the group in the store and the prefix of the batch fields
    name: ClassVar[str] = "observable"

    def __init__(
        self, every: int = 1, skip: int = 0, path: str | os.PathLike[str] | None = None,
        stages: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        owner = type(self).__name__
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise ConfigError(f"{owner}: every must be an int >= 1 (loop steps), got {every!r}")
        super().__init__(int(every))
        if isinstance(skip, bool) or not isinstance(skip, (int, np.integer)) or skip < 0:
            raise ConfigError(f"{owner}: skip must be an int >= 0 (stage steps), got {skip!r}")
        self.skip = int(skip)
        self.path = None if path is None else Path(path)
        self.stages = None if stages is None else [int(s) for s in stages]
        self.graph_safe = self.every == 1  # type: ignore[misc]
        self._codes: torch.Tensor | None = None
        self._final = True
        self._rows: list[dict[str, Any]] = []
        self._done: set[int] = set()
        self._stored = 0
        self._restored = False

    # ---------------------------------------------------------------- subclass API
    def field(self, key: str) -> str:
        """The batch field of this observable's ``key``."""
        return f"obs_{self.name}_{key}"

    @abc.abstractmethod
    def declare(self, ctx: StepContext) -> None:
        """Declare the fields (``batch.ensure_field``) and check the settings."""

    @abc.abstractmethod
    def accumulate(self, ctx: StepContext, rows: torch.Tensor) -> None:
        """Add one sample of the systems ``rows`` ``[B]`` (torch, no host read)."""

    @abc.abstractmethod
    def summarize(self, sums: dict[str, np.ndarray]) -> dict[str, Any]:
        """One system's results from its fields' rows (``sums``: key -> array)."""

    def meta(self) -> dict[str, Any]:
        """Settings stored with the results (JSON)."""
        return {"every": self.every, "skip": self.skip}

    # ---------------------------------------------------------------- hooks
    def on_run_start(self, ctx: StepContext) -> None:
        if not self._restored:
            self._rows, self._done, self._stored = [], set(), 0
        elif self.path is not None:
            truncate(self.path, {self.name: self._stored})
        self._restored = False
        codes, _ = stage_codes(ctx)
        picked = self.stages
        if picked is None:
            picked = [k for k, s in enumerate(ctx.stages) if not getattr(s, "is_optimizer", False)]
        bad = [k for k in picked if not 0 <= k < len(codes)]
        if bad or (self.stages is not None and not picked):
            asked = self.stages if self.stages else "(every MD stage)"
            raise ConfigError(
                f"{type(self).__name__}: stages {asked} name no stage of the plan's "
                f"{len(codes)} ({list(ctx.stages)}); give indices 0..{len(codes) - 1} of "
                f"stages to sample"
            )
        self._codes = torch.tensor([codes[k] for k in picked], dtype=torch.int64,
                                   device=ctx.batch.device)  # fmt: skip
        plan = getattr(ctx.simulator, "plan", None)
        sinks = plan.sinks() if ctx.rank is not None and hasattr(plan, "sinks") else None
        # systems leave the whole plan only on a pipeline's last ranks: results there
        self._final = sinks is None or ctx.rank in sinks
        self.declare(ctx)

    def sampled(self, ctx: StepContext) -> torch.Tensor:
        """``[B]`` the systems this step samples."""
        b = ctx.batch
        inside = torch.isin(b.status, self._codes)
        return inside & (b.step >= self.skip) if self.skip else inside

    def before_step(self, ctx: StepContext) -> None:
        b = ctx.batch
        if b.num_systems and len(self._codes):  # (a pipeline rank without MD: nothing)
            if self.field("samples") not in b.system and self.field("n") not in b.system:
                self.declare(ctx)  # a batch made anew at a refill: its systems start at 0
            self.accumulate(ctx, self.sampled(ctx))

    def on_converge(self, ctx: StepContext) -> None:
        b = ctx.batch
        if ctx.exited is None or not b.num_systems or not self._final or not len(self._codes):
            return
        done = ctx.exited & (b.status == ctx.state.get("exit_code", -1))
        idx = done.nonzero().flatten()  # bookkeeping only: systems that left the plan
        if idx.numel():
            self.finish(ctx, idx)

    def finish(self, ctx: StepContext, idx: torch.Tensor) -> None:
        """Results of the systems at rows ``idx``, appended to the store and memory."""
        b = ctx.batch
        prefix = f"obs_{self.name}_"
        keys = [k for k in b.system if k.startswith(prefix)]
        host = {k[len(prefix):]: b.system[k][idx].cpu().numpy() for k in keys}
        ids = b.system_id[idx].tolist()
        codes = b.exit_code[idx].tolist()
        new = []
        for r, (sid, code) in enumerate(zip(ids, codes)):
            if sid in self._done:
                continue
            row = {"system_id": np.int64(sid), "exit_code": np.int64(code)}
            row.update(self.summarize({k: v[r] for k, v in host.items()}))
            new.append(row)
            self._done.add(sid)
        self._rows.extend(new)
        if self.path is not None and new:
            self._stored = append_rows(self.path, self.name, new, self.meta())
        elif new:
            self._stored += len(new)

    # ---------------------------------------------------------------- results
    @property
    def system_ids(self) -> list[int]:
        """Ids of the systems with results, in the order they finished."""
        return [int(r["system_id"]) for r in self._rows]

    def result(self, system_id: int) -> dict[str, Any]:
        """One system's results: NumPy arrays and numbers (keys: the class docstring)."""
        for row in self._rows:
            if int(row["system_id"]) == int(system_id):
                return dict(row)
        raise KeyError(
            f"{type(self).__name__} has no results for system {system_id} (results are "
            f"made when a system leaves the plan); systems with results: {self.system_ids[:20]}"
        )

    def to_pandas(self) -> Any:
        """One row per finished system: its scalar results (arrays: :meth:`result`)."""
        import pandas as pd

        rows = [{k: v.item() for k, v in r.items() if np.ndim(v) == 0} for r in self._rows]
        table = pd.DataFrame(rows)
        return table.sort_values("system_id", ignore_index=True) if len(table) else table

    def state_dict(self) -> dict[str, Any]:
        # tensors, not NumPy arrays: checkpoints load with torch.load(weights_only=True)
        rows = [{k: torch.as_tensor(np.asarray(v)) for k, v in r.items()} for r in self._rows]
        return {"rows": rows, "stored": self._stored}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rows = [{k: v.numpy() for k, v in r.items()} for r in state.get("rows", [])]
        self._done = {int(r["system_id"]) for r in self._rows}
        self._stored = int(state.get("stored", 0))
        self._restored = True


def stage_time_step(ctx: StepContext) -> torch.Tensor:
    """``[B]`` the time step (fs) of each system's MD stage (0 elsewhere)."""
    from ..integrators.ops import per_system

    b = ctx.batch
    dt = torch.zeros_like(b.energy)
    all_codes, _ = stage_codes(ctx)
    for code, stage in zip(all_codes, ctx.stages):
        step = getattr(stage, "dt_fs", None)
        if step is not None:
            value = per_system(b, step) * torch.ones_like(dt)
            dt = torch.where(b.status == code, value, dt)
    return dt


__all__ = ["Observable", "stage_time_step"]
