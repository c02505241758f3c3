"""Fixed-size transfer buffers: every field of a system, each in its own dtype.

A message is one flat ``uint8`` tensor: a header of int64 words, an error-text area,
then one region per batch field, sized for ``BufferConfig`` capacity.  Fields are
copied as raw bytes, so float64 stays float64 and integers stay integers bit for bit
(the seed system we replace only copied float32 fields: atomic numbers arrived as
zeros and float64 was truncated).  The same layout is derived on every rank from
the pipeline's field schema, and checked at setup.

Why one byte buffer per message rather than one tensor per field: NCCL and gloo
need fixed-size receives, and one send per edge and exchange pays a message's fixed
latency once, whatever the number of fields.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass
from typing import Any

import torch

from ..core.errors import ConfigError
from ..core.state import Batch

# header words (int64)
H_MAGIC, H_KIND, H_FLAGS, H_SYSTEMS, H_ATOMS, H_ROUND, H_ERR_RANK, H_ERR_LEN = range(8)
H_CREDIT_ATOMS, H_CREDIT_SYSTEMS, H_INFO_LEN = 8, 9, 10
H_CHECKPOINT = 11  # the round of the next time-scheduled checkpoint (0: none)
HEADER_WORDS = 16
ERROR_BYTES = 2048
MAGIC = 0x616C6368656D69  # "alchemi"
KIND_DATA, KIND_CREDIT = 1, 2
FLAG_DONE, FLAG_ABORT = 1, 2

_ALIGN = 16


@dataclass(frozen=True)
class BufferConfig:
    """Capacity of one transfer buffer (one per pipeline edge and direction).

    ``num_systems`` and ``num_atoms`` bound what one message carries; systems that do
    not fit wait upstream for the next exchange (back-pressure), never dropped.
    ``num_edges`` (0: unbounded) bounds the summed neighbour pairs of a message's
    systems, for models with a fixed edge budget; edges themselves are not sent --
    the receiving rank rebuilds its neighbour lists.  ``info_bytes`` is the room for
    the systems' ``info`` (``ase.Atoms.info`` of the input, error texts of quarantined
    systems), pickled; a message carries fewer systems when their info would not fit.
    """

    num_systems: int = 64
    num_atoms: int = 4096
    num_edges: int = 0
    info_bytes: int = 65536

    def __post_init__(self) -> None:
        for name, minimum in (
            ("num_systems", 1),
            ("num_atoms", 1),
            ("num_edges", 0),
            ("info_bytes", 0),
        ):
            value = getattr(self, name)
            try:
                ok = not isinstance(value, bool) and int(value) == value and value >= minimum
            except (TypeError, ValueError):
                ok = False
            if not ok:
                what = {
                    "num_edges": "0: unbounded",
                    "info_bytes": "room for the systems' info in one message",
                }.get(name, "capacity of one transfer message")
                raise ConfigError(
                    f"BufferConfig: {name} must be an integer >= {minimum}, got {value!r} ({what})"
                )


@dataclass(frozen=True)
class FieldSpec:
    name: str
    kind: str  # "atom" | "system"
    dtype: torch.dtype
    tail: tuple[int, ...]

    @property
    def item_bytes(self) -> int:
        n = 1
        for t in self.tail:
            n *= t
        return n * torch.empty((), dtype=self.dtype).element_size()


def schema_of(batch: Batch) -> list[FieldSpec]:
    """Sorted field specs of a batch (the pipeline's wire format)."""
    specs = [FieldSpec(k, "atom", v.dtype, tuple(v.shape[1:])) for k, v in batch.atom.items()]
    specs += [FieldSpec(k, "system", v.dtype, tuple(v.shape[1:])) for k, v in batch.system.items()]
    return sorted(specs, key=lambda s: (s.kind, s.name))


def schema_digest(schema: list[FieldSpec], config: BufferConfig) -> str:
    text = repr([(s.name, s.kind, str(s.dtype), s.tail) for s in schema]) + repr(config)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class MessageLayout:
    """Byte offsets of header, error text and every field region."""

    def __init__(self, schema: list[FieldSpec], config: BufferConfig) -> None:
        self.schema = [s for s in schema if s.name != "system_idx"]  # rebuilt on arrival
        self.config = config
        offset = _align(HEADER_WORDS * 8 + ERROR_BYTES)
        self.offsets: dict[str, int] = {}
        for s in self.schema:
            self.offsets[s.name] = offset
            cap = config.num_atoms if s.kind == "atom" else config.num_systems
            offset = _align(offset + cap * s.item_bytes)
        self.info_offset = offset
        self.nbytes = _align(offset + config.info_bytes)
        self.header_bytes = _align(HEADER_WORDS * 8 + ERROR_BYTES)

    def new_buffer(
        self, device: torch.device, pin: bool = False, payload: bool = True
    ) -> torch.Tensor:
        n = self.nbytes if payload else self.header_bytes
        buf = torch.zeros(n, dtype=torch.uint8, device=device)
        return (
            buf.pin_memory() if pin and device.type == "cpu" and torch.cuda.is_available() else buf
        )

    # ------------------------------------------------------------------ header
    @staticmethod
    def header(buf: torch.Tensor) -> torch.Tensor:
        return buf[: HEADER_WORDS * 8].view(torch.int64)

    @staticmethod
    def write_header(buf: torch.Tensor, kind: int, flags: int, rnd: int, **words: int) -> None:
        h = MessageLayout.header(buf)
        h.zero_()
        h[H_MAGIC], h[H_KIND], h[H_FLAGS], h[H_ROUND] = MAGIC, kind, flags, rnd
        for key, value in words.items():
            h[
                {
                    "systems": H_SYSTEMS,
                    "atoms": H_ATOMS,
                    "credit_atoms": H_CREDIT_ATOMS,
                    "credit_systems": H_CREDIT_SYSTEMS,
                    "err_rank": H_ERR_RANK,
                    "checkpoint": H_CHECKPOINT,
                }[key]
            ] = int(value)

    @staticmethod
    def write_error(buf: torch.Tensor, rank: int, text: str) -> None:
        data = text.encode("utf-8", "replace")[:ERROR_BYTES]
        h = MessageLayout.header(buf)
        h[H_ERR_RANK], h[H_ERR_LEN] = rank, len(data)
        area = buf[HEADER_WORDS * 8 : HEADER_WORDS * 8 + ERROR_BYTES]
        area.zero_()
        if data:
            area[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)

    @staticmethod
    def read_error(buf: torch.Tensor) -> tuple[int, str]:
        h = MessageLayout.header(buf).tolist()
        n = int(h[H_ERR_LEN])
        raw = bytes(buf[HEADER_WORDS * 8 : HEADER_WORDS * 8 + n].cpu().tolist())
        return int(h[H_ERR_RANK]), raw.decode("utf-8", "replace")

    # ------------------------------------------------------------------ payload
    def pack(self, buf: torch.Tensor, batch: Batch) -> None:
        """Copy every field of ``batch`` (which must fit the capacity) into ``buf``."""
        if batch.num_systems > self.config.num_systems or batch.num_atoms > self.config.num_atoms:
            raise ValueError("batch does not fit the transfer buffer")  # callers split first
        for s in self.schema:
            src = (batch.atom if s.kind == "atom" else batch.system).get(s.name)
            if src is None:
                raise ConfigError(f"field {s.name!r} missing on this rank: pipeline schemas differ")
            raw = src.detach().contiguous().reshape(-1).view(torch.uint8)
            start = self.offsets[s.name]
            buf[start : start + raw.numel()].copy_(raw, non_blocking=True)
        blob = encode_info(batch)
        if len(blob) > self.config.info_bytes:  # _route keeps messages within the room
            raise ValueError("the systems' info does not fit the transfer buffer")
        self.header(buf)[H_INFO_LEN] = len(blob)
        if blob:
            start = self.info_offset
            buf[start : start + len(blob)].copy_(
                torch.frombuffer(bytearray(blob), dtype=torch.uint8)
            )

    def unpack(self, buf: torch.Tensor, device: torch.device) -> Batch:
        """The systems of a data message as a Batch on ``device``."""
        h = self.header(buf).tolist()
        n_sys, n_atoms = int(h[H_SYSTEMS]), int(h[H_ATOMS])
        atom: dict[str, torch.Tensor] = {}
        system: dict[str, torch.Tensor] = {}
        for s in self.schema:
            n = n_atoms if s.kind == "atom" else n_sys
            start = self.offsets[s.name]
            raw = buf[start : start + n * s.item_bytes].clone()
            t = raw.view(s.dtype).reshape(n, *s.tail).to(device)
            (atom if s.kind == "atom" else system)[s.name] = t
        atom["system_idx"] = torch.repeat_interleave(
            torch.arange(n_sys, device=device), system["n_atoms"], output_size=n_atoms
        )
        n_info = int(h[H_INFO_LEN])
        info = {}
        if n_info:
            raw = buf[self.info_offset : self.info_offset + n_info].cpu().numpy().tobytes()
            info = pickle.loads(raw)  # written by a rank of this same job
        return Batch(atom, system, info)


_INFO_ENTRY = 16  # per-system framing in the pickled dict (upper bound)
INFO_OVERHEAD = 32  # the dict's own framing in a message (upper bound)


def info_size(info: dict[str, Any] | None) -> int:
    """Bytes one system's ``info`` takes in a message (0 when it has none)."""
    return len(pickle.dumps(info, protocol=pickle.HIGHEST_PROTOCOL)) + _INFO_ENTRY if info else 0


def check_info_fits(info: dict[str, Any] | None, system: int, config: BufferConfig) -> int:
    """Size of one system's info; :class:`ConfigError` naming the fix if no message
    could ever carry it."""
    n = info_size(info)
    if n and n + INFO_OVERHEAD > config.info_bytes:
        raise ConfigError(
            f"system {system} carries {n} bytes of info (ase.Atoms.info, pickled) but a "
            f"transfer message has room for {config.info_bytes - INFO_OVERHEAD} "
            f"(BufferConfig.info_bytes={config.info_bytes}); raise info_bytes to at least "
            f"{n + INFO_OVERHEAD} or drop large entries from atoms.info"
        )
    return n


def encode_info(batch: Batch) -> bytes:
    """The info of ``batch``'s systems, pickled (empty when none has any)."""
    ids = set(batch.system_id.tolist()) if batch.info else set()
    entries = {sid: v for sid, v in batch.info.items() if sid in ids and v}
    return pickle.dumps(entries, protocol=pickle.HIGHEST_PROTOCOL) if entries else b""


def split_to_fit(batch: Batch, config: BufferConfig, edges: list[int] | None = None) -> int:
    """How many leading systems of ``batch`` fit one buffer."""
    counts = batch.n_atoms.tolist()
    total, k = 0, 0
    edge_total = 0
    for k_, n in enumerate(counts):
        if k_ >= config.num_systems or total + n > config.num_atoms:
            break
        if config.num_edges and edges is not None:
            if edge_total + edges[k_] > config.num_edges:
                break
            edge_total += edges[k_]
        total += n
        k = k_ + 1
    return k


def describe(config: BufferConfig, layout: MessageLayout) -> dict[str, Any]:
    return {
        "num_systems": config.num_systems,
        "num_atoms": config.num_atoms,
        "num_edges": config.num_edges,
        "bytes": layout.nbytes,
    }
