"""Pipeline and replica strategies: validate, launch ranks, run workers, collect.

``pipeline``: one rank per stage of a :class:`~alchemi_lit.integrators.stages.Pipeline`.
``replicas``: ``n`` copies of the plan (a fused plan, or a pipeline of ``p`` ranks
when ``devices = n * p``), each over a disjoint shard of the sampler balanced by atom
count.  Both are the same engine: replicas are independent sub-pipelines whose
source ranks split the data.

Results: sink ranks write to their sinks (a ZarrSink becomes one store per writing
rank, merged into the requested store by rank 0 at the end, each system once); with
in-memory sinks the finished systems are gathered on rank 0 as numpy arrays.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from abc import abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from ..core.errors import ConfigError
from ..core.state import Batch
from ..data.sampler import SizeAwareSampler
from ..engine.interrupt import RunInterrupted
from ..integrators.stages import Fused, Pipeline
from ..io.results import Results
from ..sinks import ZarrSink
from .base import Strategy
from .buffers import BufferConfig, check_info_fits
from .launch import StartMethod, launch, rank_device
from .pipeline import INTERRUPTED, CommMode, HistoryLayout, PipelineError, PipelineWorker
from .rank_stores import merge_parts, merge_stores, part_path, rank_sinks, results_from, to_numpy
from .shares import rank_totals, shard
from .units import check_units

if TYPE_CHECKING:
    from ..simulator import Simulator


def _buffer_config(buffer: BufferConfig | Mapping[str, int] | None) -> BufferConfig:
    """A BufferConfig from one, its fields as a mapping (a config file), or None."""
    if buffer is None:
        return BufferConfig()
    if isinstance(buffer, Mapping):
        try:
            return BufferConfig(**buffer)
        except TypeError as exc:
            raise ConfigError(
                f"buffer: {exc}; BufferConfig takes num_systems, num_atoms, num_edges, info_bytes"
            ) from None
    if not isinstance(buffer, BufferConfig):
        raise ConfigError(f"buffer must be a BufferConfig, got {type(buffer).__name__}")
    return buffer


class DistributedStrategy(Strategy):
    """Runs a pipeline (or replicas) over ranks; see module docstring.

    Subclasses say how the plan maps to ranks (:meth:`rank_plan`).  The options are the
    strategy's own (``Simulator(strategy="pipeline", buffer=...)`` passes them through).

    Args:
        buffer: transfer-buffer capacity between ranks (a :class:`BufferConfig` or its
            fields as a mapping; default ``BufferConfig()``).
        comm_mode: ``"async_recv"`` (receives posted a round early, so a rank rarely
            waits on a send), ``"sync"`` (blocking, lockstep with neighbours) or
            ``"fully_async"`` (sends completed a round later); all give identical results.
        start_method: how Fabric starts ranks from a plain script: ``"popen"`` (re-runs
            the command), ``"fork"`` or ``"spawn"``; ignored under torchrun.
        timeout: seconds a rank waits for a silent peer before failing.
        debug: log every exchange (rank in each line).
        synchronized: exchange after every step, in lockstep with neighbours.
    """

    #: "pipeline" or "replicas": how the ranks share the work
    mode = "pipeline"

    def __init__(
        self,
        buffer: BufferConfig | Mapping[str, int] | None = None,
        comm_mode: CommMode = "async_recv",
        start_method: StartMethod = "popen",
        timeout: float = 600.0,
        debug: bool = False,
        synchronized: bool = False,
    ) -> None:
        self.pipeline: Pipeline | None = None
        self.buffer = _buffer_config(buffer)
        if comm_mode not in ("sync", "async_recv", "fully_async"):
            raise ConfigError(
                f"comm_mode must be 'sync', 'async_recv' or 'fully_async', got {comm_mode!r}"
            )
        if start_method not in ("popen", "fork", "spawn"):
            raise ConfigError(
                f"start_method must be 'popen', 'fork' or 'spawn', got {start_method!r}"
            )
        if not float(timeout) > 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout}")
        self.comm_mode: CommMode = comm_mode
        self.start_method: StartMethod = start_method
        self.timeout_s = float(timeout)
        self.debug, self.synchronized = bool(debug), bool(synchronized)

    @abstractmethod
    def rank_plan(self, plan: Fused | Pipeline, num_devices: int) -> Pipeline:
        """The pipeline of ranks that runs ``plan`` on ``num_devices`` devices."""

    def setup(self, sim: Simulator, plan: Fused | Pipeline) -> Pipeline:
        self.pipeline = self.rank_plan(plan, sim.num_devices)
        self.accelerator = sim.accelerator
        return self.pipeline

    def validate(self, sampler: SizeAwareSampler, radius: float | None = None) -> None:
        """Checks every rank would make, done before launching anything.  ``radius``: the
        model's cutoff plus skin, to check ``BufferConfig.num_edges``."""
        sampler.budget()  # max_atoms="auto" is measured by the single strategy only
        big = np.flatnonzero(sampler.sizes > self.buffer.num_atoms)
        if len(big):
            k = int(big[0])
            raise ConfigError(
                f"system {k} has {int(sampler.sizes[k])} atoms but the transfer buffer holds "
                f"{self.buffer.num_atoms} (BufferConfig.num_atoms); raise num_atoms to at least "
                f"{int(sampler.sizes.max())}"
            )
        counted = [0] * len(sampler.dataset)
        if self.buffer.num_edges and radius is not None:
            from ..data.sampler_checks import count_edges as _count_edges

            for k in sampler.order:
                pairs = counted[int(k)] = _count_edges(sampler.dataset[int(k)], radius)
                if pairs > self.buffer.num_edges:
                    raise ConfigError(
                        f"system {int(k)} has {pairs} neighbour pairs but the transfer buffer "
                        f"holds {self.buffer.num_edges} (BufferConfig.num_edges); raise num_edges "
                        f"or set it to 0 (unbounded)"
                    )
        check_units(self.pipeline, sampler, self.buffer, counted)  # whole, one message each
        for k in sampler.order:  # each system's info must fit one message's info room
            atoms = sampler.dataset[int(k)]
            check_info_fits(getattr(atoms, "info", None), int(k), self.buffer)
        if (
            len(self.pipeline.edges) == 0
            and self.pipeline.num_ranks > 1
            and self.mode == "pipeline"
        ):
            raise ConfigError("a pipeline with several ranks needs edges between them")

    def replica_period(self) -> int | None:
        """Ranks per replica when this runs replicas of one plan (``plan.replicate(n)``):
        replicas then share the base plan's stage-history columns and exit codes, so their
        results look exactly like one process's.  None otherwise."""
        if self.mode != "replicas":
            return None
        n = self.pipeline.num_ranks
        for p in range(1, n + 1):
            if n % p:
                continue
            base = Pipeline(
                {r: self.pipeline.stages[r] for r in range(p)},
                [(a, b) for a, b in self.pipeline.edges if a < p and b < p],
            )
            same = all(self.pipeline.stages[r] is base.stages[r % p] for r in range(n))
            if same and sorted(base.replicate(n // p).edges) == sorted(self.pipeline.edges):
                return p
        return None

    def run(self, sim: Simulator, data: Any, resume: str | None = None) -> Results:
        """Launch the ranks and collect their results.

        ``data``: a SizeAwareSampler, or structures (all given to the source ranks at
        once).  ``resume``: the directory of the Checkpoint callback; every rank continues
        from the newest exchange round all ranks have a checkpoint of."""
        sampler = data
        if not isinstance(sampler, SizeAwareSampler):
            atoms = list(data.to_atoms(results=False) if isinstance(data, Batch) else data)
            # to_atoms lists systems in system_id order: their ids, in that order, go along
            ids = sorted(data.system_id.tolist()) if isinstance(data, Batch) else None
            sampler = SizeAwareSampler(
                atoms, max_atoms=max(sum(len(a) for a in atoms), 1), system_ids=ids
            )
        self.validate(sampler, sim.model.cutoff + sim.model.neighbors.skin)
        world = self.pipeline.num_ranks
        try:
            out = launch(
                lambda rank, local: self._rank_main(sim, sampler, rank, local, resume),
                world,
                self.accelerator,
                self.start_method,
                self.timeout_s,
            )
        except RunInterrupted as exc:
            raise self._interrupted(sim, exc.signum, exc.path) from None
        except PipelineError as exc:
            if exc.message.startswith(INTERRUPTED):  # a signal stopped another rank
                name = exc.message[len(INTERRUPTED) :].strip()
                raise self._interrupted(sim, int(signal.Signals[name]), None) from None
            note = self._salvage(sim)
            if not note:
                raise
            raise PipelineError(exc.rank, f"{exc.message}; {note}") from exc
        return results_from(out, sim)

    def _interrupted(self, sim: Simulator, signum: int, path: Any) -> RunInterrupted:
        """The RunInterrupted this process raises when a signal stopped the ranks: it
        says where the finished systems are (stores written by several ranks are
        merged into the named ones first; see :meth:`_salvage`)."""
        stores = [str(s.path) for s in sim.sinks or [] if isinstance(s, ZarrSink)]
        where = self._salvage(sim) or (
            f"the finished systems were written to {', '.join(stores)}"
            if stores
            else "the ranks' finished systems were held in memory and are lost (add a ZarrSink)"
        )
        return RunInterrupted(path, signum, where=where)

    def salvage_before_restart(self, sim: Simulator) -> None:
        """Merge the per-rank stores an interrupted run left (several writing ranks)
        into the stores the user named, so a restart finds those systems done."""
        for s in sim.sinks or []:
            if not isinstance(s, ZarrSink):
                continue
            parts = sorted(
                str(p) for p in s.path.parent.glob(f"{s.path.stem}.rank*{s.path.suffix}")
            )
            if parts:
                merge_parts(
                    sim, s.path, s.mode, parts, remove=True, continuing=s.path.exists(), like=s
                )

    def _salvage(self, sim: Simulator) -> str:
        """After a failed run with several writing ranks, merge what each committed to its
        own store into the store the user named, so finished systems are where they are
        expected.  The per-rank stores stay when a Checkpoint callback can resume the run
        (a resume continues them); otherwise they are removed.  Returns a note for the
        error message (empty when there was nothing to merge)."""
        sink_ranks = self.pipeline.sinks()
        if len(sink_ranks) < 2 or not sim.sinks:
            return ""
        from ..callbacks import Checkpoint

        resumable = any(isinstance(cb, Checkpoint) for cb in sim.callbacks)
        notes = []
        for s in sim.sinks:
            if not isinstance(s, ZarrSink):
                continue
            parts = [str(part_path(s.path, r)) for r in sink_ranks]
            n = merge_parts(sim, s.path, s.mode, parts, remove=not resumable, like=s)
            notes.append(f"the {n} systems finished before the failure were merged into {s.path}")
        return "; ".join(notes)

    # ---------------------------------------------------------------- per rank
    def _rank_main(
        self,
        sim: Simulator,
        sampler: SizeAwareSampler,
        rank: int,
        local: int,
        resume: str | None = None,
    ) -> Any:
        device = rank_device(self.accelerator, local)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        comm_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
        sim.device = device
        sim.model.to(device)
        sources = self.pipeline.sources()
        my_sampler = shard(sampler, len(sources), sources.index(rank)) if rank in sources else None
        sinks_ranks = self.pipeline.sinks()
        requested = sim.sinks
        # the rank's own copies; the requested sinks come back after the run, so the
        # Results and the caller (the CLI's summary) of rank 0 -- the launching process
        # itself under popen, torchrun and SLURM -- see the merged store, not a part
        sim.sinks = rank_sinks(requested, rank, len(sinks_ranks) > 1, keep=resume is not None)
        try:
            return self._run_worker(sim, sampler, rank, my_sampler, device, comm_device, resume)
        finally:
            sim.sinks = requested

    def _run_worker(
        self,
        sim: Simulator,
        sampler: SizeAwareSampler,
        rank: int,
        my_sampler: SizeAwareSampler | None,
        device: torch.device,
        comm_device: torch.device,
        resume: str | None,
    ) -> Any:
        """Run this rank's worker over its sinks, gather every rank's outcome on every
        rank and merge the per-rank stores (rank 0)."""
        sinks_ranks = self.pipeline.sinks()
        worker = PipelineWorker(
            sim,
            self.pipeline,
            rank,
            my_sampler,
            self.buffer,
            self.comm_mode,
            device,
            comm_device,
            capacity=sampler.budget()[:2],
            debug=self.debug,
            synchronized=self.synchronized,
            history=HistoryLayout.of(self.pipeline, self.replica_period()),
            timeout_s=self.timeout_s,
            resume=resume,
        )
        worker.constraints = frozenset(sampler.constraint_names)  # (the full input's: all alike)
        shares = rank_totals(self.pipeline, sampler)
        known = shares.get(rank)
        worker.context["ranks"] = self.pipeline.num_ranks
        if known is not None:  # the systems that pass through this rank: its bar's total
            worker.context.update(total_systems=known[0], total_atoms=known[1])
        board = self._progress_board(rank) if self.replica_period() is not None else None
        if board is not None:  # replicas: rank 0's bar counts every replica
            worker.context.update(progress_dir=board, rank_shares=shares)
        try:
            result = worker.run()
        finally:
            if board is not None and rank == 0:
                shutil.rmtree(board, ignore_errors=True)
        memory = [b for b in result["sinks"].in_memory] + list(result["sinks"].overflow)
        payload = {
            "stats": result["stats"],
            "systems": to_numpy(Batch.concatenate(memory)) if memory else None,
            "stores": [str(s.path) for s in (sim.sinks or []) if isinstance(s, ZarrSink)],
        }
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, payload)
        if rank == 0:
            merge_stores(sim, gathered, len(sinks_ranks) > 1)
        dist.barrier()
        return gathered

    @staticmethod
    def _progress_board(rank: int) -> str:
        """The folder where replicas post their progress (:mod:`~alchemi_lit.callbacks.
        rank_board`): rank 0's, broadcast to every rank."""
        folder = [tempfile.mkdtemp(prefix="alchemi-progress-") if rank == 0 else None]
        dist.broadcast_object_list(folder, src=0)
        return str(folder[0])


class PipelineStrategy(DistributedStrategy):
    """One rank per stage of a pipeline plan (a | b); systems move downstream in buffers."""

    name = "pipeline"
    mode = "pipeline"

    def rank_plan(self, plan: Fused | Pipeline, num_devices: int) -> Pipeline:
        pipeline = Pipeline.of(plan)
        if num_devices != pipeline.num_ranks:
            raise ConfigError(
                f"the pipeline has {pipeline.num_ranks} stage rank(s) but devices={num_devices}; "
                f"the number of ranks must equal the number of pipeline stages"
            )
        return pipeline


class ReplicasStrategy(DistributedStrategy):
    """Copies of the plan on ``devices`` ranks, each over a shard of the data."""

    name = "replicas"
    mode = "replicas"

    def rank_plan(self, plan: Fused | Pipeline, num_devices: int) -> Pipeline:
        base = Pipeline.of(plan)
        if num_devices % base.num_ranks:
            raise ConfigError(
                f"replicas need devices to be a multiple of the plan's {base.num_ranks} "
                f"rank(s), got devices={num_devices}"
            )
        return base.replicate(num_devices // base.num_ranks)
