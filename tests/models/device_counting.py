"""What code would cost on an accelerator, counted on CPU: the aten operations it
launches and the host reads among them (issue #26).

On CPU a host read is free and invisible, so it is counted by what it would be on a
GPU: an aten operation that waits for the device there (its output's size or a value
goes to the host: ``nonzero``, ``.item()``, a boolean-mask index, ...) or a Tensor
method that hands values to Python (``tolist``, ``numpy``, ``bool``, ...), except on
host buffers that were copied without waiting (flagged ``host_buffer``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from alchemi_lit.testing.accelerator import waits_on_device

READ_METHODS = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")


class Launches(TorchDispatchMode):
    """Records every aten operation run inside it, and those that would sync a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        self.ops.append(name)
        if waits_on_device(name, args, kwargs):
            self.syncs.append(name)
        return func(*args, **kwargs)


class HostReads:
    """Per-call record of a watched callable: its aten ops and the reads in it."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[str]]] = []  # (ops, reads) per call
        self._reads: list[str] | None = None

    @property
    def calls_with_reads(self) -> int:
        return sum(bool(reads) for _, reads in self.calls)

    def note(self, what: str) -> None:
        if self._reads is not None:
            self._reads.append(what)


@contextmanager
def watch_calls(
    monkeypatch: pytest.MonkeyPatch, owner: type, name: str, only: Any = None
) -> Iterator[HostReads]:
    """Record ops and host reads of every call of ``owner.name`` (on instance ``only``,
    or any), nested calls of other instances left out."""
    record = HostReads()
    original = getattr(owner, name)
    bases = {read: getattr(torch.Tensor, read) for read in READ_METHODS}

    def method(cls_name: str) -> None:
        base = bases[cls_name]

        def wrapper(self: torch.Tensor, *args: Any, **kw: Any) -> Any:
            if not getattr(self, "host_buffer", False):
                record.note(cls_name)
            return base(self, *args, **kw)

        monkeypatch.setattr(torch.Tensor, cls_name, wrapper)

    for read in READ_METHODS:
        method(read)

    def watched(self: Any, *args: Any, **kw: Any) -> Any:
        if (only is not None and self is not only) or record._reads is not None:
            return original(self, *args, **kw)
        record._reads = []
        try:
            with Launches() as mode:
                out = original(self, *args, **kw)
        finally:
            reads, record._reads = record._reads, None
        record.calls.append((len(mode.ops), reads + mode.syncs))
        return out

    monkeypatch.setattr(owner, name, watched)
    try:
        yield record
    finally:
        monkeypatch.setattr(owner, name, original)
        for read, base in bases.items():
            monkeypatch.setattr(torch.Tensor, read, base)


def count_ops(fn: Any, *args: Any, **kw: Any) -> tuple[Any, list[str], list[str]]:
    """``fn(*args, **kw)`` with its aten ops and would-be syncs."""
    with Launches() as mode:
        out = fn(*args, **kw)
    return out, mode.ops, mode.syncs
