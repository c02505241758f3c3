"""The checkpoint file: records, each with its own checksum, written atomically.

Why a container of our own around ``torch.save``: a flipped bit in a plain
``torch.save`` file loads without complaint and surfaces much later (an ``IndexError``
in a refill, or silently wrong results), and a truncated one fails with an
``OSError`` that names no file.  Here every top-level record of a checkpoint (the
batch, the sampler position, the sinks' commit marks ...) is serialised on its own and
stored with its length and SHA-256, so a damaged file is refused before anything is
unpickled, naming the file and the record.  Records still load with
``torch.load(weights_only=True)``: resuming never runs arbitrary code.

Layout::

    MAGIC                         b"ALCHEMI_LIT_CHECKPOINT\\n"
    header length                 8 bytes, little endian
    header                        JSON: {"format", "records": [{name, length, sha256}]}
    header SHA-256                32 bytes
    record payloads               in header order

Writing goes to a temporary file in the same folder, is fsynced, renamed over the
final name and the folder fsynced, so a crash leaves either the old file or the new
one, never half of one.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..core.errors import ConfigError

MAGIC = b"ALCHEMI_LIT_CHECKPOINT\n"
FORMAT = "alchemi_lit.checkpoint/2"


class CheckpointDamaged(ConfigError):
    """A checkpoint file failed its checks (truncated, a flipped bit, not ours)."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"checkpoint {str(path)!r} is damaged: {problem}")
        self.path, self.problem = path, problem


def _serialise(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def write_checkpoint(path: str | os.PathLike[str], records: Mapping[str, Any]) -> Path:
    """Write ``records`` (name -> tensors and plain values) to ``path`` atomically."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    payloads = [(str(name), _serialise(value)) for name, value in records.items()]
    header = json.dumps(
        {
            "format": FORMAT,
            "records": [
                {"name": n, "length": len(p), "sha256": hashlib.sha256(p).hexdigest()}
                for n, p in payloads
            ],
        }
    ).encode()
    tmp = final.with_name(final.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(MAGIC)
        fh.write(len(header).to_bytes(8, "little"))
        fh.write(header)
        fh.write(hashlib.sha256(header).digest())
        for _, p in payloads:
            fh.write(p)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    _fsync_folder(final.parent)
    return final


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Every record of the checkpoint at ``path``, each verified against its checksum
    before it is loaded; raises :class:`CheckpointDamaged` naming what is wrong."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise CheckpointDamaged(file, f"cannot be read ({exc.strerror or exc})") from exc
    if not data.startswith(MAGIC):
        raise CheckpointDamaged(
            file, "it does not start like an alchemi_lit checkpoint (another file, or an "
            "older format: resume it with the alchemi_lit version that wrote it)"
        )  # fmt: skip
    at = len(MAGIC)
    size = int.from_bytes(data[at : at + 8], "little")
    header_bytes = data[at + 8 : at + 8 + size]
    digest = data[at + 8 + size : at + 8 + size + 32]
    if len(header_bytes) != size or hashlib.sha256(header_bytes).digest() != digest:
        raise CheckpointDamaged(file, "its header is truncated or corrupt")
    header = json.loads(header_bytes)
    if header.get("format") != FORMAT:
        raise CheckpointDamaged(file, f"unknown format {header.get('format')!r}")
    at += 8 + size + 32
    records: dict[str, Any] = {}
    for entry in header["records"]:
        payload = data[at : at + entry["length"]]
        at += entry["length"]
        if len(payload) != entry["length"]:
            raise CheckpointDamaged(file, f"record {entry['name']!r} is truncated")
        if hashlib.sha256(payload).hexdigest() != entry["sha256"]:
            raise CheckpointDamaged(file, f"record {entry['name']!r} fails its checksum")
        records[entry["name"]] = torch.load(
            io.BytesIO(payload), map_location="cpu", weights_only=True
        )
    if at != len(data):
        raise CheckpointDamaged(file, f"{len(data) - at} unexpected bytes after the last record")
    return records


def is_intact(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` reads back whole (see :func:`read_checkpoint`)."""
    try:
        read_checkpoint(path)
    except CheckpointDamaged:
        return False
    return True
