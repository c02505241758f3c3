"""Simulator: the Trainer of alchemi_lit.

It validates and wires a model, a stage plan, callbacks and sinks, then hands the
work to a strategy (single device today; pipelines and replicas across ranks).  It
owns no physics: integrators, models and strategies do.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from .callbacks.nan_guard import NaNGuard
from .core.environment import numerics_environment, package_versions
from .core.errors import ConfigError
from .core.state import Batch
from .engine import cuda_graph
from .engine.cadence import check_sync_every
from .engine.hooks import Callback
from .engine.restart import input_system_ids
from .integrators.base import Integrator
from .integrators.params import check_system_ids
from .integrators.stages import Fused, Pipeline, as_plan
from .io.results import Results
from .models.base import Model, cpu_batch_advice
from .sinks import Sink
from .strategies.base import Strategy, create_strategy
from .strategies.buffers import BufferConfig
from .strategies.launch import StartMethod
from .strategies.pipeline import CommMode
from .strategies.run_input import run_input
from .strategies.single import resolve_device

Precision = Literal["64", "32", "64-true", "32-true"]
_DTYPES = {
    "64": torch.float64,
    "32": torch.float32,
    "64-true": torch.float64,
    "32-true": torch.float32,
}


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
        sync_every: when the host does its bookkeeping (graduation, refills, ON_CONVERGE
            callbacks, termination): ``"auto"`` (default) as soon as it costs less than
            the forward time finished systems waste by staying in the batch, read from
            flags copied one step late without waiting (a system finished at step t is
            out of the forward by t + 2 whenever that pays); an integer N: every N steps
            (pipeline exchanges too; with "auto" they come every 10 steps).
        stress: compute the stress in every forward (``True``: results carry it),
            never (``False``), or only where a stage or callback needs it (``None``,
            the default: cell filters and barostats).  Results carry NaN stress where
            it was not computed; no extra model evaluation is made for it.
        strategy: ``"auto"`` (pipeline plans -> ``"pipeline"``, else ``"single"``),
            ``"single"``, ``"pipeline"`` (one rank per pipeline stage), ``"replicas"``
            (``devices`` copies of the plan, each on a shard of the data), the name of
            any registered strategy plugin, or a
            :class:`~alchemi_lit.strategies.Strategy` instance.
        buffer, comm_mode, start_method, timeout, debug, synchronized: options of the
            pipeline and replicas strategies, passed through to the one ``strategy``
            names (see :class:`~alchemi_lit.strategies.distributed.DistributedStrategy`;
            with a strategy instance, give them to it instead).  None: its default.
        compile: ``True`` compiles the model's edge computation and the integrators'
            per-atom random numbers with ``torch.compile``; ``"model"`` or
            ``"integrators"`` only one of them (on CPU neither gains with a cheap
            model: a compiled LJ edge computation is slower than eager, and the noise's
            words already run compiled; see BENCHMARKS.md).  Falls back to eager with a
            warning where the compiler fails; pays off for runs long enough to amortise
            the first compilation, which takes seconds; noise agrees with eager to an ulp.
        reuse_cpu_memory: on a CPU with glibc, keep memory the model frees in the heap
            for the next step while a run lasts rather than have it zero-filled again
            (:mod:`alchemi_lit.core.heap`).  ``False``: glibc's own.  No effect on GPUs.
        cuda_graphs: on CUDA, replay the step as a captured graph between bookkeeping
            points and list rebuilds (same trajectory; :mod:`.engine.cuda_graph` says
            what runs eagerly instead, with one warning).  Other devices: a warning.
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
        sync_every: int | Literal["auto"] = "auto",
        stress: bool | None = None,
        strategy: str | Strategy = "auto",
        buffer: BufferConfig | None = None,
        comm_mode: CommMode | None = None,
        start_method: StartMethod | None = None,
        timeout: float | None = None,
        debug: bool | None = None,
        synchronized: bool | None = None,
        compile: bool | Literal["model", "integrators"] = False,
        reuse_cpu_memory: bool = True,
        cuda_graphs: bool = False,
    ) -> None:
        if not isinstance(model, Model):
            raise ConfigError(
                f"model must be an alchemi_lit Model (e.g. LennardJones(...)), got "
                f"{type(model).__name__}; wrap other models by subclassing alchemi_lit.models.Model"
            )
        plan = as_plan(stages)
        given = dict(
            buffer=buffer, comm_mode=comm_mode, start_method=start_method, timeout=timeout,
            debug=debug, synchronized=synchronized,
        )  # fmt: skip
        options = {k: v for k, v in given.items() if v is not None}  # the strategy's own
        runner = create_strategy(strategy, plan, options)  # "auto" or registered names
        n_devices = len(devices) if isinstance(devices, (list, tuple)) else int(devices)
        if n_devices < 1:
            raise ConfigError(f"devices must be >= 1, got {devices}")
        # the constructor's settings, for the strategy's setup
        self.model = model
        self.accelerator = accelerator
        self.devices = devices
        self.num_devices = n_devices
        plan = runner.setup(self, plan)  # checks plan and devices; the plan it will run
        self.plan = plan
        self.strategy: Strategy = runner
        self.strategy_name = runner.name or type(runner).__name__
        if precision not in _DTYPES:
            raise ConfigError(f"precision must be one of {sorted(_DTYPES)}, got {precision!r}")
        self.sync_every = check_sync_every(sync_every)
        if stress not in (None, True, False):
            raise ConfigError(f"stress must be true, false or null (where needed), got {stress!r}")
        self.stress = stress
        self.callbacks = list(callbacks or [])
        if not any(isinstance(cb, NaNGuard) for cb in self.callbacks):
            self.callbacks.insert(0, NaNGuard())
        self.dtype = _DTYPES[precision]
        self.precision = precision
        self.device = resolve_device(accelerator, devices)
        self.seed = int(seed)
        if compile not in (True, False, "model", "integrators"):
            raise ConfigError(
                f"compile must be true, false, 'model' or 'integrators', got {compile!r}"
            )
        self.compile = compile
        self.reuse_cpu_memory = bool(reuse_cpu_memory)
        self.cuda_graphs = cuda_graph.check_cuda_graphs(cuda_graphs, self.device)
        if compile in (True, "model"):
            model.compile()
        if compile in (True, "integrators"):
            for stage in _stages_of(plan):
                stage.compile()
        self.config: dict[str, Any] | None = None  # the resolved CLI config, when run from one
        self.fingerprint: dict[str, Any] | None = None  # what a resume must find unchanged
        self.sinks = list(sinks) if sinks is not None else None  # None: fresh memory per run
        for s in (s for s in self.sinks or [] if not isinstance(s, Sink)):
            name = type(s).__name__
            raise ConfigError(f"sinks must be Sink instances (HostMemory, ZarrSink), got {name}")

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
        advice = cpu_batch_advice(self.model, int(batch.num_atoms), self.device)
        if advice is not None:
            from loguru import logger

            logger.warning(advice)
        return batch

    def run(self, data: Any, resume: str | os.PathLike[str] | bool | None = None) -> Results:
        """Run every system through the plan; results come back in ``system_id`` order.

        ``data``: a Batch or ase.Atoms (one batch), a list of ase.Atoms (one batch, or
        inflight batches of the default budget when larger), a path that
        :func:`~alchemi_lit.data.open_dataset` streams (file, folder, pattern or results
        store; the default budget, measured on CUDA, else bounded:
        :mod:`~alchemi_lit.data.default_budget`), or a
        :class:`~alchemi_lit.data.SizeAwareSampler` (inflight batching).

        ``resume`` continues an interrupted run with the same ``data`` and
        configuration: a checkpoint file or folder written by the
        :class:`~alchemi_lit.callbacks.Checkpoint` callback, or ``True`` for the
        callback's folder.  Where there is no checkpoint (the run was stopped before
        its first one, or had no Checkpoint callback), the run starts afresh with a
        warning, keeping the systems its results stores already hold and computing only
        the others (a system's path does not depend on the others, so the results are
        the same).  Either way a resume of a *different* run (another parameter, model,
        precision, seed or other structures) is refused, naming what differs.

        SIGTERM or SIGINT stops the run after the current step with every finished
        system written to the sinks (and a checkpoint, with the callback): it raises
        :class:`~alchemi_lit.engine.interrupt.RunInterrupted`, whose ``results`` hold
        the finished systems.

        The run's statistics (wall time, systems, steps, forward calls, start and end
        times) are recorded in the ``runs`` attribute of every results store it wrote.
        """
        started = time.time()
        from .integrators.proposal_copies import expand

        data = expand(self.plan, data)  # proposals=k (SwapMC, SemiGrandMC): k rows a chain
        data = run_input(data, self.device, self.model, self.strategy)  # never one huge batch
        from .engine.fingerprint import input_digest, run_fingerprint

        self.fingerprint = run_fingerprint(
            _stages_of(self.plan), self.model, self.precision, self.seed, input_digest(data)
        )
        from .callbacks.checkpoint import Checkpoint
        from .engine.restart import checkpoint_to_resume, continue_from_stores

        folders = [cb.dirpath for cb in self.callbacks if isinstance(cb, Checkpoint)]
        checkpoint = checkpoint_to_resume(resume, folders)
        earlier = None
        if resume in (None, False):
            self._check_stores(data)
            self._set_aside_earlier_checkpoints()
        elif checkpoint is None:  # nothing to resume from: the stores say what is done
            data, earlier = continue_from_stores(
                data, resume, self._stores(), self.fingerprint,
                lambda: self.strategy.salvage_before_restart(self), self._keeps_results_in_memory(),
            )  # fmt: skip
        stores = self._stores()
        new = [s for s in stores if not s.path.exists()]
        if data is None:  # every system was finished before
            results = Results(None, {"systems": 0, "steps": 0, "forward_calls": 0}, stores)
        else:
            ids = input_system_ids(data)
            for stage in _stages_of(self.plan) if ids is not None else ():
                check_system_ids(stage, ids)  # a short per-system list: now, not mid-run
            results = self.strategy.run(self, data, resume=checkpoint)
            if getattr(data, "skipped", None):  # skip_invalid: in the summary, with why
                results.stats["skipped"] = list(data.skipped)
        for store in new:  # made by this run (maybe in a rank): later runs append to it
            store.created_by_run()
        if earlier is not None and self._keeps_results_in_memory():
            parts = [earlier] + ([results.batch] if len(results) else [])
            results = Results(Batch.concatenate(parts), results.stats, results.sinks)
        results.stage_names = results.stage_names or self.stage_names()
        self._record_run(results, started, resumed=resume not in (None, False))
        return results

    @property
    def global_rank(self) -> int:
        """This process's rank in a multi-rank run (0 in a single-process run): code after
        :meth:`run` runs in every rank process of a pipeline, so guard what only one
        should do (write a report, print) with :attr:`is_global_zero`."""
        from .strategies.launch import process_rank

        return process_rank()

    @property
    def is_global_zero(self) -> bool:
        """Whether this is the first process (rank 0), as in Lightning."""
        return self.global_rank == 0

    def _keeps_results_in_memory(self) -> bool:
        """Whether a run's Results come from memory (a HostMemory sink, or no sinks)
        rather than being read back from a store."""
        from .sinks import HostMemory

        return self.sinks is None or any(isinstance(s, HostMemory) for s in self.sinks)

    def _stores(self) -> list[Any]:
        """This simulator's ZarrSinks."""
        from .sinks import ZarrSink

        return [s for s in self.sinks or [] if isinstance(s, ZarrSink)]

    def _set_aside_earlier_checkpoints(self) -> None:
        """A fresh run's Checkpoint folders must not hold an earlier run's files (see
        Checkpoint.set_aside_earlier); moved once, by the first process, before any
        strategy or rank starts."""
        from .callbacks.checkpoint import Checkpoint
        from .strategies.launch import is_first_process

        if is_first_process():
            for cp in [cb for cb in self.callbacks if isinstance(cb, Checkpoint)]:
                cp.set_aside_earlier()

    def _check_stores(self, data: Any) -> None:
        """Before anything is computed (in this process, whatever the strategy): a
        store must be writable, a ``"w-"`` store must not exist, and a run appending to
        a store must not reuse a ``system_id`` stored there (see ZarrSink)."""
        stores = self._stores()
        ids = input_system_ids(data) if stores else None
        for store in stores:
            store.refuse_unwritable()
            store.refuse_existing()
            if ids is not None:
                store.refuse_id_clashes(ids)

    def _record_run(self, results: Results, started: float, resumed: bool) -> None:
        """Write the run's statistics into ``runs[-1]`` of each results store it wrote
        (once, from the main process; pipeline ranks record nothing themselves)."""
        from datetime import datetime, timezone

        stores = self._stores()
        dist = torch.distributed
        if not stores or (dist.is_available() and dist.is_initialized() and dist.get_rank()):
            return
        ended = time.time()
        st, ranks = results.stats, results.stats.get("ranks") or []

        def total(key: str) -> int | None:
            if st.get(key) is not None:
                return int(st[key])
            values = [r.get(key) for r in ranks]
            return sum(values) if values and None not in values else None

        def iso(t: float) -> str:
            return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")

        wall = st.get("wall_time_s")
        record = {
            "wall_time_s": float(wall) if wall is not None else ended - started,
            "systems": total("systems"),
            "steps": total("steps"),  # pipelines: summed over ranks
            "forward_calls": total("forward_calls"),
            "started": iso(started),
            "ended": iso(ended),
            "strategy": self.strategy_name,
            "resumed": resumed,
            **({"skipped": st["skipped"]} if st.get("skipped") else {}),
        }
        for sink in stores:
            sink.record_run(record)

    def stage_names(self) -> list[str]:
        """Labels of the per-stage history columns (``stage_steps``, ``stage_exit``,
        ``stage_energy``): ``"code:Name"`` for a fused plan, ``"column:Name"`` across a
        pipeline's ranks (whose status codes each restart at 0); replicas share the
        columns of their base plan."""
        plan = self.plan
        if isinstance(plan, Fused):
            return [f"{c}:{type(s).__name__}" for c, s in zip(plan.codes, plan.stages)]
        strategy = self.strategy
        period = strategy.replica_period()
        ranks = sorted(plan.stages)[: period or len(plan.stages)]
        names = [type(s).__name__ for r in ranks for s in plan.stages[r].stages]
        return [f"{c}:{n}" for c, n in enumerate(names)]

    def run_info(self) -> dict[str, Any]:
        """What produced the results: plan, model, settings, package versions and the
        numerical libraries' code paths (:mod:`~alchemi_lit.core.environment`)."""
        return {
            "plan": repr(self.plan),
            "stage_names": self.stage_names(),
            "model": type(self.model).__name__,
            "precision": self.precision,
            "device": str(self.device),
            "seed": self.seed,
            "sync_every": self.sync_every,
            "cuda_graphs": self.cuda_graphs,
            "stress": self.stress,
            "fingerprint": self.fingerprint,
            "config": self.config,
            "environment": numerics_environment(),
            "versions": package_versions(),
        }


def _stages_of(plan: Fused | Pipeline) -> list[Integrator]:
    """Every stage of a fused plan or of all a pipeline's ranks."""
    if isinstance(plan, Fused):
        return list(plan.stages)
    return [s for fused in plan.stages.values() for s in fused.stages]
