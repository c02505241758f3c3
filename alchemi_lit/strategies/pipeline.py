"""Distributed pipeline: one fused plan per rank, systems flowing along edges.

Each rank runs the engine's :class:`~alchemi_lit.engine.run_loop.RunLoop` -- the same
loop as one device -- on its own batch.  It differs only in its components: systems
come from an inbox of received ones (plus the sampler on a source rank,
:class:`~.rank_io.RankIO`), finished ones go to an outbox for the next rank (or to the
sinks on the last rank), each bookkeeping ends with one exchange round with the
neighbours (:class:`~.exchange.Exchange`), and checkpoints are taken at the same
rounds on every rank (:class:`RoundCheckpoints`).  This module wires them and keeps
the protocol's failure handling: a failing rank sends an abort message (its rank and
the error text) to its neighbours, which forward it, flush their sinks and raise
:class:`PipelineError` naming the failed rank.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from loguru import logger

from ..callbacks.checkpoint import Checkpoint
from ..core.errors import ConfigError
from ..core.state import Batch
from ..data.sampler import SizeAwareSampler
from ..engine import checkpointing
from ..engine.checkpoint_file import CheckpointDamaged
from ..engine.feeds import SamplerFeed, SinkDelivery, empty_batch
from ..engine.fingerprint import refuse_mismatch
from ..engine.hooks import HookDispatcher
from ..engine.interrupt import RunInterrupted
from ..engine.run_loop import RunLoop
from ..engine.step import FusedLoop
from ..integrators.stages import Fused, Pipeline
from ..sinks import HostMemory, SinkChain
from .buffers import BufferConfig, MessageLayout, schema_digest, schema_of
from .exchange import Abort, CommMode, Exchange, PipelineError
from .rank_io import Outbox, RankIO
from .units import carriers, group_unit

if TYPE_CHECKING:
    from ..simulator import Simulator

#: how an abort message says a rank was stopped by a signal (``interrupted by SIGTERM``)
INTERRUPTED = "interrupted by"
#: steps between exchange rounds with ``sync_every="auto"``
ROUND_STEPS = 10

__all__ = ["INTERRUPTED", "CommMode", "HistoryLayout", "PipelineError", "PipelineWorker"]


@dataclass
class RankStats:
    rank: int
    is_sink: bool = False
    systems_in: int = 0
    systems_out: int = 0
    steps: int = 0
    forward_calls: int = 0
    rounds: int = 0
    busy_s: float = 0.0
    wait_s: float = 0.0
    wall_s: float = 0.0
    peak_atoms: int = 0  # most atoms held at once (batch + inbox + outbox)
    peak_systems: int = 0
    exchange_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        ex = self.exchange_s
        return {
            "rank": self.rank,
            "is_sink": self.is_sink,
            "systems_in": self.systems_in,
            "systems_out": self.systems_out,
            "steps": self.steps,
            "forward_calls": self.forward_calls,
            "rounds": self.rounds,
            "wall_s": self.wall_s,
            "peak_atoms": self.peak_atoms,
            "peak_systems": self.peak_systems,
            "idle_fraction": self.wait_s / self.wall_s if self.wall_s else 0.0,
            "mean_exchange_ms": 1e3 * sum(ex) / len(ex) if ex else 0.0,
        }


def global_history_offsets(pipeline: Pipeline) -> dict[int, int]:
    """Column offset of each rank's stages in the pipeline-wide stage history."""
    offsets, total = {}, 0
    for r in sorted(pipeline.stages):
        offsets[r] = total
        total += len(pipeline.stages[r])
    return offsets


@dataclass(frozen=True)
class HistoryLayout:
    """Where each rank's stages sit in the ``stage_steps``/``stage_exit`` history.

    By default every rank of the pipeline gets its own columns.  Replicas share the
    columns of their base plan (rank ``r`` uses those of rank ``r % period``), so a
    replicated run reports the same per-system history and exit status as one process.
    """

    offsets: dict[int, int]
    width: int
    optimizer_columns: list[int]

    @classmethod
    def of(cls, pipeline: Pipeline, period: int | None = None) -> HistoryLayout:
        p = pipeline.num_ranks if period is None else int(period)
        base = Pipeline({r: pipeline.stages[r] for r in range(p)})
        offsets = global_history_offsets(base)
        return cls(
            offsets={r: offsets[r % p] for r in pipeline.stages},
            width=sum(len(plan) for plan in base.stages.values()),
            optimizer_columns=base.optimizer_columns(),
        )


class RoundCheckpoints:
    """A rank's checkpoints: at the same exchange rounds on every rank (a consistent
    cut), when the rank finishes (``done.ckpt``) and when a signal stops it.

    Rounds come from ``every`` (every ``ceil(n / round_steps)`` rounds) and from
    ``every_seconds``: a rank whose timer runs out asks for a round far enough ahead
    that the request, carried in every message header, reaches every rank first.
    """

    def __init__(
        self, cp: Checkpoint, exchange: Exchange, folder: Path, sync_every: int, ranks: int
    ):
        self.cp, self.exchange, self.folder = cp, exchange, folder
        self.every_rounds = -(-cp.every_steps // sync_every) if cp.every_steps else None
        self.margin = 2 * ranks + 2  # rounds a request needs to reach every rank
        self.last_time = time.monotonic()

    def due(self, step: int, done: bool, interrupted: bool) -> bool:
        completed = self.exchange.round  # rounds 0 .. round - 1 are done
        timer = self.cp.every_seconds
        timed_out = bool(timer) and time.monotonic() - self.last_time >= timer
        if timed_out and self.exchange.checkpoint_round < completed:  # none pending: ask
            self.exchange.checkpoint_round = completed + self.margin
        return (
            done
            or (interrupted and self.cp.on_signal)
            or (self.every_rounds is not None and completed % self.every_rounds == 0)
            or self.exchange.checkpoint_round == completed
        )

    def pending(self, step: int) -> bool:
        return False  # (only rounds are checkpointed: see due)

    def save(self, state: dict[str, Any], step: int, done: bool) -> Path:
        self.exchange.flush_all()  # nothing of this round left in flight
        completed = self.exchange.round
        state = {**state, "round": completed, "done": done}
        if done:
            path = checkpointing.save(self.folder, "done.ckpt", state, 1, "done.ckpt")
        else:
            name, keep = f"round-{completed:09d}.ckpt", max(self.cp.keep, 3)
            path = checkpointing.save(self.folder, name, state, keep, "round-*.ckpt")
        self.last_time = time.monotonic()
        return path


class PipelineWorker:
    """One rank of a pipeline run (see module docstring)."""

    #: ASE constraint class names the run's input carries (every rank's wire schema)
    constraints: frozenset[str] = frozenset()

    def __init__(
        self,
        sim: Simulator,
        pipeline: Pipeline,
        rank: int,
        sampler: SizeAwareSampler | None,
        buffer: BufferConfig,
        comm_mode: CommMode,
        device: Any,
        comm_device: Any,
        capacity: tuple[int, int],
        debug: bool = False,
        synchronized: bool = False,
        history: HistoryLayout | None = None,
        timeout_s: float = 60.0,
        resume: str | None = None,
    ) -> None:
        """``capacity`` = (max_atoms, max_systems) of this rank's batch (the sampler's
        budgets: every rank of a pipeline holds at most that much); ``history``: the
        stage-history columns of each rank (default: one set per rank); ``timeout_s``: how
        long a failing rank waits for its neighbours to take its abort message."""
        self.sim, self.pipeline, self.rank = sim, pipeline, rank
        self.context: dict[str, Any] = {}  # more of the callbacks' run context (totals)
        self.plan: Fused = pipeline.stages[rank]
        self.sampler, self.buffer, self.capacity = sampler, buffer, capacity
        self.mode: CommMode = "sync" if synchronized else comm_mode
        self.sync_every = 1 if synchronized else sim.sync_every
        # exchange rounds: every sync_every steps, or every ROUND_STEPS with "auto"
        self.round_steps = ROUND_STEPS if self.sync_every == "auto" else int(self.sync_every)
        self.devices = (device, comm_device)
        self.debug = debug
        self.stats = RankStats(rank)
        self.history = history or HistoryLayout.of(pipeline)
        self.abort_wait_s = min(float(timeout_s), 15.0)
        self.resume_dir = resume
        cps = [cb for cb in sim.callbacks if isinstance(cb, Checkpoint)]
        self.checkpoint = cps[0] if cps else None
        self.exchange: Exchange | None = None

    # ================================================================ setup
    def _loop_of(self, r: int, hooks: HookDispatcher) -> FusedLoop:
        h = self.history
        return FusedLoop(
            self.sim.model, self.pipeline.stages[r], hooks, seed=self.sim.seed,
            forward=self.sim.forward_fn(), history_offset=h.offsets[r], history_width=h.width,
            optimizer_columns=h.optimizer_columns, stress=self.sim.stress,
            carried=carriers(self.pipeline, r),  # (the other ranks' bands and groups)
        )  # fmt: skip

    def empty(self) -> Batch:
        """A batch of no systems with every field any rank of the pipeline declares."""
        loops = [self._loop_of(r, HookDispatcher([])) for r in sorted(self.pipeline.stages)]
        return empty_batch(self.sim, loops, self.constraints)

    def setup(self) -> None:
        """Agree with every rank on the wire format, then build this rank's loop."""
        self.layout = MessageLayout(schema_of(self.empty()), self.buffer)
        mine = {
            "digest": schema_digest(self.layout.schema, self.buffer),
            "plan": repr(self.pipeline),
            "buffer": repr(self.buffer),
            "model": type(self.sim.model).__name__,
        }
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        for r, other in enumerate(everyone):
            for key in ("plan", "buffer", "digest", "model"):
                if other[key] != everyone[0][key]:
                    raise ConfigError(
                        f"pipeline ranks disagree at setup: rank 0 has {key}={everyone[0][key]!r} "
                        f"but rank {r} has {other[key]!r}; launch every rank with the same "
                        f"configuration (same plan, BufferConfig, model and field schema)"
                    )
        self.hooks = HookDispatcher(self.sim.callbacks)
        self.loop = self._loop_of(self.rank, self.hooks)
        downs = self.pipeline.downstream(self.rank)
        self.is_sink = self.stats.is_sink = not downs
        sinks = self.sim.sinks if self.sim.sinks is not None else [HostMemory()]
        self.sinks = SinkChain(sinks if self.is_sink else [])
        delivery: SinkDelivery | Outbox = (
            SinkDelivery(self.sinks, self.sim, self.loop, self.loop.offset, {"rank": self.rank})
            if self.is_sink
            else Outbox()
        )
        feed = SamplerFeed(self.sim, self.loop, self.sampler) if self.sampler is not None else None
        self.io = RankIO(
            self.sim, self.loop, feed, delivery, downs, self.buffer, self.capacity, self.stats,
            self.empty, group_unit(self.pipeline),
        )  # fmt: skip
        self.exchange = Exchange(
            (self.rank, self.pipeline.upstream(self.rank), downs), self.layout, self.mode,
            self.devices, self.io, self.stats, self.abort_wait_s, self.debug,
        )  # fmt: skip
        policy = None
        if self.checkpoint is not None:
            folder = Path(self.checkpoint.dirpath) / f"rank{self.rank}"
            policy = RoundCheckpoints(
                self.checkpoint, self.exchange, folder, self.round_steps, self.pipeline.num_ranks
            )
        transport = _RoundTransport(self.exchange, self.round_steps)
        self.run_loop = RunLoop(
            self.loop, self.hooks, self.io, delivery, transport, policy, self.sync_every,
            self.sim, context={"rank": self.rank, **self.context},
        )  # fmt: skip

    # ================================================================ run
    def run(self) -> dict[str, Any]:
        self.setup()
        t_start = time.perf_counter()
        try:
            state = self._agree_on_checkpoint() if self.resume_dir else None
            if state is not None and state["done"]:  # finished before: nothing left to do
                self.run_loop.delivery.load_state_dict(state["delivery"])
                self.sinks.close()
            else:
                self.run_loop.run(state)
        except Abort as exc:
            self.sinks.close()
            self.exchange.abort(exc.rank, exc.text, skip={exc.peer})
            raise PipelineError(exc.rank, exc.text) from None
        except PipelineError as exc:  # a peer stopped responding or sent garbage
            self.sinks.close()
            self.exchange.abort(exc.rank, exc.message, skip={exc.rank})
            raise
        except RunInterrupted as exc:
            self.exchange.abort(self.rank, f"{INTERRUPTED} {signal.Signals(exc.signum).name}")
            raise
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            import traceback

            logger.error(f"[rank {self.rank}] failed: {text}\n{traceback.format_exc()}")
            self.sinks.close()
            self.exchange.abort(self.rank, text)
            raise PipelineError(self.rank, text) from exc
        loop_stats = self.run_loop.stats
        self.stats.steps, self.stats.busy_s = loop_stats.steps, loop_stats.busy_s
        if self.is_sink:
            self.stats.systems_out = self.run_loop.delivery.delivered
        self.stats.forward_calls = self.loop.num_forward_calls
        self.stats.wall_s = time.perf_counter() - t_start
        return {"stats": self.stats.summary(), "sinks": self.sinks}

    # ================================================================ resume
    def _intact_rounds(self, directory: Path) -> tuple[dict[int, Path], int | None]:
        """This rank's checkpoints that read back whole, by round, and the round of its
        ``done.ckpt`` (None without one); damaged files are named in a warning."""
        rounds: dict[int, Path] = {}
        done_round = None
        for p in [*sorted(directory.glob("round-*.ckpt")), directory / "done.ckpt"]:
            if not p.exists():
                continue
            try:
                state = checkpointing.load(p)
            except CheckpointDamaged as exc:
                logger.warning(f"[rank {self.rank}] {exc}; an older round will be used")
                continue
            if p.name == "done.ckpt":
                done_round = int(state["round"])
            else:
                rounds[int(state["round"])] = p
        return rounds, done_round

    def _agree_on_checkpoint(self) -> dict[str, Any] | None:
        """All ranks pick the newest round every rank has an intact checkpoint of (a rank
        that had finished counts for every later round) and load their part of it."""
        directory = Path(self.resume_dir) / f"rank{self.rank}"
        rounds, done_round = self._intact_rounds(directory)
        mine = {"rounds": sorted(rounds), "done": done_round}
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        newest = max(max([*e["rounds"], e["done"] or 0, 0]) for e in everyone)
        candidates = set(range(0, 1 + newest))
        for e in everyone:
            ok = set(e["rounds"]) | (
                {r for r in candidates if r >= e["done"]} if e["done"] is not None else set()
            )
            candidates &= ok
        if not candidates:
            raise ConfigError(
                f"cannot resume from {self.resume_dir!r}: the ranks have no intact checkpoint of "
                f"a common exchange round (rank {self.rank} has rounds {sorted(rounds)}); start "
                f"afresh"
            )
        chosen = max(candidates)
        done = done_round is not None and chosen >= done_round
        path = directory / "done.ckpt" if done else rounds[chosen]
        state = checkpointing.load(path)
        refuse_mismatch(state.get("fingerprint"), self.sim.fingerprint, f"checkpoint {str(path)!r}")
        logger.info(f"[rank {self.rank}] resuming from {path} (round {chosen})")
        return state


class _RoundTransport:
    """The run loop's transport on a rank: an exchange round every ``round_steps``
    steps (and whenever the rank has nothing to step); with ``sync_every="auto"`` the
    rank books in between as soon as it pays, graduating into its outbox."""

    def __init__(self, exchange: Exchange, round_steps: int) -> None:
        self.exchange, self.round_steps = exchange, round_steps

    def start(self, batch: Batch, resumed: bool) -> None:
        self.exchange.start(batch, resumed)

    def steps_left(self, step: int) -> int | None:
        return self.round_steps - step % self.round_steps

    def round_due(self, step: int, batch: Batch) -> bool:
        return step % self.round_steps == 0 or batch.num_systems == 0

    def round(self, batch: Batch) -> bool:
        return self.exchange.round_trip(batch)

    def state_dict(self) -> dict[str, Any]:
        return self.exchange.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.exchange.load_state_dict(state)
