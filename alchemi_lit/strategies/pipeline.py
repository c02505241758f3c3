"""Distributed pipeline: one fused plan per rank, systems flowing along edges.

Each rank runs the same fused step loop as the single-device strategy on its own
batch.  Every ``sync_every`` steps it does its bookkeeping and one *exchange round*
with its neighbours, point to point (no global collective per step):

1. wait for this round's data message from every active upstream rank
   (systems land in an inbox; a ``done`` flag closes the edge),
2. wait for this round's credit from every downstream rank (free capacity),
3. route finished systems to downstream ranks -- each to the one with the most
   credit left (fan-out) -- within credit and buffer size; the rest wait
   (back-pressure: never dropped, never duplicated); send one data message per
   downstream edge, empty or not, so receives always complete,
4. send credit for the next round to every active upstream rank,
5. post the receives of the next round (``async_recv`` / ``fully_async``: they
   complete in the background while the rank steps).

Received systems are appended PENDING (their forces come from the next step's
forward) and enter this rank's plan at its entry stage.  A rank is done when its
upstreams are done, its sampler (source ranks) is exhausted and its batch, inbox
and outbox are empty; it says so in its last data message, so completion flows
down the pipeline.  A failing rank sends an abort message (its rank and the
error text) to its neighbours, which forward it, flush their sinks and raise
:class:`PipelineError` naming the failed rank.

Comm modes: ``sync`` posts receives at the start of each round and waits for its
sends; ``async_recv`` posts next round's receives at the end of the current one;
``fully_async`` additionally waits for a round's sends only one round later
(double-buffered sends, so a buffer is never reused while in flight).
"""

from __future__ import annotations

import signal
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
from loguru import logger

from ..callbacks.checkpoint import Checkpoint, callback_states, restore_callback_states
from ..data.sampler import SizeAwareSampler
from ..engine import checkpointing
from ..engine.checkpoint_file import CheckpointDamaged
from ..engine.fingerprint import refuse_mismatch
from ..engine.interrupt import InterruptGuard, RunInterrupted
from ..errors import AlchemiError, ConfigError
from ..hooks import HookDispatcher, StepContext
from ..models.neighbors import batch_pair_counts
from ..sinks import HostMemory, SinkChain, batch_from_state, batch_state
from ..stages import Fused, Pipeline
from ..state import EXIT_MODEL_ERROR, EXIT_QUARANTINED, Batch
from .buffers import (
    FLAG_ABORT,
    FLAG_DONE,
    H_CREDIT_ATOMS,
    H_CREDIT_SYSTEMS,
    H_FLAGS,
    H_KIND,
    H_MAGIC,
    INFO_OVERHEAD,
    KIND_CREDIT,
    KIND_DATA,
    MAGIC,
    BufferConfig,
    MessageLayout,
    check_info_fits,
    schema_digest,
    schema_of,
)
from .fused import FusedLoop

if TYPE_CHECKING:
    from ..simulator import Simulator

CommMode = Literal["sync", "async_recv", "fully_async"]
#: how an abort message says a rank was stopped by a signal (``interrupted by SIGTERM``)
INTERRUPTED = "interrupted by"
TAG_DATA, TAG_CREDIT = 1, 2


class PipelineError(AlchemiError, RuntimeError):
    """A rank of the pipeline failed; names the rank and its error."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(f"pipeline rank {rank} failed: {message}")
        self.rank = rank
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:  # picklable: handed from forked ranks to the parent
        return (type(self), (self.rank, self.message))


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


class _Edge:
    """Buffers and in-flight requests of one neighbour link, seen from this rank."""

    def __init__(self, peer: int, layout: MessageLayout, comm_device: torch.device, double: bool):
        self.peer = peer
        self.active = True
        n = 2 if double else 1
        self.data = [layout.new_buffer(comm_device, pin=True) for _ in range(n)]
        self.credit = [layout.new_buffer(comm_device, pin=True, payload=False) for _ in range(n)]
        self.recv_data = layout.new_buffer(comm_device, pin=True)
        self.recv_credit = layout.new_buffer(comm_device, pin=True, payload=False)
        self.pending_recv: Any = None
        self.pending_send: list[Any] = []
        self.slot = 0


class PipelineWorker:
    """One rank of a pipeline run (see module docstring)."""

    def __init__(
        self,
        sim: Simulator,
        pipeline: Pipeline,
        rank: int,
        sampler: SizeAwareSampler | None,
        buffer: BufferConfig,
        comm_mode: CommMode,
        device: torch.device,
        comm_device: torch.device,
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
        self.plan: Fused = pipeline.stages[rank]
        self.ups = pipeline.upstream(rank)
        self.downs = pipeline.downstream(rank)
        self.sampler = sampler
        self.buffer = buffer
        self.mode: CommMode = "sync" if synchronized else comm_mode
        self.sync_every = 1 if synchronized else sim.sync_every
        self.device, self.comm_device = device, comm_device
        self.debug = debug
        self.stats = RankStats(rank)
        self.round = 0
        self.inbox: list[Batch] = []
        self.outbox: Batch | None = None
        self.max_atoms, self.max_systems = capacity
        self.history = history or HistoryLayout.of(pipeline)
        self.abort_wait_s = min(float(timeout_s), 15.0)
        self.resume_dir = resume
        cps = [cb for cb in sim.callbacks if isinstance(cb, Checkpoint)]
        self.checkpoint = cps[0] if cps else None
        # checkpoints are taken at the same exchange rounds on every rank: a consistent cut
        self.checkpoint_rounds = (
            max(1, -(-self.checkpoint.every_n_steps // self.sync_every))
            if self.checkpoint is not None and self.checkpoint.every_n_steps
            else None
        )

    # ================================================================ setup
    def template(self) -> Batch:
        """A one-atom batch with every field any rank of the pipeline declares."""
        from ase import Atoms

        b = self.sim.prepare(Batch.from_atoms([Atoms("H", positions=[[0, 0, 0]])], validate=False))
        h = self.history
        for r, plan in sorted(self.pipeline.stages.items()):
            FusedLoop(
                self.sim.model,
                plan,
                HookDispatcher([]),
                self.sim.seed,
                history_offset=h.offsets[r],
                history_width=h.width,
            ).declare(b)
        b.ensure_field("nan_flags", "system", dtype=torch.int64, fill=0)
        return b

    def setup(self) -> None:
        template = self.template()
        self.schema = schema_of(template)
        self.layout = MessageLayout(self.schema, self.buffer)
        digest = schema_digest(self.schema, self.buffer)
        mine = {
            "digest": digest,
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
        double = self.mode == "fully_async"
        self.up_edges = {u: _Edge(u, self.layout, self.comm_device, double) for u in self.ups}
        self.down_edges = {d: _Edge(d, self.layout, self.comm_device, double) for d in self.downs}
        self.down_credit = {d: (0, 0) for d in self.downs}
        self.hooks = HookDispatcher(self.sim.callbacks)
        self.loop = FusedLoop(
            self.sim.model,
            self.plan,
            self.hooks,
            seed=self.sim.seed,
            forward=self.sim.forward_fn(),
            history_offset=self.history.offsets[self.rank],
            history_width=self.history.width,
            optimizer_columns=self.history.optimizer_columns,
        )
        self.is_sink = not self.downs
        self.stats.is_sink = self.is_sink
        sinks = self.sim.sinks if self.sim.sinks is not None else [HostMemory()]
        self.sinks = SinkChain(sinks if self.is_sink else [])

    # ================================================================ messaging
    def _post_recvs(self) -> None:
        for e in self.up_edges.values():
            if e.active and e.pending_recv is None:
                e.pending_recv = self._irecv(e, e.recv_data, TAG_DATA)
        if not self.done_sent:
            for e in self.down_edges.values():
                if e.active and e.pending_recv is None:
                    e.pending_recv = self._irecv(e, e.recv_credit, TAG_CREDIT)

    @staticmethod
    def _irecv(e: _Edge, buf: torch.Tensor, tag: int) -> Any:
        try:
            return dist.irecv(buf, src=e.peer, tag=tag)
        except Exception as exc:  # gloo reports a dead peer when posting, too
            raise PipelineError(e.peer, f"rank {e.peer} stopped responding ({exc})") from exc

    def _wait(self, e: _Edge, buf: torch.Tensor, kind: int) -> torch.Tensor:
        t0 = time.perf_counter()
        try:
            e.pending_recv.wait()
        except Exception as exc:
            raise PipelineError(
                e.peer, f"rank {e.peer} stopped responding ({type(exc).__name__}: {exc})"
            ) from exc
        finally:
            self.stats.wait_s += time.perf_counter() - t0
        e.pending_recv = None
        h = MessageLayout.header(buf).tolist()
        if h[H_MAGIC] != MAGIC:
            raise PipelineError(e.peer, "received a corrupt message (bad magic word)")
        if h[H_FLAGS] & FLAG_ABORT:
            rank, text = MessageLayout.read_error(buf)
            raise _Abort(rank, text, e.peer)
        if h[H_KIND] != kind:
            raise PipelineError(
                e.peer, f"protocol error: expected message kind {kind}, got {h[H_KIND]}"
            )
        return buf

    def _send(self, e: _Edge, buf: torch.Tensor, tag: int) -> None:
        if self.device.type == "cuda" and buf.device.type == "cpu":
            torch.cuda.current_stream(self.device).synchronize()  # staged copies complete
        try:
            e.pending_send.append(dist.isend(buf, dst=e.peer, tag=tag))
        except Exception as exc:  # gloo reports a dead peer when posting, too
            raise PipelineError(e.peer, f"rank {e.peer} stopped responding ({exc})") from exc

    def _flush_sends(self, e: _Edge, keep_last: bool) -> None:
        keep = 1 if keep_last else 0
        t0 = time.perf_counter()
        while len(e.pending_send) > keep:
            req = e.pending_send.pop(0)
            try:
                req.wait()  # a send completes when the peer receives: idle time, too
            except Exception as exc:
                raise PipelineError(e.peer, f"rank {e.peer} stopped responding ({exc})") from exc
        self.stats.wait_s += time.perf_counter() - t0

    # ================================================================ exchange round
    def exchange(self, batch: Batch) -> bool:
        """One round with all neighbours; returns True when this rank is done."""
        t0 = time.perf_counter()
        if self.mode == "sync":
            self._post_recvs()
        # 1. data from upstream
        for u, e in self.up_edges.items():
            if not e.active:
                continue
            buf = self._wait(e, e.recv_data, KIND_DATA)
            h = MessageLayout.header(buf).tolist()
            if h[3] > 0:  # H_SYSTEMS
                received = self.layout.unpack(buf, self.device)
                self.stats.systems_in += received.num_systems
                self._accept(received)
            if h[H_FLAGS] & FLAG_DONE:
                e.active = False
            if self.debug:
                logger.debug(
                    f"[rank {self.rank}] round {self.round}: got {h[3]} systems from rank {u}"
                    f"{' (done)' if not e.active else ''}"
                )
        self._track_peak(batch)
        # 2. credit from downstream
        for d, e in self.down_edges.items():
            buf = self._wait(e, e.recv_credit, KIND_CREDIT)
            h = MessageLayout.header(buf).tolist()
            self.down_credit[d] = (h[H_CREDIT_ATOMS], h[H_CREDIT_SYSTEMS])
        # 3. route and send data downstream
        done = self._ready_to_finish(batch)
        parts = self._route()
        done = done and (self.outbox is None or self.outbox.num_systems == 0)
        for d, e in self.down_edges.items():
            self._flush_sends(e, keep_last=self.mode == "fully_async")
            buf = e.data[e.slot]
            e.slot = (e.slot + 1) % len(e.data)
            part = parts.get(d)
            n_sys = part.num_systems if part is not None else 0
            n_atoms = part.num_atoms if part is not None else 0
            MessageLayout.write_header(
                buf, KIND_DATA, FLAG_DONE if done else 0, self.round, systems=n_sys, atoms=n_atoms
            )
            if part is not None:
                self.layout.pack(buf, part)
                self.stats.systems_out += n_sys
            self._send(e, buf, TAG_DATA)
            if self.debug:
                logger.debug(
                    f"[rank {self.rank}] round {self.round}: sent {n_sys} systems to rank {d}"
                    f"{' (done)' if done else ''}"
                )
        # 4. credit upstream
        active_ups = [e for e in self.up_edges.values() if e.active]
        shares = self._credit_shares(batch, active_ups)
        for e in active_ups:
            self._flush_sends(e, keep_last=self.mode == "fully_async")
            buf = e.credit[e.slot]
            e.slot = (e.slot + 1) % len(e.credit)
            share_a, share_s = shares[e.peer]
            MessageLayout.write_header(
                buf, KIND_CREDIT, 0, self.round, credit_atoms=share_a, credit_systems=share_s
            )
            self._send(e, buf, TAG_CREDIT)
        self.done_sent = done
        if self.debug:
            logger.debug(
                f"[rank {self.rank}] round {self.round}: batch={batch.num_systems} "
                f"inbox={sum(b.num_systems for b in self.inbox)} "
                f"outbox={self.outbox.num_systems if self.outbox is not None else 0} done={done}"
            )
        if self.mode == "sync" or done:
            for e in [*self.up_edges.values(), *self.down_edges.values()]:
                self._flush_sends(e, keep_last=False)
        # 5. next round's receives
        if self.mode != "sync" and not done:
            self._post_recvs()
        self.round += 1
        self.stats.rounds += 1
        self.stats.exchange_s.append(time.perf_counter() - t0)
        return done

    def _accept(self, received: Batch) -> None:
        """Inbox for systems to simulate; quarantined ones pass straight through."""
        dead = (received.exit_code == EXIT_QUARANTINED) | (received.exit_code == EXIT_MODEL_ERROR)
        if bool(dead.any()):
            through = received.select(dead.nonzero().flatten())
            if self.is_sink:
                # the pipeline-wide exit code, as for systems finishing here (_graduate)
                through.status = torch.full_like(through.status, self.plan.exit + self.loop.offset)
                self.sinks.write(through)
                self.stats.systems_out += through.num_systems
            else:
                self.outbox = (
                    through if self.outbox is None else Batch.concatenate([self.outbox, through])
                )
            received = received.select((~dead).nonzero().flatten())
        if received.num_systems:
            self.inbox.append(received)

    def _free_capacity(self, batch: Batch) -> tuple[int, int]:
        """Room for more systems: the budget less the batch, the inbox and the outbox.

        Counting the outbox (finished systems waiting for downstream credit) is what makes
        back-pressure reach the source: a rank whose downstream is slow stops asking for
        more instead of piling systems up (it would hold everything upstream otherwise).
        """
        held_atoms, held_systems = self._held(batch)
        free_atoms = self.max_atoms - held_atoms
        free_systems = self.max_systems - held_systems
        return max(0, free_atoms), max(0, min(free_systems, 1 << 40))

    def _credit_shares(self, batch: Batch, ups: list[_Edge]) -> dict[int, tuple[int, int]]:
        """Split this rank's free room among its active upstream ranks (fan-in).

        An even split when every share can still take the largest possible system (and
        one system); otherwise all of it to one upstream per round, in turn -- an even
        split of too little room would never let a large system through (livelock).
        """
        if not ups:
            return {}
        free_atoms, free_systems = self._free_capacity(batch)
        n = len(ups)
        largest = min(self.buffer.num_atoms, self.max_atoms)
        if n == 1 or (free_atoms // n >= largest and free_systems // n >= 1):
            return {e.peer: (free_atoms // n, free_systems // n) for e in ups}
        turn = ups[self.round % n].peer
        return {e.peer: (free_atoms, free_systems) if e.peer == turn else (0, 0) for e in ups}

    def _route(self) -> dict[int, Batch]:
        """Split the outbox among downstream ranks: most credit first, within buffers."""
        if self.outbox is None or self.outbox.num_systems == 0 or not self.downs:
            return {}
        credit = {d: list(self.down_credit[d]) for d in self.downs}
        room = {
            d: [
                self.buffer.num_atoms,
                self.buffer.num_systems,
                self.buffer.num_edges,
                self.buffer.info_bytes - INFO_OVERHEAD,
            ]
            for d in self.downs
        }
        ids = self.outbox.system_id.tolist()
        info = [  # raises, naming the fix, for a system no message could carry
            check_info_fits(self.outbox.info.get(sid), sid, self.buffer) if self.outbox.info else 0
            for sid in ids
        ]
        edges = (  # a message's summed neighbour pairs are bounded too (0: unbounded)
            batch_pair_counts(self.outbox, self.sim.model.cutoff + self.sim.model.neighbors.skin)
            if self.buffer.num_edges
            else [0] * self.outbox.num_systems
        )
        chosen: dict[int, list[int]] = {d: [] for d in self.downs}
        left: list[int] = []
        for row, n in enumerate(self.outbox.n_atoms.tolist()):
            e = edges[row]
            fits = [
                d
                for d in self.downs
                if credit[d][0] >= n
                and credit[d][1] >= 1
                and room[d][0] >= n
                and room[d][1] >= 1
                and (not self.buffer.num_edges or room[d][2] >= e)
                and room[d][3] >= info[row]
            ]
            if not fits or left:  # keep FIFO order: once one waits, later ones wait too
                left.append(row)
                continue
            d = max(fits, key=lambda k: (credit[k][0], -k))
            chosen[d].append(row)
            credit[d][0] -= n
            credit[d][1] -= 1
            room[d][0] -= n
            room[d][1] -= 1
            room[d][2] -= e
            room[d][3] -= info[row]
        parts = {d: self.outbox.select(rows) for d, rows in chosen.items() if rows}
        self.outbox = self.outbox.select(left) if left else None
        return parts

    def _ready_to_finish(self, batch: Batch) -> bool:
        return (
            all(not e.active for e in self.up_edges.values())
            and (self.sampler is None or self.sampler.exhausted)
            and batch.num_systems == 0
            and not self.inbox
        )

    # ================================================================ run
    def run(self) -> dict[str, Any]:
        self.setup()
        self.done_sent = False
        t_start = time.perf_counter()
        with InterruptGuard() as guard:
            return self._run(t_start, guard)

    def _run(self, t_start: float, guard: InterruptGuard) -> dict[str, Any]:
        """:meth:`run` inside its interrupt guard."""
        ctx: StepContext | None = None
        try:
            state = self._agree_on_checkpoint() if self.resume_dir else None
            if state is not None and state["done"]:
                self.done_sent = True  # finished before the checkpoint: nothing left to do
                self.sinks.load_state_dict(state["sinks"])
                self.sinks.close()
                self.stats.wall_s = time.perf_counter() - t_start
                return {"stats": self.stats.summary(), "sinks": self.sinks}
            batch = self._restore(state) if state is not None else self._initial_batch()
            self.loop.declare(batch)
            ctx = StepContext(batch=batch, stages=self.plan.stages, simulator=self.sim)
            ctx.state.update(
                has_fixed=bool(batch.fixed.any()),
                exit_code=self.plan.exit,
                rank=self.rank,
                graduated_systems=0,
            )
            if state is None:
                self.sinks.open({**self.sim.run_info(), "rank": self.rank})
            else:
                ctx.step = int(state["step"])
                self.loop.pending = bool(state["pending"])
            # initial credits so upstream ranks may send in round 0 (on resume: the
            # credits the checkpointed round had sent, computed from the same state)
            self._post_recvs()
            credit_round, self.round = self.round, max(self.round - 1, 0)
            shares = self._credit_shares(batch, [e for e in self.up_edges.values() if e.active])
            self.round = credit_round
            for e in [e for e in self.up_edges.values() if e.active]:
                buf = e.credit[e.slot]
                e.slot = (e.slot + 1) % len(e.credit)
                share_a, share_s = shares[e.peer]
                MessageLayout.write_header(
                    buf, KIND_CREDIT, 0, -1, credit_atoms=share_a, credit_systems=share_s
                )
                self._send(e, buf, TAG_CREDIT)
            if batch.num_systems and state is None:
                self.loop.compute(batch, ctx)
            self.hooks.run_start(ctx)
            if batch.num_systems and state is None:  # (systems the model failed on: out)
                self.loop.start(batch, self.loop.not_quarantined(batch), ctx)
            if state is not None:
                ctx.batch = self._admit(ctx)  # the checkpoint was taken before admission
            while True:
                t0 = time.perf_counter()
                if ctx.batch.num_systems:
                    for _ in range(self.sync_every):
                        self.loop.step(ctx.batch, ctx)
                        self.stats.steps += 1
                        if self.loop.evict:  # model-error quarantine: graduate them now
                            ctx.batch = self._graduate(ctx)
                            self.loop.evict = False
                            if not ctx.batch.num_systems:
                                break
                        if guard.received is not None:
                            break  # a signal: finish this round, then stop
                self.stats.busy_s += time.perf_counter() - t0
                ctx.batch = self._graduate(ctx)
                interrupted = guard.received is not None
                done = self.exchange(ctx.batch)
                path = self._maybe_checkpoint(ctx, done, interrupted)
                if done:
                    break
                if interrupted:
                    raise RunInterrupted(path, guard.received, where=self._saved_where())
                ctx.batch = self._admit(ctx)
            self.hooks.run_end(ctx)
        except RunInterrupted as exc:
            self.sinks.close()
            self._abort(self.rank, f"{INTERRUPTED} {signal.Signals(exc.signum).name}")
            raise
        except _Abort as exc:
            self.sinks.close()
            self._abort(exc.rank, exc.text, skip={exc.peer})
            raise PipelineError(exc.rank, exc.text) from None
        except PipelineError as exc:  # a peer stopped responding or sent garbage
            self.sinks.close()
            self._abort(exc.rank, exc.message, skip={exc.rank})
            raise
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            logger.error(f"[rank {self.rank}] failed: {text}\n{traceback.format_exc()}")
            self.sinks.close()
            self._abort(self.rank, text)
            raise PipelineError(self.rank, text) from exc
        self.sinks.close()
        self.stats.forward_calls = self.loop.num_forward_calls
        self.stats.wall_s = time.perf_counter() - t_start
        return {"stats": self.stats.summary(), "sinks": self.sinks}

    def _saved_where(self) -> str:
        """Where this rank's finished systems were saved (for an interrupt's message)."""
        if not self.is_sink:
            return ""
        return f"rank {self.rank} saved {self.stats.systems_out} finished systems"

    # ================================================================ checkpoints
    def _checkpoint_dir(self, base: Any) -> Path:
        return Path(base) / f"rank{self.rank}"

    def _maybe_checkpoint(self, ctx: StepContext, done: bool, interrupted: bool) -> Path | None:
        """Save this rank's part at the scheduled rounds (the same on every rank), when
        it finishes, and when a signal stops the run; returns the file written."""
        cp = self.checkpoint
        if cp is None:
            return None
        completed = self.round  # exchange() already advanced it: rounds 0..round-1 are done
        scheduled = self.checkpoint_rounds is not None and completed % self.checkpoint_rounds == 0
        if not (scheduled or done or (interrupted and cp.on_signal)):
            return None
        for e in [*self.up_edges.values(), *self.down_edges.values()]:
            self._flush_sends(e, keep_last=False)  # nothing of this round left in flight
        state = {
            "round": completed,
            "done": bool(done),
            "step": ctx.step,
            "fingerprint": self.sim.fingerprint,
            "plan": repr(self.pipeline),
            "batch": batch_state(ctx.batch),
            "inbox": [batch_state(b) for b in self.inbox],
            "outbox": None if self.outbox is None else batch_state(self.outbox),
            "sampler": None if self.sampler is None else self.sampler.state_dict(),
            "sinks": self.sinks.state_dict(),
            "callbacks": callback_states(self.hooks.callbacks),
            "up_active": {str(u): e.active for u, e in self.up_edges.items()},
            "pending": self.loop.pending,
        }
        directory = self._checkpoint_dir(cp.dirpath)
        if done:
            return checkpointing.save(directory, "done.ckpt", state, 1, "done.ckpt")
        name = f"round-{completed:09d}.ckpt"
        return checkpointing.save(directory, name, state, max(cp.keep, 3), "round-*.ckpt")

    def _intact_rounds(self, directory: Path) -> tuple[dict[int, Path], int | None]:
        """This rank's checkpoints that read back whole, by round, and the round of its
        ``done.ckpt`` (None without one); damaged files are named in a warning."""
        rounds: dict[int, Path] = {}
        for p in sorted(directory.glob("round-*.ckpt")):
            try:
                rounds[int(checkpointing.load(p)["round"])] = p
            except CheckpointDamaged as exc:
                logger.warning(f"[rank {self.rank}] {exc}; an older round will be used")
        done_round = None
        done_file = directory / "done.ckpt"
        if done_file.exists():
            try:
                done_round = int(checkpointing.load(done_file)["round"])
            except CheckpointDamaged as exc:
                logger.warning(f"[rank {self.rank}] {exc}; an older round will be used")
        return rounds, done_round

    def _agree_on_checkpoint(self) -> dict[str, Any] | None:
        """All ranks pick the newest round every rank has an intact checkpoint of (a rank
        that had finished counts for every later round) and load their part of it."""
        directory = self._checkpoint_dir(self.resume_dir)
        rounds, done_round = self._intact_rounds(directory)
        mine = {"rounds": sorted(rounds), "done": done_round}
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        newest = max(
            [max(e["rounds"] or [0]) for e in everyone] + [e["done"] or 0 for e in everyone]
        )
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

    def _restore(self, state: dict[str, Any]) -> Batch:
        self.round = int(state["round"])
        if self.sampler is not None:
            self.sampler.bind(self.sim.model.cutoff + self.sim.model.neighbors.skin)
            self.sampler.load_state_dict(state["sampler"])
        self.sinks.load_state_dict(state["sinks"])
        restore_callback_states(self.hooks.callbacks, state["callbacks"])
        for u, active in state["up_active"].items():
            self.up_edges[int(u)].active = bool(active)
        self.inbox = [batch_from_state(b).to(device=self.device) for b in state["inbox"]]
        self.outbox = (
            None
            if state["outbox"] is None
            else batch_from_state(state["outbox"]).to(device=self.device)
        )
        return batch_from_state(state["batch"]).to(device=self.device)

    def _abort(self, rank: int, text: str, skip: set[int] = frozenset()) -> None:
        """Tell every neighbour (but ``skip``: the sender of the abort, a dead peer) that the
        run is over because ``rank`` failed with ``text``.

        gloo completes a send only once the peer posts the matching receive, so a rank
        that simply exited would leave its neighbours with "connection closed" and no
        reason.  Instead: post receives for whatever the neighbours may still be sending
        us (so their pending sends complete and they reach their next exchange), send the
        abort on the channel each neighbour reads next (data downstream, credit upstream)
        and wait for those sends, at most ``abort_wait_s`` in all.  Upstream ranks that
        already said they are done read nothing more and are not waited for.
        """
        if not hasattr(self, "up_edges"):
            return  # failed before setup: nothing posted, nobody to tell
        sends = []
        self._drains: list[Any] = []
        for e, down in [(e, False) for e in self.up_edges.values()] + [
            (e, True) for e in self.down_edges.values()
        ]:
            if e.peer in skip or (not down and not e.active):
                continue
            try:
                # drain: the neighbour may have a message in flight to us (at most one per
                # direction and round; fully_async keeps one more)
                for _ in range(2):  # (keep the requests: a dropped one is cancelled)
                    drain = self.layout.new_buffer(self.comm_device, payload=not down)
                    tag = TAG_CREDIT if down else TAG_DATA
                    self._drains.append((drain, dist.irecv(drain, src=e.peer, tag=tag)))
                buf = self.layout.new_buffer(self.comm_device, payload=down)
                MessageLayout.write_header(
                    buf, KIND_DATA if down else KIND_CREDIT, FLAG_ABORT, self.round
                )
                MessageLayout.write_error(buf, rank, text)
                sends.append(
                    (e.peer, dist.isend(buf, dst=e.peer, tag=TAG_DATA if down else TAG_CREDIT))
                )
            except Exception:  # the peer may be gone already
                continue
        deadline = time.monotonic() + self.abort_wait_s
        for peer, req in sends:
            try:
                req.wait(timedelta(seconds=max(0.01, deadline - time.monotonic())))
            except Exception as exc:  # gone, or not listening: it will see our exit instead
                logger.debug(f"[rank {self.rank}] abort not delivered to rank {peer}: {exc}")

    # ================================================================ batch surgery
    def _initial_batch(self) -> Batch:
        if self.sampler is not None:
            self.sampler.bind(self.sim.model.cutoff + self.sim.model.neighbors.skin)
            max_atoms, max_systems, max_edges = self.sampler.budget()
            atoms, ids = self.sampler.take(max_atoms, max_systems, max_edges)
            if atoms:
                batch = self.sim.prepare(Batch.from_atoms(atoms, system_ids=ids, validate=False))
                self.stats.systems_in += batch.num_systems
                return batch
        return self.template().select(torch.zeros(0, dtype=torch.long))

    def _graduate(self, ctx: StepContext) -> Batch:
        batch = ctx.batch
        if batch.num_systems == 0:
            return batch
        graduates, remaining = self.loop.take_finished(batch, ctx)
        if graduates is None:
            return batch
        if self.is_sink:
            if self.sim.model.compute_stress and not self.loop.needs_stress:
                graduates.stress = self.sim.model.final_stress(graduates)
            # report the pipeline-wide exit code, as a fused run of all stages would
            graduates.status = graduates.status + self.loop.offset
            self.sinks.write(graduates)
            self.stats.systems_out += graduates.num_systems
        else:
            self.outbox = (
                graduates if self.outbox is None else Batch.concatenate([self.outbox, graduates])
            )
        return remaining

    def _admit(self, ctx: StepContext) -> Batch:
        """Append received systems and (source ranks) sampler refills as PENDING."""
        batch = ctx.batch
        fresh: list[Batch] = []
        for received in self.inbox:
            fresh.append(received)
        self.inbox = []
        if self.sampler is not None and not self.sampler.exhausted:
            out_atoms = self.outbox.num_atoms if self.outbox is not None else 0
            out_sys = self.outbox.num_systems if self.outbox is not None else 0
            free_atoms = (
                self.max_atoms - batch.num_atoms - sum(b.num_atoms for b in fresh) - out_atoms
            )
            free_sys = (
                self.max_systems - batch.num_systems - sum(b.num_systems for b in fresh) - out_sys
            )
            atoms, ids = self.sampler.take(max(0, free_atoms), max(0, free_sys), None)
            if atoms:
                new = self.sim.prepare(Batch.from_atoms(atoms, system_ids=ids, validate=False))
                self.loop.declare(new)
                new = _conform(new, batch if batch.num_systems else self.template())
                fresh.append(new)
                self.stats.systems_in += new.num_systems
        if not fresh:
            return batch
        merged = self.loop.append(batch, fresh)
        ctx.state["has_fixed"] = bool(merged.fixed.any())
        self._track_peak(merged)
        return merged

    def _held(self, batch: Batch) -> tuple[int, int]:
        """(atoms, systems) this rank holds: its batch, inbox and outbox."""
        atoms = batch.num_atoms + sum(b.num_atoms for b in self.inbox)
        systems = batch.num_systems + sum(b.num_systems for b in self.inbox)
        if self.outbox is not None:
            atoms, systems = atoms + self.outbox.num_atoms, systems + self.outbox.num_systems
        return atoms, systems

    def _track_peak(self, batch: Batch) -> None:
        atoms, systems = self._held(batch)
        self.stats.peak_atoms = max(self.stats.peak_atoms, atoms)
        self.stats.peak_systems = max(self.stats.peak_systems, systems)


class _Abort(Exception):
    """An abort message from neighbour ``peer``: rank ``rank`` failed with ``text``."""

    def __init__(self, rank: int, text: str, peer: int) -> None:
        super().__init__(text)
        self.rank, self.text, self.peer = rank, text, peer


def _conform(batch: Batch, template: Batch) -> Batch:
    """Give ``batch`` every field of ``template`` (zero-filled), so schemas match."""
    for name, t in template.atom.items():
        if name not in batch.atom:
            batch.ensure_field(name, "atom", tuple(t.shape[1:]), t.dtype, 0)
    for name, t in template.system.items():
        if name not in batch.system:
            batch.ensure_field(name, "system", tuple(t.shape[1:]), t.dtype, 0)
    return batch
