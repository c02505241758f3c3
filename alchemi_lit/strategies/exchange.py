"""A pipeline rank's exchange with its neighbours: one round per bookkeeping.

This is the run loop's transport on a pipeline rank (see
:class:`~alchemi_lit.engine.run_loop.Transport`).  A round, point to point (no global
collective per step):

1. wait for this round's data message from every active upstream rank (systems land
   in the inbox; a ``done`` flag closes the edge),
2. wait for this round's credit from every downstream rank (free capacity),
3. route finished systems to downstream ranks (:func:`~.rank_io.route`) within credit
   and buffer size; the rest wait (back-pressure: never dropped, never duplicated);
   send one data message per downstream edge, empty or not, so receives complete,
4. send credit for the next round to every active upstream rank,
5. post the receives of the next round (``async_recv`` / ``fully_async``: they
   complete in the background while the rank steps).

Comm modes: ``sync`` posts receives at the start of each round and waits for its
sends; ``async_recv`` posts next round's receives at the end of the current one;
``fully_async`` also waits for a round's sends only one round later (double-buffered
sends, so a buffer is never reused while in flight).  Every header also carries the
round of the next time-scheduled checkpoint (``Checkpoint(every_seconds=...)``, timed
by rank 0), so every rank hears of it in time and all checkpoint the same round.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist
from loguru import logger

from ..core.errors import AlchemiError
from ..core.state import Batch
from .buffers import (
    FLAG_ABORT,
    FLAG_DONE,
    H_CHECKPOINT,
    H_CREDIT_ATOMS,
    H_CREDIT_SYSTEMS,
    H_FLAGS,
    H_KIND,
    H_MAGIC,
    H_SYSTEMS,
    KIND_CREDIT,
    KIND_DATA,
    MAGIC,
    MessageLayout,
)

CommMode = Literal["sync", "async_recv", "fully_async"]
TAG_DATA, TAG_CREDIT = 1, 2


class PipelineError(AlchemiError, RuntimeError):
    """A rank of the pipeline failed; names the rank and its error."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(f"pipeline rank {rank} failed: {message}")
        self.rank = rank
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:  # picklable: handed from forked ranks to the parent
        return (type(self), (self.rank, self.message))


class Abort(Exception):
    """An abort message from neighbour ``peer``: rank ``rank`` failed with ``text``."""

    def __init__(self, rank: int, text: str, peer: int) -> None:
        super().__init__(text)
        self.rank, self.text, self.peer = rank, text, peer


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

    def next_buffer(self, kind: int) -> torch.Tensor:
        """The send buffer to fill now (two alternate in fully_async mode)."""
        bufs = self.data if kind == KIND_DATA else self.credit
        buf = bufs[self.slot % len(bufs)]
        self.slot += 1
        return buf


class Exchange:
    """The message rounds of one rank (see the module docstring).

    ``ranks``: the rank, its upstream and downstream ranks; ``rank_io``: the rank's
    inbox/outbox (:class:`~.rank_io.RankIO`), which says what to send and takes what
    arrives; ``stats``: the rank's :class:`~.pipeline.RankStats`.
    """

    def __init__(
        self,
        ranks: tuple[int, list[int], list[int]],
        layout: MessageLayout,
        mode: CommMode,
        devices: tuple[torch.device, torch.device],
        rank_io: Any,
        stats: Any,
        abort_wait_s: float,
        debug: bool = False,
    ) -> None:
        self.rank, ups, downs = ranks
        self.layout, self.mode, self.io, self.stats = layout, mode, rank_io, stats
        self.device, self.comm_device = devices
        self.abort_wait_s, self.debug = abort_wait_s, debug
        double = mode == "fully_async"
        self.up_edges = {u: _Edge(u, layout, self.comm_device, double) for u in ups}
        self.down_edges = {d: _Edge(d, layout, self.comm_device, double) for d in downs}
        self.round = 0
        self.done_sent = False
        self.checkpoint_round = 0  # the next time-scheduled checkpoint round (0: none)

    # ------------------------------------------------------------------ transport
    def start(self, batch: Batch, resumed: bool) -> None:
        """Post the first receives and send the first credits, so upstream ranks may
        send in round 0 (on resume: the credits the checkpointed round had sent,
        computed from the same state)."""
        self._post_recvs()
        now, self.round = self.round, max(self.round - 1, 0)
        active = [e for e in self.up_edges.values() if e.active]
        shares = self.io.credit_shares(batch, [e.peer for e in active], self.round)
        self.round = now
        for e in active:
            self._send_credit(e, shares[e.peer], round_=-1)

    def round_trip(self, batch: Batch) -> bool:
        """One exchange round (see the module docstring); True when this rank is done."""
        t0 = time.perf_counter()
        if self.mode == "sync":
            self._post_recvs()
        for u, e in self.up_edges.items():  # 1. data from upstream
            if not e.active:
                continue
            buf = self._wait(e, e.recv_data, KIND_DATA)
            h = MessageLayout.header(buf).tolist()
            if h[H_SYSTEMS] > 0:
                self.io.accept(self.layout.unpack(buf, self.device))
            if h[H_FLAGS] & FLAG_DONE:
                e.active = False
            self._log(
                f"got {h[H_SYSTEMS]} systems from rank {u}{' (done)' if not e.active else ''}"
            )
        self.io.track_peak(batch)
        credit = {}
        for d, e in self.down_edges.items():  # 2. credit from downstream
            h = MessageLayout.header(self._wait(e, e.recv_credit, KIND_CREDIT)).tolist()
            credit[d] = (h[H_CREDIT_ATOMS], h[H_CREDIT_SYSTEMS])
        ups_done = all(not e.active for e in self.up_edges.values())
        parts = self.io.route(credit)  # 3. route and send downstream
        done = self.io.finished(batch, ups_done)
        for d, e in self.down_edges.items():
            self._flush_sends(e, keep_last=self.mode == "fully_async")
            buf = e.next_buffer(KIND_DATA)
            part = parts.get(d)
            n_sys, n_atoms = (part.num_systems, part.num_atoms) if part is not None else (0, 0)
            MessageLayout.write_header(
                buf, KIND_DATA, FLAG_DONE if done else 0, self.round,
                systems=n_sys, atoms=n_atoms, checkpoint=self.checkpoint_round,
            )  # fmt: skip
            if part is not None:
                self.layout.pack(buf, part)
                self.stats.systems_out += n_sys
            self._send(e, buf, TAG_DATA)
            self._log(f"sent {n_sys} systems to rank {d}{' (done)' if done else ''}")
        active = [e for e in self.up_edges.values() if e.active]  # 4. credit upstream
        shares = self.io.credit_shares(batch, [e.peer for e in active], self.round)
        for e in active:
            self._flush_sends(e, keep_last=self.mode == "fully_async")
            self._send_credit(e, shares[e.peer], self.round)
        self.done_sent = done
        if self.mode == "sync" or done:
            self.flush_all()
        if self.mode != "sync" and not done:  # 5. next round's receives
            self._post_recvs()
        self.round += 1
        self.stats.rounds += 1
        self.stats.exchange_s.append(time.perf_counter() - t0)
        return done

    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "up_active": {str(u): e.active for u, e in self.up_edges.items()},
            "checkpoint_round": self.checkpoint_round,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self.checkpoint_round = int(state.get("checkpoint_round", 0))
        for u, active in state["up_active"].items():
            self.up_edges[int(u)].active = bool(active)

    # ------------------------------------------------------------------ messaging
    def _send_credit(self, e: _Edge, share: tuple[int, int], round_: int) -> None:
        buf = e.next_buffer(KIND_CREDIT)
        MessageLayout.write_header(
            buf, KIND_CREDIT, 0, round_,
            credit_atoms=share[0], credit_systems=share[1], checkpoint=self.checkpoint_round,
        )  # fmt: skip
        self._send(e, buf, TAG_CREDIT)

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
            raise Abort(rank, text, e.peer)
        if h[H_KIND] != kind:
            raise PipelineError(
                e.peer, f"protocol error: expected message kind {kind}, got {h[H_KIND]}"
            )
        self.checkpoint_round = max(self.checkpoint_round, int(h[H_CHECKPOINT]))
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

    def flush_all(self) -> None:
        """Wait for every send in flight (nothing of this round left in transit)."""
        for e in [*self.up_edges.values(), *self.down_edges.values()]:
            self._flush_sends(e, keep_last=False)

    def _log(self, text: str) -> None:
        if self.debug:
            logger.debug(f"[rank {self.rank}] round {self.round}: {text}")

    # ------------------------------------------------------------------ failure
    def abort(self, rank: int, text: str, skip: set[int] = frozenset()) -> None:
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
